"""Asynchronous training: verl's one-step-off and fully-async trainers' keys.

``actor_rollout_ref.hybrid_engine=False`` runs the one-step-off trainer
(``engine.trainer.one_step_off``, verl's ``verl/experimental/one_step_off_policy``): the rollout
lives in a worker process of its own, generates batch t+1 while the trainer updates on batch t,
and receives the weights after every update. Its resources are verl's top-level ``rollout``
section (``one_step_off_ppo_trainer.yaml``).

``hybrid_engine=False`` with any of ``async_training.staleness_threshold``,
``trigger_parameter_sync_step`` or ``require_batches`` set runs the fully-async trainer
(``engine.trainer.fully_async``, verl's ``verl/experimental/fully_async_policy``, which verl
selects by its own entry point; its ``fully_async_ppo_trainer.yaml`` sets all three): the
rollouter streams mini-batch chunks into a bounded queue, the trainer takes ``require_batches``
of them per step and syncs the weights every ``trigger_parameter_sync_step`` steps. A key left
null takes verl's default (``FULLY_ASYNC_DEFAULTS``). ``one_step_off_problems`` refuses a setting
either trainer cannot honour, ``fully_async_problems`` what only the fully-async one cannot,
each naming the key and the fix.
"""

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from engine.config.fields import (
    MAX_BATCH,
    MAX_STEPS,
    ConfigFieldError,
    Limit,
    Validation,
    _f,
    _inert,
    _refused,
    _Section,
    _section,
)

CPU_ONLY = (
    "actor_rollout_ref.hybrid_engine=False runs its rollout worker process on a CPU; set "
    "trainer.device=cpu, or keep actor_rollout_ref.hybrid_engine=True on a GPU"
)
ONE_ROLLOUT_WORKER = Limit(1, "the asynchronous trainers start one rollout worker process")
# verl's fully_async_ppo_trainer.yaml values of the keys that select the trainer.
FULLY_ASYNC_DEFAULTS = {
    "staleness_threshold": 0.1,
    "trigger_parameter_sync_step": 4,
    "require_batches": 1,
}
_SELECT = (
    "set actor_rollout_ref.hybrid_engine=False and async_training.staleness_threshold (or "
    "trigger_parameter_sync_step, require_batches) for the fully-async trainer, or leave the key out"
)
_NO_CHECKPOINT_ENGINE = (
    "the rollouter is a CPU process that receives the weights as torch.save bytes through a "
    "process queue; there is no device buffer to broadcast through"
)


@dataclass
class CheckpointEngineConfig(_Section):
    enable: bool | None = _f(
        None,
        "Broadcast parameters to the rollouter through a device buffer; only False (the engine "
        "sends them through a process queue).",
    )
    device_buffer_size_M: int | None = _inert(
        None, "Device buffer of the checkpoint engine (MB); there is no checkpoint engine."
    )
    overlap_broadcast_and_consume: bool | None = _inert(
        None, "Pipeline the broadcast and the weight load; there is no checkpoint engine."
    )


@dataclass
class AsyncTrainingConfig(_Section):
    staleness_threshold: float | None = _f(
        None,
        "Fully-async: the rollouter may generate (1 + this) x the samples the trainer takes "
        "between two syncs (verl: 0.1); 0 never runs ahead of a sync.",
        ge=0,
    )
    trigger_parameter_sync_step: int | None = _f(
        None, "Fully-async: trainer steps between parameter syncs (verl: 4).", gt=0, le=MAX_STEPS
    )
    require_batches: int | None = _f(
        None,
        "Fully-async: mini-batches (actor.ppo_mini_batch_size prompts each) the trainer takes "
        "from the queue per step (verl: 1).",
        gt=0,
        le=MAX_BATCH,
    )
    partial_rollout: bool | None = _f(
        None,
        "Fully-async: weights synced while a chunk generates are loaded between two decoding "
        "steps and the rest of the chunk is sampled under them (every token stamped with its "
        "policy version; vLLM aborts the chunk's requests and resumes each from its tokens so "
        "far); the hf and vllm rollouts, single-turn. Off: a chunk in flight finishes with the "
        "weights it started with.",
    )
    use_rollout_log_probs: bool | None = _f(
        None,
        "Fully-async: sets actor_rollout_ref.actor.use_rollout_log_probs (pi_old is the "
        "rollout's own log-probs), as verl's fully-async config interpolates it.",
    )
    compute_prox_log_prob: bool | None = _f(
        None,
        "Fully-async: the actor recomputes pi_old (the proximal policy) for every batch; needs "
        "use_rollout_log_probs off.",
    )
    use_trainer_do_validate: bool | None = _inert(
        None,
        "Validate on the trainer's side; the engine's fully-async trainer always does (the "
        "rollouter only generates training samples).",
    )
    checkpoint_engine: CheckpointEngineConfig = _section(
        CheckpointEngineConfig, "Parameter broadcast to the rollouter (fully-async)."
    )


@dataclass
class RolloutPoolConfig(_Section):
    nnodes: int = _f(
        1,
        "Machines of the rollout worker; only 1.",
        gt=0,
        le=ONE_ROLLOUT_WORKER,
    )
    n_gpus_per_node: int = _f(
        1,
        "Rollout worker processes per machine; only 1.",
        gt=0,
        le=ONE_ROLLOUT_WORKER,
    )
    n: int | None = _f(
        None,
        "Responses per prompt (fully-async); null: actor_rollout_ref.rollout.n.",
        gt=0,
        follows="actor_rollout_ref.rollout.n",
    )
    total_rollout_steps: int | None = _f(
        None,
        "Fully-async: prompts the rollouter generates in all; the run trains "
        "total_rollout_steps // data.train_batch_size steps (null: trainer's count).",
        gt=0,
        le=MAX_BATCH * MAX_STEPS,
    )
    total_epochs: int | None = _refused(
        None,
        "Epochs of the rollouter (fully-async).",
        "the rollouter generates the trainer's own batches, epoch after epoch; set "
        "trainer.total_epochs",
    )
    test_freq: int | None = _f(
        None,
        "Fully-async: validate every N parameter syncs (N x trigger_parameter_sync_step steps); "
        "null: trainer.test_freq.",
        gt=0,
        le=MAX_STEPS,
    )


class FullyAsyncSettings(NamedTuple):
    """The fully-async trainer's schedule, verl's defaults filled in.

    ``queue_chunks`` is verl's ``max_required_samples`` in mini-batch chunks:
    ``floor(require_batches x trigger_parameter_sync_step x (1 + staleness_threshold))``, the
    most chunks generated and not yet trained on at any time (the queue's bound);
    ``max_staleness`` the most updates a sample can then lag the actor by.
    """

    staleness_threshold: float
    trigger_parameter_sync_step: int
    require_batches: int
    queue_chunks: int
    max_staleness: int


def is_fully_async(cfg: Any) -> bool:
    """Return True when ``cfg`` selects the fully-async trainer (see the module doc)."""
    return not cfg.actor_rollout_ref.hybrid_engine and any(
        getattr(cfg.async_training, key) is not None for key in FULLY_ASYNC_DEFAULTS
    )


def fully_async_settings(cfg: Any) -> FullyAsyncSettings:
    """Return the fully-async schedule of ``cfg``, verl's defaults for the keys left null."""
    given = cfg.async_training

    def chosen(key: str) -> Any:
        value = getattr(given, key)
        return FULLY_ASYNC_DEFAULTS[key] if value is None else value

    threshold = float(chosen("staleness_threshold"))
    sync_steps, batches = int(chosen("trigger_parameter_sync_step")), int(chosen("require_batches"))
    # Round away float noise (0.29 x 100 = 28.999999999999996) before the floor.
    queue_chunks = math.floor(round(batches * sync_steps * (1 + threshold), 9))
    # A chunk submitted at a sync is at most queue_chunks chunks from the queue's head.
    max_staleness = math.ceil(queue_chunks / batches) - 1
    return FullyAsyncSettings(threshold, sync_steps, batches, queue_chunks, max_staleness)


def one_step_off_problems(v: Validation) -> list[ConfigFieldError]:
    """Return an error for each setting the one-step-off trainer cannot honour.

    Only with ``actor_rollout_ref.hybrid_engine=False``: its rollout worker is one CPU process
    with the ``hf`` or ``vllm`` backend (single- or multi-turn) beside the local or Ray controller
    (``trainer.device=auto`` is checked when the run starts, where the machine says whether it
    is a GPU), generating from a full copy of the policy; a critic, ReMax's greedy baselines and
    dynamic sampling are not wired into its one-batch-ahead loop.
    """
    cfg = v.cfg
    arr = cfg.actor_rollout_ref
    if arr.hybrid_engine:
        return []
    key = "actor_rollout_ref.hybrid_engine=False"
    checks = [
        (
            "trainer.device",
            cfg.trainer.device,
            cfg.trainer.device == "cuda",
            CPU_ONLY,
        ),
        (
            "actor_rollout_ref.rollout.name",
            arr.rollout.name,
            arr.rollout.name == "sglang",
            f"{key} runs its rollout worker process on a CPU, where SGLang does not run; set "
            "actor_rollout_ref.rollout.name=hf or vllm",
        ),
        (
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            arr.rollout.tensor_model_parallel_size,
            arr.rollout.tensor_model_parallel_size > 1,
            f"{key} runs one rollout worker process holding a whole engine; set "
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        ),
        (
            "actor_rollout_ref.model.lora_rank",
            arr.model.lora_rank,
            arr.model.lora_rank > 0,
            f"{key} syncs a full copy of the policy to its rollout worker; set lora_rank=0 or "
            "keep actor_rollout_ref.hybrid_engine=True",
        ),
        (
            "critic.enable",
            cfg.critic.enable,
            cfg.critic.enable
            or (cfg.critic.enable is None and cfg.algorithm.adv_estimator == "gae"),
            f"{key} trains without a critic (its values would be those of an older policy); use "
            "a critic-free estimator "
            "(algorithm.adv_estimator=grpo, rloo, ...) or keep actor_rollout_ref.hybrid_engine=True",
        ),
        (
            "algorithm.adv_estimator",
            cfg.algorithm.adv_estimator,
            cfg.algorithm.adv_estimator == "remax",
            f"{key} does not generate ReMax's greedy baselines (verl's one-step-off trainer "
            "neither); choose another estimator or keep actor_rollout_ref.hybrid_engine=True",
        ),
        (
            "algorithm.filter_groups.enable",
            cfg.algorithm.filter_groups.enable,
            cfg.algorithm.filter_groups.enable,
            f"{key} generates exactly one batch ahead and cannot draw more batches within a "
            "step; turn dynamic sampling off or keep actor_rollout_ref.hybrid_engine=True",
        ),
    ]
    return [ConfigFieldError(k, value, why) for k, value, bad, why in checks if bad]


# Keys only the fully-async trainer reads, by (section, key) of the config.
_FULLY_ASYNC_ONLY = (
    ("async_training", "partial_rollout"),
    ("async_training", "use_rollout_log_probs"),
    ("async_training", "compute_prox_log_prob"),
    ("async_training.checkpoint_engine", "enable"),
    ("rollout", "total_rollout_steps"),
    ("rollout", "test_freq"),
)


def _section_of(cfg: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        cfg = getattr(cfg, name)
    return cfg


def fully_async_problems(v: Validation) -> list[ConfigFieldError]:
    """Return an error for each fully-async setting the engine cannot honour.

    Without the fully-async trainer its own keys are refused with how to select it; with it, a
    step is ``require_batches`` mini-batches (``data.train_batch_size`` must say so, as the data
    loader draws the step's prompts), the queue must fit ``MAX_BATCH`` samples, a chunk in
    flight is interrupted (``partial_rollout``) only in the hf or vllm rollout, single-turn, the
    weights travel without a checkpoint
    engine, and pi_old comes from one place. The one-step-off checks
    (``one_step_off_problems``) apply to it too: it also has ``hybrid_engine=False``.
    """
    cfg, given = v.cfg, v.given
    if not is_fully_async(cfg):
        selecting = [
            ConfigFieldError(
                f"async_training.{key}",
                getattr(given.async_training, key),
                "it selects the fully-async trainer, which runs with "
                "actor_rollout_ref.hybrid_engine=False; set that or leave the key out",
            )
            for key in FULLY_ASYNC_DEFAULTS
            if getattr(given.async_training, key) is not None
        ]
        return selecting + [
            ConfigFieldError(
                f"{section}.{key}",
                getattr(_section_of(given, section), key),
                f"only the fully-async trainer reads it; {_SELECT}",
            )
            for section, key in _FULLY_ASYNC_ONLY
            if getattr(_section_of(given, section), key) is not None
        ]
    settings = fully_async_settings(cfg)
    async_cfg, arr = cfg.async_training, cfg.actor_rollout_ref
    actor = arr.actor
    step_prompts = settings.require_batches * actor.ppo_mini_batch_size
    queue_samples = (
        settings.queue_chunks * actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n
    )
    rollout_log_probs = (
        async_cfg.use_rollout_log_probs
        if async_cfg.use_rollout_log_probs is not None
        else actor.use_rollout_log_probs
    )
    total_rollout = cfg.rollout.total_rollout_steps
    total_steps = (
        total_rollout // cfg.data.train_batch_size
        if total_rollout is not None
        else cfg.trainer.total_training_steps
    )
    sync_step = settings.trigger_parameter_sync_step
    checks = [
        (
            "async_training.trigger_parameter_sync_step",
            sync_step,
            bool(total_steps) and 1 < total_steps <= sync_step,
            f"the run trains {total_steps} steps, so the rollouter would never receive an update "
            f"and every sample would come from the initial policy; set at most "
            f"{max(total_steps - 1, 1) if total_steps else 1}",
        ),
        (
            "data.train_batch_size",
            cfg.data.train_batch_size,
            cfg.data.train_batch_size != step_prompts,
            "the fully-async trainer's step is async_training.require_batches x "
            f"actor_rollout_ref.actor.ppo_mini_batch_size prompts; set "
            f"data.train_batch_size={step_prompts}",
        ),
        (
            "async_training.staleness_threshold",
            settings.staleness_threshold,
            queue_samples > MAX_BATCH,
            f"the rollout queue would hold {queue_samples} samples ({settings.queue_chunks} "
            f"mini-batches of {actor.ppo_mini_batch_size} prompts x rollout.n), more than "
            f"{int(MAX_BATCH)} ({MAX_BATCH.why}); lower staleness_threshold, "
            "trigger_parameter_sync_step or require_batches",
        ),
        (
            "async_training.partial_rollout",
            async_cfg.partial_rollout,
            bool(async_cfg.partial_rollout)
            and (arr.rollout.name not in ("hf", "vllm") or arr.rollout.multi_turn.enable),
            "a chunk is interrupted between decoding steps of the hf rollout's own sampler or "
            "the vllm engine's steps, single-turn only (SGLang's abort and resume, and "
            "multi-turn, are not wired); set actor_rollout_ref.rollout.name=hf or vllm without "
            "multi_turn, or partial_rollout=False",
        ),
        (
            "async_training.checkpoint_engine.enable",
            async_cfg.checkpoint_engine.enable,
            bool(async_cfg.checkpoint_engine.enable),
            f"{_NO_CHECKPOINT_ENGINE}; set enable=False or leave it out",
        ),
        (
            "async_training.use_rollout_log_probs",
            async_cfg.use_rollout_log_probs,
            async_cfg.use_rollout_log_probs is False and actor.use_rollout_log_probs,
            "it contradicts actor_rollout_ref.actor.use_rollout_log_probs=True; set one value "
            "in both or leave this key out",
        ),
        (
            "async_training.compute_prox_log_prob",
            async_cfg.compute_prox_log_prob,
            bool(async_cfg.compute_prox_log_prob)
            and (rollout_log_probs or cfg.algorithm.rollout_correction.bypass_mode),
            "the actor cannot recompute pi_old while pi_old is the rollout's log-probs; set "
            "use_rollout_log_probs=False (both keys) and "
            "algorithm.rollout_correction.bypass_mode=False, or compute_prox_log_prob=False",
        ),
        (
            "rollout.total_rollout_steps",
            total_rollout,
            total_rollout is not None and total_rollout < cfg.data.train_batch_size,
            f"the run would train no step: one step takes {cfg.data.train_batch_size} prompts; "
            f"set at least {cfg.data.train_batch_size}",
        ),
    ]
    return [ConfigFieldError(k, value, why) for k, value, bad, why in checks if bad]
