"""verl's batch reward manager (``reward_model.reward_manager=batch``): one call of the reward
function for the whole batch, as verl's ``BatchRewardManager``.

The function is ``custom_reward_function`` with verl's batch signature::

    compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...],
                  extra_infos=[...], **reward_kwargs) -> list[float | dict]

one entry per response, in order, called with ``reward_model.reward_kwargs`` (and, like every
custom function, ``custom_reward_function.reward_kwargs``). It suits scorers that are cheaper
per batch than per response: one request to a judge or a verifier service, a vectorised check.
Each score lands on its response's last valid token, and a dict's other keys become
``reward_extra_info`` as in the naive manager. The call runs in this process;
``reward.num_workers`` does not apply.

Failures: a result of the wrong shape (not a list, the wrong length, an entry that is neither
a number nor a dict with ``score``) raises, naming the function and what it returned. It is a
mistake in the function, or a per-response function given to this manager, that would repeat at
every step and train on zeros, so the run stops at its first step instead. An exception raised
inside the function fails every response of that batch (score 0, its ``reward_error``, counted
in ``reward/failed``), as the naive manager fails a response whose function raises, so one odd
batch (a verifier that is briefly down, a response it chokes on) cannot end a long run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from engine.config.reward_kwargs import reward_kwargs_problems
from engine.rewards.batch import RewardInput, RewardOutcome, check_result, describe_error
from engine.rewards.manager import RewardManager, refuse_components
from engine.rewards.names import BATCH_ARGUMENTS
from engine.rewards.sandbox import SandboxUnavailable

_SIGNATURE = (
    "compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) returning "
    "one score (a float or a dict with 'score') per response, in order"
)


class BatchRewardManager(RewardManager):
    """Score a rollout batch with one call of a batch reward function."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        compute_score: Callable[..., Any] | str | None = None,
        reward_fn_key: str = "data_source",
        num_workers: int = 1,
        components: Sequence[tuple[Any, ...]] | None = None,
        reward_model: Any = None,
        **reward_kwargs: Any,
    ) -> None:
        if not callable(compute_score):
            raise ValueError(
                "reward_model.reward_manager=batch calls custom_reward_function once per batch; "
                f"set custom_reward_function.path and .name to a function {_SIGNATURE}"
            )
        refuse_components(
            "batch",
            "with its batch function alone",
            {"components": components, "reward_model": reward_model},
        )
        if num_workers != 1:
            raise ValueError(
                "reward_model.reward_manager=batch makes one call in this process, so "
                f"reward.num_workers={num_workers} would have no effect; set it to 1"
            )
        problems = reward_kwargs_problems("batch", reward_kwargs)
        if problems:
            raise ValueError("; ".join(f"{key} {message}" for key, message in problems))
        super().__init__(tokenizer, compute_score=compute_score, reward_fn_key=reward_fn_key)
        self.reward_kwargs = reward_kwargs
        self.fn_name = _describe(compute_score)
        _check_signature(compute_score, self.fn_name, reward_kwargs)

    def _score(self, samples: list[RewardInput], data: Any) -> list[RewardOutcome]:
        assert self.compute_score is not None
        try:
            results = self.compute_score(
                data_sources=[s.data_source for s in samples],
                solution_strs=[s.solution_str for s in samples],
                ground_truths=[s.ground_truth for s in samples],
                extra_infos=[s.extra_info for s in samples],
                **self.reward_kwargs,
            )
        except SandboxUnavailable:  # concerns every batch: fails the run with its one sentence
            raise
        except Exception as exc:
            failed = RewardOutcome(None, describe_error(exc))
            return [failed] * len(samples)
        return [RewardOutcome(r, None) for r in self._check(results, len(samples))]

    def _check(self, results: Any, n: int) -> list[float | dict[str, Any]]:
        """Return one checked result per response; raise naming the function otherwise."""
        if hasattr(results, "tolist"):  # a numpy array or a tensor of scores
            results = results.tolist()
        if not isinstance(results, list | tuple):
            raise TypeError(
                f"the batch reward function {self.fn_name} returned {_shown(results)} "
                f"({type(results).__name__}) for {n} responses; it must be {_SIGNATURE}"
            )
        if len(results) != n:
            raise ValueError(
                f"the batch reward function {self.fn_name} returned {len(results)} scores for "
                f"{n} responses ({_shown(results)}); it must be {_SIGNATURE}"
            )
        checked = []
        for i, result in enumerate(results):
            if hasattr(result, "item") and not isinstance(result, dict):  # a numpy scalar
                result = result.item()
            try:
                checked.append(check_result(result))
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"the batch reward function {self.fn_name} returned {_shown(result)} for "
                    f"response {i}: {exc}"
                ) from exc
        return checked


def _describe(fn: Callable[..., Any]) -> str:
    """Return a function's name and, for a custom function, its file."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    path = getattr(fn, "path", None)
    return f"{name!s} ({path})" if path else str(name)


def _check_signature(fn: Callable[..., Any], name: str, reward_kwargs: dict[str, Any]) -> None:
    """Raise TypeError when ``fn`` cannot take the batch manager's keyword arguments."""
    # A custom function is a CustomRewardFn; its loaded function holds the signature.
    target = getattr(fn, "_fn", fn)
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin or an extension function: found out at the call
        return
    extra = dict(getattr(fn, "reward_kwargs", {}))
    both = sorted(reward_kwargs.keys() & extra.keys())
    if both:
        raise ValueError(
            f"{', '.join(both)} is set in both reward_model.reward_kwargs and "
            f"custom_reward_function.reward_kwargs of {name}; keep one"
        )
    arguments = {key: [] for key in BATCH_ARGUMENTS} | reward_kwargs | extra
    try:
        signature.bind(**arguments)
    except TypeError as exc:
        raise TypeError(
            f"the batch reward function {name} takes {signature}, which cannot be called with "
            f"{', '.join(arguments)} ({exc}); reward_model.reward_manager=batch needs {_SIGNATURE} "
            "(a function of one response, compute_score(data_source, solution_str, ...), is "
            "for reward_manager=naive)"
        ) from exc


def _shown(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
