"""verl's PRIME reward manager (``reward_model.reward_manager=prime``): the naive manager's scores,
each computed in a worker process under a per-sample timeout.

PRIME (arXiv 2502.01456) verifies math and code answers whose checkers can hang (a sympy
simplification, a program that never halts) or crash their process. verl's
``PrimeRewardManager`` therefore scores every response in a process pool and waits at most
300 s for each; a timed-out or crashed response scores 0 and the run goes on. Here the pool is
``reward.num_workers`` processes (one when it is 1: a timeout needs a process it can kill), the
timeout is ``+reward_model.reward_kwargs.timeout`` (seconds, default verl's 300; ``timeout`` is
what verl's rate-limited reward manager calls its timeout), and the rules of
:func:`engine.rewards.batch.score_samples_timed` apply: the clock starts when a worker takes the
response, and a dead worker fails only the responses it was scoring alongside.

A timed-out or crashed response is a failed sample as in the naive manager: score 0, its
``reward_error`` (``TimeoutError: ...`` or ``BrokenProcessPool: ...``) recorded and counted in
``reward/failed``. The reward function is ``custom_reward_function`` or the data-source
dispatch, as verl's manager takes ``compute_score``; weighted ``reward.components`` and the
reward model are the naive and dapo managers'.
"""

from __future__ import annotations

from typing import Any, Unpack

from engine.config.reward_kwargs import is_timeout
from engine.rewards.batch import RewardInput, RewardOutcome, check_picklable, score_samples_timed
from engine.rewards.manager import RewardManager, RewardSources, refuse_components

# verl's PrimeRewardManager waits this long for each response.
DEFAULT_TIMEOUT_S = 300.0


class PrimeRewardManager(RewardManager):
    """Score a rollout batch as :class:`RewardManager`, each response in a worker process that
    gets ``timeout`` seconds."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        **sources: Unpack[RewardSources],
    ) -> None:
        refuse_components(
            "prime",
            "one reward function (custom_reward_function or the data_source dispatch)",
            sources,
        )
        if not is_timeout(timeout):
            raise ValueError(
                f"reward_model.reward_kwargs.timeout must be a finite number of seconds > 0, got "
                f"{timeout!r}"
            )
        super().__init__(tokenizer, **sources)
        assert self.compute_score is not None
        check_picklable(self.compute_score)  # even one worker is a process
        self.timeout = float(timeout)

    def _score(self, samples: list[RewardInput], data: Any) -> list[RewardOutcome]:
        assert self.compute_score is not None
        return score_samples_timed(self.compute_score, samples, self._workers, self.timeout)
