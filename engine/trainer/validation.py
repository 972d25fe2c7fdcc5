"""Validation: score the held-out prompts with ``val_kwargs`` sampling, as verl's ``_validate``.

``validate`` generates ``val_kwargs.n`` responses a prompt through the policy's rollout, scores
them with the validation reward manager (the reward model left out, as verl's ``val_reward_fn``)
and returns verl's metrics with one ``SampleRecord`` per response. ``report_val_samples`` hands
the samples on: all of them to the caller's recorder, the few ``pick_val_generations`` picks to
``trainer.logger``'s sinks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.data import DataProto
from engine.data.dataset import PromptDataset
from engine.roles.protocols import ActorRolloutRef
from engine.trainer.metrics import compute_validation_metrics
from engine.trainer.reporting import Recorder, SampleRecord
from engine.trainer.samples import sample_records

if TYPE_CHECKING:
    from engine.config import PPOConfig


def validate(
    arr: ActorRolloutRef,
    dataset: PromptDataset,
    reward_fn: Any,
    *,
    collate: Callable[[list[dict[str, Any]]], DataProto],
    tokenizer: Any,
    config: PPOConfig,
    step: int,
) -> tuple[dict[str, float], list[SampleRecord]]:
    """Score ``dataset`` with ``val_kwargs`` sampling; return metrics and samples of ``step``.

    The prompts go in ``data.val_batch_size`` batches (all at once when unset). The metrics are
    verl's ``_validate``: ``reward`` and each numeric key the reward function reports (``acc``,
    ...; ``pred`` votes for ``maj@n``) per data source, see
    ``engine.trainer.metrics.compute_validation_metrics``; ``val-aux/num_turns/*`` for
    multi-turn rollouts. The manager's ``score`` (the reward again) and ``reward_error`` are left
    out.
    """
    val_kwargs = config.actor_rollout_ref.rollout.val_kwargs
    batch_size = config.data.val_batch_size or len(dataset)
    sources, uids, records, turns = [], [], [], []
    scores: list[float] = []
    infos: dict[str, list] = {}
    for start in range(0, len(dataset), batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        prompts = collate(items)
        prompts.non_tensor_batch["uid"] = np.array(
            [str(item["index"]) for item in items], dtype=object
        )
        batch = prompts.repeat(val_kwargs.n, interleave=True)
        gen = arr.generate_sequences(batch, validate=True)
        batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
        batch = batch.union(gen.to("cpu"))
        result = reward_fn(batch, return_dict=True)
        batch.batch["token_level_scores"] = result["reward_tensor"]
        info = result.get("reward_extra_info", {})
        # A key a batch lacks is None for its samples (skipped, never averaged as 0).
        for key in info.keys() - infos.keys() - {"score", "reward_error"}:
            infos[key] = [None] * len(scores)
        for key, values in infos.items():
            values += list(info.get(key, [None] * len(batch)))
        scores += result["reward_tensor"].sum(-1).tolist()
        sources += [str(s) for s in batch.non_tensor_batch["data_source"]]
        uids += list(batch.non_tensor_batch["uid"])
        turns += list(batch.non_tensor_batch.get("num_turns", []))
        records += sample_records(batch, info, tokenizer, step=step, split="val", n=val_kwargs.n)
    metrics = compute_validation_metrics(sources, uids, scores, extra_infos=infos)
    if turns:
        metrics["val-aux/num_turns/min"] = float(np.min(turns))
        metrics["val-aux/num_turns/max"] = float(np.max(turns))
        metrics["val-aux/num_turns/mean"] = float(np.mean(turns))
    return metrics, records


def pick_val_generations(records: list[SampleRecord], n: int) -> list[SampleRecord]:
    """Return ``n`` validation samples picked as verl's ``_maybe_log_val_generations`` does.

    Sorted by input text, shuffled with ``np.random.RandomState(42)`` and cut to the first
    ``n``: the same prompts every validation, so a tracker's table shows one set improve.
    """
    if n <= 0:
        return []
    picked = sorted(records, key=lambda r: r.prompt_text)
    np.random.RandomState(42).shuffle(picked)  # type: ignore[arg-type]
    return picked[:n]


def report_val_samples(
    step: int,
    records: list[SampleRecord],
    *,
    recorder: Recorder,
    sinks: list[Recorder],
    log_val_generations: int,
) -> None:
    """Hand a validation pass's samples on: every one to the caller's ``recorder`` (the studio
    keeps them all for its inspector), and the ``trainer.log_val_generations`` picked by
    :func:`pick_val_generations` to ``trainer.logger``'s ``sinks`` (console table, jsonl,
    trackers); 0 gives the sinks none."""
    recorder.on_samples(step, records)
    picked = pick_val_generations(records, log_val_generations)
    if picked:
        for sink in sinks:
            sink.on_samples(step, picked)
