"""Sample records: each rollout response as the studio stores it (``SampleRecord``).

One record per response, keyed by (step, split, prompt_index, sample_index), with its text,
reward and parts, advantage and per-token log-probs, read off a scored ``DataProto`` batch. The
trainer hands a training step's records and a validation pass's to its recorder.

A sample an asynchronous trainer generated (``engine.trainer.one_step_off`` and the fully-async
trainer) also keeps, among its reward parts, the version of the policy that generated it
(``rollout_policy_version``, the updates its weights had seen) and, when rollout correction
weighs the batch, its importance weight (``rollout_is_weight``: the mean of its tokens'
``rollout_is_weights``); the studio stores the parts as JSON and shows these apart. A sample
that a partial rollout finished under newer weights also keeps its last token's version
(``rollout_policy_version_last``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import torch

from engine.algorithms.torch_functional import mask_span_end
from engine.data import DataProto
from engine.rollout.sampling import TOKEN_VERSIONS
from engine.trainer.reporting import SampleRecord

POLICY_VERSION = "rollout_policy_version"  # the batch's non-tensor key, as verl names it
# A partial rollout's sample that newer weights finished: the version of its last token.
LAST_POLICY_VERSION = "rollout_policy_version_last"
IS_WEIGHT = "rollout_is_weight"
ROLLOUT_PARTS = (POLICY_VERSION, LAST_POLICY_VERSION, IS_WEIGHT)
Versions = TypeVar("Versions", int, np.ndarray)


def sample_staleness(step: int, version: Versions) -> Versions:
    """Return the updates between a sample's policy ``version`` (or an array of them) and the
    actor that trains on it at ``step`` (``step - 1`` updates made): the trainers'
    ``async/staleness_*``."""
    return step - 1 - version


def sample_records(
    batch: DataProto,
    reward_info: dict[str, list],
    tokenizer: Any,
    *,
    step: int,
    split: str,
    n: int,
) -> list[SampleRecord]:
    """Return one :class:`SampleRecord` per response in ``batch`` (``n`` responses a prompt, in
    rollout order), for ``step`` and ``split`` (``train`` or ``val``).

    ``reward_info`` is the reward manager's ``reward_extra_info``: each key but ``score`` and
    ``reward_error`` is a reward part. The log-probs are the old policy's, else the rollout's.
    """
    b, nt = batch.batch, batch.non_tensor_batch
    scores = b["token_level_scores"].sum(-1).tolist()
    has_adv = "advantages" in b
    # Up to the last response token: a multi-turn mask has gaps where the interaction spoke.
    lengths = mask_span_end(b["response_mask"]).tolist()
    records = []
    part_keys = [k for k in reward_info if k not in {"reward_error", "score"}]
    for i in range(len(batch)):
        length = int(lengths[i])
        ids = b["responses"][i, :length].tolist()
        reward_model = nt["reward_model"][i] or {}
        extra = nt["extra_info"][i] or {}
        parts = {k: _json_safe(reward_info[k][i]) for k in part_keys}
        if POLICY_VERSION in nt:
            parts[POLICY_VERSION] = int(nt[POLICY_VERSION][i])
        if TOKEN_VERSIONS in b:
            last = int(b[TOKEN_VERSIONS][i, :length].max()) if length else -1
            if last > parts.get(POLICY_VERSION, last):
                parts[LAST_POLICY_VERSION] = last
        if "rollout_is_weights" in b:
            mask = b["response_mask"][i, :length]  # (length,)
            weighed = (b["rollout_is_weights"][i, :length] * mask).sum()
            parts[IS_WEIGHT] = float(weighed / mask.sum()) if mask.sum() else None
        adv_tokens = b["advantages"][i, :length].tolist() if has_adv else None
        logp_key = "old_log_probs" if "old_log_probs" in b else "rollout_log_probs"
        records.append(
            SampleRecord(
                step=step,
                split=split,
                prompt_index=int(extra.get("index", nt["index"][i])),
                sample_index=i % n,
                group_id=str(nt["uid"][i]),
                data_source=str(nt["data_source"][i]),
                prompt_text=str(nt["prompt_text"][i]),
                response_text=tokenizer.decode(ids, skip_special_tokens=True),
                ground_truth=_maybe_str(reward_model.get("ground_truth")),
                reward=float(scores[i]),
                reward_parts=parts,
                reward_error=(reward_info.get("reward_error") or [None] * len(batch))[i],
                advantage=float(np.mean(adv_tokens)) if adv_tokens else None,
                response_length=length,
                truncated=bool(nt["truncated"][i]),
                turns=list(nt["turns"][i]) if "turns" in nt else None,
                tokens=tokenizer.convert_ids_to_tokens(ids),
                token_logprobs=b[logp_key][i, :length].tolist(),
                token_ref_logprobs=(
                    b["ref_log_prob"][i, :length].tolist() if "ref_log_prob" in b else None
                ),
                token_advantages=adv_tokens,
            )
        )
    return records


def _maybe_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _json_safe(value: Any) -> Any:
    """Return a reward part as JSON holds it: NumPy scalars and tensors as Python values."""
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value
