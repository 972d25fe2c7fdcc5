"""The reward manager: turn a rollout batch into token-level rewards, as verl's NaiveRewardManager.

For each sample the response is decoded up to its last valid token, scored, and the score is
placed on that token (the last nonzero position of ``response_mask``); every other position is 0. With
``return_dict=True`` the manager also returns ``reward_extra_info``, one list of ``bs`` entries
per key: ``score`` (the total), ``reward_error`` (``"ExceptionType: message"`` for a failed
sample, else None) and every key any sample's result dict had (None where a sample lacks it).

A reward function that raises fails only that sample (score 0.0) so one odd response cannot end a
training run; the failures are counted in ``meta_info["reward_failed"]`` and each distinct error
is logged once per manager. Configuration mistakes that concern every sample (a missing column,
an unpicklable function with ``num_workers > 1``) raise.

A multi-turn rollout's ``turn_scores`` (an interaction's score of each turn) reach the reward
function as ``extra_info["turn_scores"]``, as verl's reward loop hands them over.

``num_workers > 1`` scores rule-based rewards in a ``ProcessPoolExecutor`` (spawn context, so
functions must be importable: registered, ``custom_reward_function`` or module-level ones). The
pool is created on first use and reused; call ``close()`` or use the manager as a context
manager to shut it down. Reward-model components never go to that pool: the manager hands the
whole batch's (prompt, response) pairs to its ``reward_model`` scorer in one call, which scores
them in this process (``RewardModelScorer``, the single-process trainer's) or on the reward
model's Ray ranks (``engine.distributed.worker_group.RewardModelGroup``, with
``trainer.controller=ray``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypedDict

import torch

from engine.algorithms.torch_functional import mask_span_end
from engine.rewards.batch import (
    RewardInput,
    RewardOutcome,
    WorkerPool,
    check_picklable,
    describe_error,
    score_samples,
)
from engine.rewards.composite import REWARD_MODEL, CompositeReward, Scorer
from engine.rewards.default import default_compute_score
from engine.rewards.registry import get_reward_fn

logger = logging.getLogger(__name__)


# Per-sample columns of the rollout a reward function finds in its extra_info, as verl's reward
# loop merges the agent loop's extra fields into it: a multi-turn interaction's turn scores.
ROLLOUT_FIELDS = ("turn_scores",)


def with_rollout_fields(extra_info: Any, non_tensor: dict[str, Any], i: int) -> Any:
    """Return row ``i``'s ``extra_info`` with its :data:`ROLLOUT_FIELDS` added (a copy)."""
    fields = {key: non_tensor[key][i] for key in ROLLOUT_FIELDS if key in non_tensor}
    if not fields:
        return extra_info
    return {**(extra_info if isinstance(extra_info, dict) else {}), **fields}


class RewardSources(TypedDict, total=False):
    """What a reward manager scores with: the arguments every manager takes from the trainer."""

    compute_score: Callable[..., Any] | str | None
    reward_fn_key: str
    num_workers: int
    components: Sequence[tuple[Any, ...]] | None
    reward_model: Scorer | None


def refuse_components(manager: str, scores: str, sources: RewardSources) -> None:
    """Raise where ``manager``, which ``scores`` one function, is given components or a model."""
    if sources.get("components") or sources.get("reward_model") is not None:
        raise ValueError(
            f"reward_model.reward_manager={manager} scores {scores}; weighted reward.components "
            "and the reward model are scored by reward_manager=naive or dapo"
        )


class RewardManager:
    """Score a ``DataProto`` of rollouts into a ``(bs, response_len)`` reward tensor."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        compute_score: Callable[..., Any] | str | None = None,
        reward_fn_key: str = "data_source",
        num_workers: int = 1,
        components: Sequence[tuple[Any, ...]] | None = None,
        reward_model: Scorer | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.tokenizer = tokenizer
        self.reward_fn_key = reward_fn_key
        self.num_workers = num_workers
        self.composite: CompositeReward | None = None
        self.compute_score: Callable[..., Any] | None = None
        if components or reward_model is not None:
            if compute_score is not None:
                raise ValueError(
                    "give either compute_score or components/reward_model; to combine them pass "
                    "components=[(compute_score, w1, {}), ('reward_model', w2, {})]"
                )
            components = components or [(REWARD_MODEL, 1.0)]
            self.composite = CompositeReward(components, reward_model=reward_model)
        elif isinstance(compute_score, str):
            self.compute_score = get_reward_fn(compute_score)
        else:
            self.compute_score = compute_score or default_compute_score
        if num_workers > 1:
            check_picklable(self.composite.rules if self.composite else self.compute_score)
        self._workers = WorkerPool(num_workers)
        self._logged_errors: set[str] = set()

    def _pool(self) -> ProcessPoolExecutor | None:
        return None if self.num_workers == 1 else self._workers.executor

    def close(self) -> None:
        """Shut the worker pool down (a later call starts a new one)."""
        self._workers.close()

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _prompt_texts(self, data: Any) -> list[Any] | None:
        """Return the prompts a reward model reads: verl's ``raw_prompt`` chat messages, else
        ``prompt_text``, else ``batch["prompts"]`` decoded."""
        if "raw_prompt" in data.non_tensor_batch:  # rendered by the reward model's own template
            return [list(p) for p in data.non_tensor_batch["raw_prompt"]]
        if "prompt_text" in data.non_tensor_batch:
            return [str(p) for p in data.non_tensor_batch["prompt_text"]]
        if "prompts" not in data.batch:
            return None
        prompts = data.batch["prompts"]  # (bs, prompt_len), left-padded
        mask = data.batch.get("attention_mask")
        texts = []
        for i in range(len(prompts)):
            ids = prompts[i]
            if mask is not None:
                ids = ids[mask[i, : prompts.shape[1]].bool()]
            texts.append(self.tokenizer.decode(ids.tolist(), skip_special_tokens=True))
        return texts

    def _samples(self, data: Any, valid_lengths: torch.Tensor) -> list[RewardInput]:
        non_tensor = data.non_tensor_batch
        if self.reward_fn_key not in non_tensor:
            raise KeyError(
                f"reward_fn_key {self.reward_fn_key!r} is not a non-tensor column of the batch "
                f"(columns: {sorted(non_tensor)}); set reward.reward_fn_key to the column that "
                "names each sample's data source"
            )
        responses = data.batch["responses"]  # (bs, response_len)
        reward_infos = non_tensor.get("reward_model")
        extra_infos = non_tensor.get("extra_info")
        samples = []
        for i in range(len(data)):
            valid_ids = responses[i, : int(valid_lengths[i])].tolist()
            info = reward_infos[i] if reward_infos is not None else None
            samples.append(
                RewardInput(
                    data_source=non_tensor[self.reward_fn_key][i],
                    solution_str=self.tokenizer.decode(valid_ids, skip_special_tokens=True),
                    ground_truth=info.get("ground_truth") if isinstance(info, dict) else None,
                    extra_info=with_rollout_fields(
                        extra_infos[i] if extra_infos is not None else None, non_tensor, i
                    ),
                )
            )
        return samples

    def _score(self, samples: list[RewardInput], data: Any) -> list[RewardOutcome]:
        try:
            if self.composite is not None:
                prompts = self._prompt_texts(data) if self.composite.models else None
                return self.composite.score_batch(samples, prompts, self._pool())
            assert self.compute_score is not None
            return score_samples(self.compute_score, samples, self._pool())
        except BrokenProcessPool as exc:
            # A worker died (e.g. killed for memory); fail this batch and start a fresh pool.
            self._workers.discard()
            return [RewardOutcome(None, describe_error(exc)) for _ in samples]

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """Return the reward tensor ``(bs, response_len)``, or a dict with the extra info."""
        responses = data.batch["responses"]  # (bs, response_len)
        if "response_mask" in data.batch:
            response_mask = data.batch["response_mask"]  # (bs, response_len)
        elif "attention_mask" in data.batch:
            response_mask = data.batch["attention_mask"][:, -responses.shape[1] :]
        else:
            raise KeyError(
                "the batch has neither 'response_mask' nor 'attention_mask'; the reward manager "
                "needs one to find each response's last valid token"
            )
        # One past the last response token: a multi-turn mask has gaps (interaction turns).
        valid_lengths = mask_span_end(response_mask)  # (bs,)
        samples = self._samples(data, valid_lengths)
        outcomes = self._score(samples, data)

        bs = len(samples)
        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32)  # (bs, response_len)
        extra: dict[str, list[Any]] = {"score": [0.0] * bs, "reward_error": [None] * bs}
        failed = 0
        for i, outcome in enumerate(outcomes):
            if outcome.error is not None:
                failed += 1
                extra["reward_error"][i] = outcome.error
                # What a failed sample still says (a judge's reply), never a score.
                if isinstance(outcome.result, dict):
                    for key, value in outcome.result.items():
                        if key != "score":
                            extra.setdefault(key, [None] * bs)[i] = value
                self._log_once(outcome.error, samples[i].data_source)
                score = 0.0
            elif isinstance(outcome.result, dict):
                for key, value in outcome.result.items():
                    extra.setdefault(key, [None] * bs)[i] = value
                score = float(outcome.result["score"])
            else:
                score = float(outcome.result)  # type: ignore[arg-type]
            extra["score"][i] = score
            if valid_lengths[i] > 0:
                reward_tensor[i, int(valid_lengths[i]) - 1] = score
        if not return_dict:
            return reward_tensor
        return {
            "reward_tensor": reward_tensor,
            "reward_extra_info": extra,
            "meta_info": {"reward_failed": failed},
        }

    def _log_once(self, error: str, data_source: str) -> None:
        if error not in self._logged_errors:
            self._logged_errors.add(error)
            logger.warning(
                "reward failed for a sample (data_source=%r), which scores 0: %s",
                data_source,
                error,
            )
