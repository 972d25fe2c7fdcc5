"""Asynchronous training: verl's one-step-off and fully-async trainers' keys.

``actor_rollout_ref.hybrid_engine=False`` runs the one-step-off trainer
(``engine.trainer.one_step_off``, verl's ``verl/experimental/one_step_off_policy``): the rollout
lives in a worker process of its own, generates batch t+1 while the trainer updates on batch t,
and receives the weights after every update. Its resources are verl's top-level ``rollout``
section (``one_step_off_ppo_trainer.yaml``); ``async_training`` and the rest of that section are
verl's fully-async trainer (``fully_async_ppo_trainer.yaml``), which this engine does not run
yet: each of those keys is refused with what to run instead. ``one_step_off_problems`` refuses a
setting the one-step-off trainer cannot honour, naming the key and the fix.
"""

from dataclasses import dataclass

from engine.config.fields import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_STEPS,
    ConfigFieldError,
    Limit,
    Validation,
    _f,
    _refused,
    _Section,
    _section,
)

_FULLY_ASYNC = (
    "the fully-asynchronous trainer (a streaming rollouter and a bounded sample queue) is not "
    "implemented; leave the key out, or set actor_rollout_ref.hybrid_engine=False for the "
    "one-step-off trainer (one batch generated ahead, weights synced after every update)"
)
CPU_ONLY = (
    "actor_rollout_ref.hybrid_engine=False runs its rollout worker process on a CPU; set "
    "trainer.device=cpu, or keep actor_rollout_ref.hybrid_engine=True on a GPU"
)
ONE_ROLLOUT_WORKER = Limit(1, "the one-step-off trainer starts one rollout worker process")


@dataclass
class CheckpointEngineConfig(_Section):
    enable: bool | None = _refused(
        None, "Broadcast parameters to the rollouter through a device buffer.", _FULLY_ASYNC
    )
    device_buffer_size_M: int | None = _refused(
        None, "Device buffer of the checkpoint engine (MB).", _FULLY_ASYNC
    )
    overlap_broadcast_and_consume: bool | None = _refused(
        None, "Pipeline the broadcast and the weight load.", _FULLY_ASYNC
    )


@dataclass
class AsyncTrainingConfig(_Section):
    staleness_threshold: float | None = _refused(
        None, "Fraction of samples that may come from an older policy (fully-async).", _FULLY_ASYNC
    )
    trigger_parameter_sync_step: int | None = _refused(
        None, "Trainer steps between parameter syncs (fully-async).", _FULLY_ASYNC
    )
    require_batches: int | None = _refused(
        None, "Mini-batches the trainer takes from the queue at once (fully-async).", _FULLY_ASYNC
    )
    partial_rollout: bool | None = _refused(
        None, "Interrupt generation at a sync and resume it with new weights.", _FULLY_ASYNC
    )
    use_rollout_log_probs: bool | None = _refused(
        None,
        "The fully-async trainer's source of actor.use_rollout_log_probs.",
        "set actor_rollout_ref.actor.use_rollout_log_probs, which the engine honours in every "
        "trainer",
    )
    compute_prox_log_prob: bool | None = _refused(
        None, "Recompute the proximal policy's log-probs (fully-async).", _FULLY_ASYNC
    )
    use_trainer_do_validate: bool | None = _refused(
        None, "Validate on the trainer's side (fully-async).", _FULLY_ASYNC
    )
    checkpoint_engine: CheckpointEngineConfig = _section(
        CheckpointEngineConfig, "Parameter broadcast to the rollouter (fully-async)."
    )


@dataclass
class RolloutPoolConfig(_Section):
    nnodes: int = _f(
        1,
        "Machines of the one-step-off rollout worker; only 1.",
        gt=0,
        le=ONE_ROLLOUT_WORKER,
    )
    n_gpus_per_node: int = _f(
        1,
        "One-step-off rollout worker processes per machine; only 1.",
        gt=0,
        le=ONE_ROLLOUT_WORKER,
    )
    n: int | None = _refused(None, "Responses per prompt (fully-async).", _FULLY_ASYNC)
    total_rollout_steps: int | None = _refused(
        None, "Samples the rollouter generates (fully-async).", _FULLY_ASYNC, le=MAX_BATCH
    )
    total_epochs: int | None = _refused(
        None, "Epochs of the rollouter (fully-async).", _FULLY_ASYNC, le=MAX_EPOCHS
    )
    test_freq: int | None = _refused(
        None, "Validate every N parameter syncs (fully-async).", _FULLY_ASYNC, le=MAX_STEPS
    )


def one_step_off_problems(v: Validation) -> list[ConfigFieldError]:
    """Return an error for each setting the one-step-off trainer cannot honour.

    Only with ``actor_rollout_ref.hybrid_engine=False``: its rollout worker is one CPU process
    with the ``hf`` backend under the local controller (``trainer.device=auto`` is checked when
    the run starts, where the machine says whether it is a GPU), generating single-turn responses from a
    full copy of the policy; a critic, ReMax's greedy baselines and dynamic sampling are not
    wired into its one-batch-ahead loop.
    """
    cfg = v.cfg
    arr = cfg.actor_rollout_ref
    if arr.hybrid_engine:
        return []
    key = "actor_rollout_ref.hybrid_engine=False"
    checks = [
        (
            "trainer.controller",
            cfg.trainer.controller,
            cfg.trainer.controller != "local",
            f"{key} runs under the local controller; set trainer.controller=local",
        ),
        (
            "trainer.device",
            cfg.trainer.device,
            cfg.trainer.device == "cuda",
            CPU_ONLY,
        ),
        (
            "actor_rollout_ref.rollout.name",
            arr.rollout.name,
            arr.rollout.name != "hf",
            f"{key} generates with the hf backend in its worker process; set "
            "actor_rollout_ref.rollout.name=hf",
        ),
        (
            "actor_rollout_ref.rollout.multi_turn.enable",
            arr.rollout.multi_turn.enable,
            arr.rollout.multi_turn.enable,
            f"{key} generates single-turn responses; turn multi_turn off or keep "
            "actor_rollout_ref.hybrid_engine=True",
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
            f"{key} trains without a critic; use a critic-free estimator "
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
