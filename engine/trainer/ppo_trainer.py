"""The single controller: the PPO / GRPO loop of verl's ``RayPPOTrainer.fit``, in one place.

Each step: rollout -> reward -> old log-prob (skipped when on-policy) -> reference log-prob ->
values -> KL-in-reward -> advantages -> critic update -> actor update. The controller only moves
``DataProto`` batches between worker objects; the workers own the models. Its other jobs are
plain functions beside it: what a run is built from (``build``), scores to advantages
(``advantage``), validation (``validation``), checkpoints and resuming (``checkpoint``), sample
records (``samples``). ``RayPPOTrainer``
(``ray_trainer``) hands the same calls to Ray worker groups instead of local objects.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.algorithms.pf_ppo import compute_pf_ppo_reweight_data
from engine.algorithms.rollout_correction import IS_IN_UPDATE, rollout_correction_active
from engine.config import (
    PPOConfig,
    config_to_dict,
    resolve_config,
    validate_config,
)
from engine.config.fields import resolved
from engine.data import DataProto
from engine.data.dataset import collate_prompts
from engine.data.sampler import is_curriculum
from engine.device_info import get_device_info, summary_line
from engine.env import apply_cpu_process_env, seed_everything
from engine.perf import ProcessMeter, driver_system_metrics, reduce_rank_metrics
from engine.roles.actor import needs_sum_pi_squared
from engine.roles.model_loading import load_tokenizer, resolve_device, resolve_path
from engine.roles.protocols import ActorRolloutRef, Critic
from engine.roles.seqlen_balancing import balanced_order
from engine.trainer import checkpoint, validation
from engine.trainer.advantage import (
    add_rollout_correction,
    add_token_level_rewards,
    compute_advantage,
)
from engine.trainer.build import (
    build_datasets,
    build_kl_controller,
    build_local_rank,
    build_local_workers,
    build_reward_managers,
    build_train_loader,
    check_critic_checkpoint,
    load_data_tokenizer,
    total_training_steps,
    uses_critic,
    uses_reference,
)
from engine.trainer.dynamic_sampling import fill_batch
from engine.trainer.metrics import (
    compute_data_metrics,
    compute_rollout_probs_diff_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reward_service_metrics,
    timer,
)
from engine.trainer.reporting import CompositeRecorder, Recorder, RunOutcome, SampleRecord
from engine.trainer.samples import sample_records
from engine.trainer.trackers import default_recorders


class PPOTrainer:
    """Train a policy with PPO, GRPO or a relative, reporting through a :class:`Recorder`."""

    # The roles the loop drives: local workers, or the proxies of a worker group.
    arr: ActorRolloutRef
    critic: Critic | None

    def __init__(self, config: PPOConfig, recorder: Recorder | None = None) -> None:
        self.config = config
        resolve_config(config)
        for warning in validate_config(config, check_files=True):
            print(f"warning: {warning}")
        self.recorder = recorder or Recorder()
        # trainer.logger's sinks (console, jsonl) hear everything the caller's recorder does,
        # however the trainer was started: PPOTrainer(config).train() prints its progress too.
        self.log_sinks = default_recorders(config)
        trainer_cfg = config.trainer
        self.device = resolve_device(trainer_cfg.device)
        print(summary_line(get_device_info()))
        if self.device.type == "cpu":
            apply_cpu_process_env()
        seed_everything(trainer_cfg.seed)
        self.global_step = 0
        self.meter = ProcessMeter()
        self.local_dir = Path(resolve_path(trainer_cfg.default_local_dir) or "checkpoints")
        self._build()

    # -- construction ------------------------------------------------------------------------
    @property
    def report(self) -> Recorder:
        """Return where the loop reports: the caller's recorder and trainer.logger's sinks."""
        return (
            CompositeRecorder([*self.log_sinks, self.recorder]) if self.log_sinks else self.recorder
        )

    @property
    def n_devices(self) -> int:
        """Return the devices sharing a step's work (one here; RayPPOTrainer counts its ranks)."""
        return 1

    def _build(self) -> None:
        """Build the data, reward managers and workers (``engine.trainer.build``)."""
        config = self.config
        self.use_critic = uses_critic(config)
        self.need_ref = uses_reference(config)
        self.tokenizer = load_tokenizer(config.actor_rollout_ref.model)
        self.data_tokenizer = load_data_tokenizer(config, self.tokenizer)
        self.train_dataset, self.val_dataset = build_datasets(config, self.data_tokenizer)
        self.collate = partial(collate_prompts, pad_token_id=self.tokenizer.pad_token_id)
        self.train_loader = build_train_loader(config, self.train_dataset, self.collate)
        self.total_steps = total_training_steps(config, len(self.train_loader))
        self._build_reward()
        self.kl_ctrl = build_kl_controller(config)
        check_critic_checkpoint(config, self.device)
        self._build_workers()

    def _build_reward(self, scorer: Any = None) -> None:
        """Build the training and validation reward managers (``build_reward_managers``)."""
        self.reward_fn, self.val_reward_fn = build_reward_managers(
            self.config, self.tokenizer, device=self.device, scorer=scorer
        )

    def _build_workers(self) -> None:
        """Create the actor-rollout-reference worker and, when used, the critic worker: FSDP2
        ranks of a one-rank group on a CUDA device, the plain workers on a CPU."""
        if self.device.type == "cuda":
            self._build_local_rank()
            return
        self.arr, self.critic = build_local_workers(
            self.config, self.device, self.tokenizer, self.total_steps
        )

    def _build_local_rank(self) -> None:
        """Build the workers as FSDP2 ranks of a one-rank group in this process."""
        self.rank_group, self.arr, self.critic = build_local_rank(
            self.config, self.device, self.total_steps
        )

    # -- one training step -------------------------------------------------------------------
    def train_step(
        self, prompts: DataProto, more_prompts: Iterator[DataProto] | None = None
    ) -> tuple[dict[str, float], DataProto, dict]:
        """Run one PPO/GRPO iteration on a batch of prompts; return metrics, batch, reward info.

        With ``algorithm.filter_groups`` the step draws further batches from ``more_prompts``
        until enough groups are kept (``engine.trainer.dynamic_sampling``).
        """
        config = self.config
        timing: dict[str, float] = {}
        n = config.actor_rollout_ref.rollout.n
        step_start = time.perf_counter()
        metrics: dict[str, float] = {}
        filter_groups = config.algorithm.filter_groups
        if filter_groups.enable:
            batch, reward_info, stats = fill_batch(
                prompts,
                more_prompts if more_prompts is not None else iter(self.train_loader),
                partial(self.generate_and_score, timing=timing),
                metric=resolved(filter_groups.metric, "algorithm.filter_groups.metric"),
                train_batch_size=config.data.train_batch_size,
                n=n,
                max_num_gen_batches=filter_groups.max_num_gen_batches,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            metrics.update(stats.metrics())
        else:
            batch, reward_info = self.generate_and_score(prompts, timing=timing)
        # Balancing reorders the batch for the update; the reward info stays in rollout order.
        restore = None
        if config.trainer.balance_batch:
            restore = self.balance_batch(batch, metrics)
        # calculate_log_probs compares the rollout's log-probs with the actor's recomputation,
        # so the old log-prob pass runs even where an on-policy update could skip it (as verl).
        check_rollout = config.actor_rollout_ref.rollout.calculate_log_probs
        correction = config.algorithm.rollout_correction
        corrects = rollout_correction_active(correction)
        # verl's bypass mode, and actor.use_rollout_log_probs (its fully-async trainer's): the
        # rollout's log-probs are pi_old, never recomputed.
        weigh_in_update = self.rollout_is_in_update(batch)
        if correction.bypass_mode or config.actor_rollout_ref.actor.use_rollout_log_probs:
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        elif weigh_in_update:
            pass  # pi_old is the update's own forward; it weighs each micro-batch itself
        elif (
            check_rollout
            or corrects
            or needs_sum_pi_squared(config)  # the optimal token baselines' input comes from it
            or self.needs_old_log_prob(batch)
        ):
            with timer("old_log_prob", timing):
                old = self.arr.compute_log_prob(batch)
            mask = batch.batch["response_mask"]
            metrics["actor/entropy"] = float((old.batch["entropys"] * mask).sum() / mask.sum())
            old.pop(batch_keys=["entropys"])
            batch = batch.union(old)
            if check_rollout:
                metrics.update(
                    compute_rollout_probs_diff_metrics(
                        batch.batch["rollout_log_probs"], batch.batch["old_log_probs"], mask
                    )
                )
        if self.need_ref:
            with timer("ref", timing):
                ref = self.arr.compute_ref_log_prob(batch)
            # A Ray group runs the reference pass inside the rollout call: book it under ref.
            fused = ref.meta_info.pop("timing_s/ref_in_rollout", 0.0)
            timing["gen"] -= fused
            timing["ref"] += fused
            batch = batch.union(ref)
        if self.critic is not None:
            with timer("values", timing):
                batch = batch.union(self.critic.compute_values(batch))
        with timer("adv", timing):
            metrics.update(add_token_level_rewards(batch, config.algorithm, self.kl_ctrl))
            response_mask = batch.batch["response_mask"]
            if not correction.bypass_mode and (corrects or check_rollout) and not weigh_in_update:
                metrics.update(add_rollout_correction(batch, correction))
            advantages, returns = compute_advantage(batch, config.algorithm)
            batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        # PF-PPO updates on a resample of the batch; the samples are recorded as generated.
        update = batch
        if config.algorithm.use_pf_ppo:
            pf_ppo = config.algorithm.pf_ppo
            update = compute_pf_ppo_reweight_data(batch, pf_ppo.reweight_method, pf_ppo.weight_pow)
        if self.critic is not None:
            with timer("update_critic", timing):
                metrics.update(self.critic.update_critic(update))
        if weigh_in_update:
            update.meta_info[IS_IN_UPDATE] = True
        if self.global_step > config.trainer.critic_warmup or self.critic is None:
            with timer("update_actor", timing):
                metrics.update(self.arr.update_actor(update))
            if weigh_in_update and "rollout_is_weights" not in update.batch:
                raise RuntimeError(
                    "the actor's update did not return the IS weights it took from pi_old; "
                    "rollout_is_in_update needs an actor that hands them back in the batch"
                )
        batch.batch["response_mask"] = response_mask  # samples are recorded whole, rejected or not
        if restore is not None:  # samples are recorded in rollout order (i % n, groups)
            batch.reorder(restore)
        step_seconds = time.perf_counter() - step_start
        timing["step"] = step_seconds
        num_tokens = int(batch.batch["attention_mask"].sum())
        metrics.update(
            compute_data_metrics(
                update,
                use_critic=self.critic is not None,
                max_response_length=config.data.max_response_length,
            )
        )
        metrics.update(compute_timing_metrics(timing, num_tokens))
        metrics.update(compute_throughput_metrics(num_tokens, step_seconds, self.n_devices))
        # The driver counts as one more process in the ranks' reduction of the machine's memory.
        driver = driver_system_metrics(self.meter)
        metrics.update(
            reduce_rank_metrics([{k: metrics[k] for k in driver if k in metrics}, driver])
        )
        metrics["training/global_step"] = float(self.global_step)
        metrics.update(batch.meta_info.pop("reward_metrics", {}))
        failed = sum(1 for e in reward_info.get("reward_error", []) if e)
        if failed:
            metrics["reward/failed"] = float(failed)
        return metrics, batch, reward_info

    def needs_old_log_prob(self, batch: DataProto) -> bool:
        """Return True when the update needs pi_old recomputed: it is not on-policy (several
        mini-batches or epochs; the one-step-off trainer adds samples of an older policy)."""
        return self.arr.needs_old_log_prob(len(batch))

    def rollout_is_in_update(self, batch: DataProto) -> bool:
        """Return True when the update takes pi_old from its own forward and computes the
        rollout correction's IS weights itself, so no pi_old pass runs before it (the
        asynchronous trainers; here never: a synchronous batch's weights come from the pass,
        which verl runs whenever the correction is on)."""
        return False

    def generate_and_score(
        self, prompts: DataProto, *, timing: dict[str, float]
    ) -> tuple[DataProto, dict]:
        """Return the rollouts of ``prompts`` (``rollout.n`` each, a ``uid`` per prompt group)
        with their ``token_level_scores``, and the reward info."""
        batch = self.rollout_input(prompts)
        with timer("gen", timing):
            gen = self.arr.generate_sequences(batch)
        return self.score_rollout(prompts, batch, gen, timing=timing)

    def rollout_input(self, prompts: DataProto) -> DataProto:
        """Give each prompt a group ``uid`` and return the prompts repeated ``rollout.n`` times."""
        n = self.config.actor_rollout_ref.rollout.n
        prompts.non_tensor_batch["uid"] = np.array(
            [str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object
        )
        return prompts.repeat(n, interleave=True)

    def score_rollout(
        self, prompts: DataProto, batch: DataProto, gen: DataProto, *, timing: dict[str, float]
    ) -> tuple[DataProto, dict]:
        """Join the rollout ``gen`` to its input ``batch`` and score it (``generate_and_score``)."""
        return self.score_joined(
            prompts, self.join_rollout(batch, gen, timing=timing), timing=timing
        )

    def join_rollout(
        self, batch: DataProto, gen: DataProto, *, timing: dict[str, float]
    ) -> DataProto:
        """Return the rollout input ``batch`` with its prompt tensors replaced by ``gen``'s."""
        timing["update_weights"] = timing.get("update_weights", 0.0) + gen.meta_info.pop(
            "timing_s/update_weights", 0.0
        )
        batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
        return batch.union(gen.to("cpu") if self.device.type != "cpu" else gen)

    def score_joined(
        self, prompts: DataProto, batch: DataProto, *, timing: dict[str, float]
    ) -> tuple[DataProto, dict]:
        """Add ``token_level_scores`` (and ReMax's baselines) to a joined rollout; return it
        with the reward info."""
        n = self.config.actor_rollout_ref.rollout.n
        if self.config.algorithm.adv_estimator == "remax":
            with timer("gen_max", timing):
                batch.batch["reward_baselines"] = self.greedy_baselines(prompts, n)
        with timer("reward", timing):
            result = self.reward_fn(batch, return_dict=True)
        batch.batch["token_level_scores"] = result["reward_tensor"]
        batch.meta_info["reward_metrics"] = reward_service_metrics(result.get("meta_info", {}))
        return batch, result.get("reward_extra_info", {})

    @property
    def dp_size(self) -> int:
        """Return the policy's data-parallel ranks (the worker group's size over the actor's
        ``ulysses_sequence_parallel_size``, else one)."""
        group = getattr(self.arr, "group", None)
        sp = self.config.actor_rollout_ref.actor.ulysses_sequence_parallel_size
        return group.world_size // sp if group is not None else 1

    def balance_batch(self, batch: DataProto, metrics: dict[str, float]) -> torch.Tensor | None:
        """Reorder ``batch`` in place so each rank's share holds nearly equal work (verl's
        ``_balance_batch``); record ``global_seqlen/*``; return the order that undoes it (None
        when nothing moved).

        Ranks take contiguous equal shares of the update batch, so balancing is an order:
        Karmarkar-Karp over the rows' workloads (``seqlen_balancing.balanced_order``). On one
        rank the order is the identity and only the metrics are recorded (verl sorts that rank's
        rows for pipeline bubbles, which this engine does not have).
        """
        order, balance_metrics = balanced_order(batch.batch["attention_mask"], self.dp_size)
        metrics.update(balance_metrics)
        if torch.equal(order, torch.arange(len(order))):
            return None
        batch.reorder(order)
        return torch.argsort(order)

    def greedy_baselines(self, prompts: DataProto, n: int) -> torch.Tensor:
        """Return ReMax's baseline (bs * n, R): the reward of each prompt's greedy response."""
        greedy = self.arr.generate_sequences(prompts, validate=True)
        base = prompts.select(non_tensor_batch_keys=list(prompts.non_tensor_batch))
        base = base.union(greedy)
        scores = self.reward_fn(base, return_dict=True)["reward_tensor"].sum(-1)  # (bs,)
        return scores.repeat_interleave(n)[:, None]

    # -- validation (engine.trainer.validation) ---------------------------------------------
    def validate(self) -> tuple[dict[str, float], list[SampleRecord]]:
        """Score the validation set with ``val_kwargs`` sampling; return metrics and samples."""
        assert self.val_dataset is not None
        return validation.validate(
            self.arr,
            self.val_dataset,
            self.val_reward_fn,
            collate=self.collate,
            tokenizer=self.tokenizer,
            config=self.config,
            step=self.global_step,
        )

    def report_val_samples(self, step: int, records: list[SampleRecord]) -> None:
        """Hand a validation pass's samples to the recorder and trainer.logger's sinks."""
        validation.report_val_samples(
            step,
            records,
            recorder=self.recorder,
            sinks=self.log_sinks,
            log_val_generations=self.config.trainer.log_val_generations,
        )

    # -- checkpoints (the layout and the policy: engine.trainer.checkpoint) ---------------
    def save_checkpoint(self) -> Path:
        """Write ``global_step_<N>/`` (actor, critic, trainer state), mark it the latest, prune
        the older ones and tell the recorder."""
        target = checkpoint.save_checkpoint(
            self.local_dir,
            self.global_step,
            checkpoint.checkpointed_roles(self.config, self.arr, self.critic),
            checkpoint.trainer_state(self.global_step, self.train_loader, self.kl_ctrl)
            | self.loop_state(),
            self.config.trainer,
        )
        self.report.on_checkpoint(self.global_step, str(target))
        return target

    def load_checkpoint(self) -> None:
        """Restore workers and controller from the checkpoint ``trainer.resume_mode`` names."""
        trainer_cfg = self.config.trainer
        path = checkpoint.resume_dir(
            trainer_cfg.resume_mode, resolve_path(trainer_cfg.resume_from_path), self.local_dir
        )
        if path is None:
            return
        roles = checkpoint.checkpointed_roles(self.config, self.arr, self.critic)
        state = checkpoint.load_checkpoint(path, roles, self.train_loader, self.kl_ctrl)
        self.global_step = state["global_step"]
        print(f"resumed from {path} at step {self.global_step}")
        self.restore_loop_state(state)

    def loop_state(self) -> dict[str, Any]:
        """Return what a checkpoint adds to the controller's state for this trainer's loop (the
        asynchronous trainers: the batches in flight); the synchronous loop adds nothing."""
        return {}

    def restore_loop_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`loop_state` wrote, from a resumed checkpoint's state."""

    # -- the loop ----------------------------------------------------------------------------
    def fit(self) -> RunOutcome:
        """Train until ``total_steps`` or a stop request; return succeeded or cancelled. The
        reward managers' worker processes are shut down however it ends."""
        try:
            return self._fit()
        finally:
            self.close()

    def close(self) -> None:
        """Shut the reward managers' worker processes down (a later call starts new ones)."""
        for manager in {id(m): m for m in (self.reward_fn, self.val_reward_fn)}.values():
            manager.close()

    def _fit(self) -> RunOutcome:
        config = self.config
        trainer_cfg = config.trainer
        self.load_checkpoint()
        self.report.on_start(
            config=config_to_dict(config), total_steps=self.total_steps, start_step=self.global_step
        )
        # verl validates before the first step, and with val_only at the start (or resumed)
        # step, then stops.
        first = self.val_dataset is not None and trainer_cfg.val_before_train
        if trainer_cfg.val_only or (first and self.global_step == 0):
            val_metrics, records = self.validate()
            self.report_val_samples(self.global_step, records)
            self.report.on_step(self.global_step, val_metrics)
            if trainer_cfg.val_only:
                self.report.on_finish(status=RunOutcome.SUCCEEDED)
                return RunOutcome.SUCCEEDED
        status = RunOutcome.SUCCEEDED
        # One stream of batches over the epochs: filter_groups draws its extra batches from it.
        batches = self.prompt_batches()
        while self.global_step < self.total_steps and status == RunOutcome.SUCCEEDED:
            for prompts in batches:
                self.global_step += 1
                metrics, batch, reward_info = self.train_step(prompts, batches)
                last = self.global_step >= self.total_steps
                self.update_data(batch, last=last)
                self.report.on_samples(
                    self.global_step,
                    sample_records(
                        batch,
                        reward_info,
                        self.tokenizer,
                        step=self.global_step,
                        split="train",
                        n=config.actor_rollout_ref.rollout.n,
                    ),
                )
                test_freq = trainer_cfg.test_freq
                if (
                    self.val_dataset is not None
                    and test_freq > 0
                    and (self.global_step % test_freq == 0 or last)
                ):
                    with timer("timing_s/testing", metrics):
                        val_metrics, records = self.validate()
                    metrics.update(val_metrics)
                    self.report_val_samples(self.global_step, records)
                stop = self.report.should_stop()
                save_freq = trainer_cfg.save_freq
                if stop or (save_freq > 0 and (self.global_step % save_freq == 0 or last)):
                    with timer("timing_s/save_checkpoint", metrics):
                        self.save_checkpoint()
                self.report.on_step(self.global_step, metrics)
                if stop:
                    status = RunOutcome.CANCELLED
                    break
                if last:
                    break
        self.report.on_finish(status=status)
        return status

    def train(self) -> RunOutcome:
        """Train: :meth:`fit` under the name Python tutorials call (subclasses override fit)."""
        return self.fit()

    def update_data(self, batch: DataProto, *, last: bool) -> None:
        """Hand a finished step's batch to the data, as verl does: ``update`` of a curriculum
        sampler (``data.sampler``) after every step, before the step's checkpoint, so a resume
        keeps it; ``on_batch_end`` of a custom dataset (``data.custom_cls``; verl's experimental
        hook) after every step but the last."""
        sampler = self.train_loader.sampler
        if is_curriculum(sampler):
            sampler.update(batch=batch)
        dataset: Any = getattr(self.train_dataset, "source", self.train_dataset)
        if not last and callable(getattr(dataset, "on_batch_end", None)):
            dataset.on_batch_end(batch=batch)

    def prompt_batches(self) -> Iterator[DataProto]:
        """Yield the training loader's batches epoch after epoch, without end."""
        while True:
            yield from self.train_loader
