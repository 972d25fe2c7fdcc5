"""The single controller: the PPO / GRPO loop of verl's ``RayPPOTrainer.fit``, in one place.

Each step: rollout -> reward -> old log-prob (skipped when on-policy) -> reference log-prob ->
values -> KL-in-reward -> advantages -> critic update -> actor update. The controller only moves
``DataProto`` batches between worker objects; the workers own the models. The distributed
controller hands the same calls to Ray worker groups instead of local objects.
"""

from __future__ import annotations

import inspect
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.algorithms import (
    apply_kl_penalty,
    compute_pf_ppo_reweight_data,
    get_adv_estimator_fn,
    get_kl_controller,
    mask_span_end,
)
from engine.algorithms.rollout_correction import (
    compute_rollout_correction_and_rejection_mask,
    correction_settings,
    rollout_correction_active,
)
from engine.data import DataProto
from engine.data.dataset import RLHFDataset, collate_prompts
from engine.data.loader import PromptDataLoader
from engine.env import seed_everything
from engine.trainer import checkpoint
from engine.trainer.dynamic_sampling import fill_batch
from engine.trainer.metrics import (
    compute_data_metrics,
    compute_rollout_probs_diff_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    compute_validation_metrics,
)
from engine.trainer.recorder import (
    CompositeRecorder,
    Recorder,
    RunStatus,
    SampleRecord,
    default_recorders,
)
from engine.workers.actor import needs_sum_pi_squared
from engine.workers.actor_rollout_ref import ActorRolloutRefWorker
from engine.workers.critic import CriticWorker
from engine.workers.models import resolve_device, resolve_path
from engine.workers.protocols import ActorRolloutRef, Critic
from engine.workers.seqlen_balancing import balanced_order


@contextmanager
def timer(name: str, timing: dict[str, float]):
    """Add the block's wall time to ``timing[name]``."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def uses_critic(config: Any) -> bool:
    """Return True when a value model trains: ``critic.enable``, or unset with GAE."""
    enable = config.critic.enable
    return config.algorithm.adv_estimator == "gae" if enable is None else bool(enable)


def compute_advantage(batch: DataProto, algorithm: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(advantages, returns)`` (bs, R) from the estimator named in the config.

    Each estimator takes the subset of the batch's tensors and hyper-parameters its signature
    names (verl's estimators differ: GAE wants values, GRPO the group index, ReMax baselines,
    the optimal token baselines the policy's token probabilities).
    """
    fn = get_adv_estimator_fn(algorithm.adv_estimator)
    b = batch.batch
    available = {
        "token_level_rewards": b["token_level_rewards"],
        "response_mask": b["response_mask"],
        "values": b.get("values"),
        "reward_baselines": b.get("reward_baselines"),
        "index": batch.non_tensor_batch["uid"],
        "gamma": algorithm.gamma,
        "lam": algorithm.lam,
        "norm_adv_by_std_in_grpo": algorithm.norm_adv_by_std_in_grpo,
        # On-policy steps skip the old log-prob pass: the rollout's are the policy's (verl's
        # bypass mode).
        "old_log_probs": b.get("old_log_probs", b.get("rollout_log_probs")),
        "sum_pi_squared": b.get("sum_pi_squared"),
        "rollout_is_weights": b.get("rollout_is_weights"),
    }
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in available.items() if k in params and v is not None}
    missing = [
        name
        for name, param in params.items()
        if param.default is inspect.Parameter.empty and name not in kwargs
    ]
    if missing:
        raise ValueError(
            f"algorithm.adv_estimator={algorithm.adv_estimator!r} needs {', '.join(missing)} "
            "in the batch and this step did not compute it; choose another estimator."
        )
    return fn(**kwargs)


class PPOTrainer:
    """Train a policy with PPO, GRPO or a relative, reporting through a :class:`Recorder`."""

    # The roles the loop drives: local workers, or the proxies of a worker group.
    arr: ActorRolloutRef
    critic: Critic | None

    def __init__(self, config: Any, recorder: Recorder | None = None) -> None:
        from engine.config import resolve_config, validate_config

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
        from engine.device_info import get_device_info, summary_line

        print(summary_line(get_device_info()))
        if self.device.type == "cpu":
            from engine.env import apply_cpu_process_env

            apply_cpu_process_env()
        seed_everything(trainer_cfg.seed)
        self.global_step = 0
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
        config = self.config
        self.use_critic = uses_critic(config)
        self.need_ref = (
            config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward
        )
        # The tokenizer is needed to read the data; the datasets are read before training starts
        # so a malformed line fails fast.
        from engine.workers.models import load_tokenizer

        self.tokenizer = load_tokenizer(config.actor_rollout_ref.model)
        self.data_tokenizer = load_data_tokenizer(config, self.tokenizer)
        self.train_dataset = RLHFDataset(
            resolve_files(config.data.train_files),
            self.data_tokenizer,
            config.data,
            max_samples=config.data.train_max_samples,
        )
        self.val_dataset = (
            RLHFDataset(
                resolve_files(config.data.val_files),
                self.data_tokenizer,
                config.data,
                max_samples=config.data.val_max_samples,
            )
            if config.data.val_files
            else None
        )
        if config.trainer.val_only and self.val_dataset is None:
            raise ValueError(
                "trainer.val_only=True validates and stops, but data.val_files is not set; "
                "set data.val_files or drop trainer.val_only"
            )
        collate = partial(collate_prompts, pad_token_id=self.tokenizer.pad_token_id)
        self.collate = collate
        self.train_loader = PromptDataLoader(
            self.train_dataset,
            config.data.gen_batch_size or config.data.train_batch_size,
            shuffle=config.data.shuffle,
            seed=config.data.seed,
            drop_last=True,
            collate_fn=collate,
        )
        steps = config.trainer.total_training_steps
        self.total_steps = (
            int(steps) if steps else config.trainer.total_epochs * len(self.train_loader)
        )
        self._build_reward()
        self.kl_ctrl = (
            get_kl_controller(config.algorithm.kl_ctrl)
            if config.algorithm.use_kl_in_reward
            else None
        )
        sharded = config.trainer.controller == "ray" or self.device.type == "cuda"
        if self.use_critic and sharded and "hf_model" in config.critic.checkpoint.save_contents:
            raise ValueError(
                "critic.checkpoint.save_contents=[..., hf_model]: a sharded critic (trainer."
                "controller=ray or a CUDA device) cannot write a Hugging Face folder yet; drop "
                "hf_model from critic.checkpoint.save_contents"
            )
        self._build_workers()

    def _build_reward(self, scorer: Any = None) -> None:
        """Build the training and validation reward managers.

        ``scorer`` is a reward model that lives elsewhere (the Ray path's worker-group proxy);
        without one, ``reward_model.enable=True`` loads the model here, on this process's device.
        """
        config = self.config
        self.reward_fn = build_reward_manager(
            config, self.tokenizer, device=self.device, scorer=scorer
        )
        self.val_reward_fn = (
            build_reward_manager(config, self.tokenizer, validation=True)
            if config.reward_model.enable
            else self.reward_fn
        )

    def _build_workers(self) -> None:
        """Create the actor-rollout-reference worker and, when used, the critic worker.

        On a CUDA device they are FSDP2 ranks of a one-rank NCCL group in this process, as in a
        one-GPU verl run (``engine.distributed.local_group``): bf16 compute with fp32 master
        weights, the rollout sampling from a bf16 copy. On a CPU they are the plain workers.
        """
        config = self.config
        if self.device.type == "cuda":
            self._build_local_rank()
            return
        worker = ActorRolloutRefWorker(
            config, device=self.device, total_steps=self.total_steps, need_ref=self.need_ref
        )
        worker.tokenizer = self.tokenizer
        self.arr = worker
        self.critic = (
            CriticWorker(config, device=self.device, total_steps=self.total_steps)
            if self.use_critic
            else None
        )

    def _build_local_rank(self) -> None:
        from engine.distributed.local_group import LocalWorkerGroup
        from engine.distributed.worker_group import ActorRolloutRefGroup, CriticGroup

        self.rank_group = LocalWorkerGroup(self.device.type)
        self.arr = ActorRolloutRefGroup(
            self.rank_group, self.config, total_steps=self.total_steps, need_ref=self.need_ref
        )
        self.critic = (
            CriticGroup(self.rank_group, self.config, total_steps=self.total_steps)
            if self.use_critic
            else None
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
                metric=filter_groups.metric,
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
        if correction.bypass_mode:  # verl's bypass mode: the rollout's log-probs are pi_old
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        elif (
            check_rollout
            or corrects
            or needs_sum_pi_squared(config)  # the optimal token baselines' input comes from it
            or self.arr.needs_old_log_prob(len(batch))
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
            if config.algorithm.use_kl_in_reward:
                old_lp = batch.batch.get("old_log_probs", batch.batch["rollout_log_probs"])
                rewards, kl_metrics = apply_kl_penalty(
                    batch.batch["token_level_scores"],
                    batch.batch["response_mask"],
                    old_lp,
                    batch.batch["ref_log_prob"],
                    self.kl_ctrl,
                    kl_penalty=config.algorithm.kl_penalty,
                )
                batch.batch["token_level_rewards"] = rewards
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            # Decoupled rollout correction (verl's compute_rollout_correction_and_add_to_batch):
            # IS weights for the loss, rejection in the mask the update and advantages use.
            response_mask = batch.batch["response_mask"]
            if not correction.bypass_mode and (corrects or check_rollout):
                weights, corrected_mask, corr_metrics = (
                    compute_rollout_correction_and_rejection_mask(
                        batch.batch["old_log_probs"],
                        batch.batch["rollout_log_probs"],
                        response_mask,
                        **correction_settings(correction),
                    )
                )
                batch.batch["response_mask"] = corrected_mask
                if weights is not None:
                    batch.batch["rollout_is_weights"] = weights
                metrics.update(corr_metrics)
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
        if self.global_step > config.trainer.critic_warmup or self.critic is None:
            with timer("update_actor", timing):
                metrics.update(self.arr.update_actor(update))
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
        metrics["training/global_step"] = float(self.global_step)
        failed = sum(1 for e in reward_info.get("reward_error", []) if e)
        if failed:
            metrics["reward/failed"] = float(failed)
        return metrics, batch, reward_info

    def generate_and_score(
        self, prompts: DataProto, *, timing: dict[str, float]
    ) -> tuple[DataProto, dict]:
        """Return the rollouts of ``prompts`` (``rollout.n`` each, a ``uid`` per prompt group)
        with their ``token_level_scores``, and the reward info."""
        n = self.config.actor_rollout_ref.rollout.n
        prompts.non_tensor_batch["uid"] = np.array(
            [str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object
        )
        batch = prompts.repeat(n, interleave=True)
        with timer("gen", timing):
            gen = self.arr.generate_sequences(batch)
        timing["update_weights"] = timing.get("update_weights", 0.0) + gen.meta_info.pop(
            "timing_s/update_weights", 0.0
        )
        batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
        batch = batch.union(gen.to("cpu") if self.device.type != "cpu" else gen)
        if self.config.algorithm.adv_estimator == "remax":
            with timer("gen_max", timing):
                batch.batch["reward_baselines"] = self.greedy_baselines(prompts, n)
        with timer("reward", timing):
            result = self.reward_fn(batch, return_dict=True)
        batch.batch["token_level_scores"] = result["reward_tensor"]
        return batch, result.get("reward_extra_info", {})

    @property
    def dp_size(self) -> int:
        """Return the policy's data-parallel ranks (the worker group's size, else one)."""
        group = getattr(self.arr, "group", None)
        return group.world_size if group is not None else 1

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

    # -- validation --------------------------------------------------------------------------
    def validate(self) -> tuple[dict[str, float], list[SampleRecord]]:
        """Score the validation set with ``val_kwargs`` sampling; return metrics and samples.

        The metrics are verl's ``_validate``: ``reward`` and each numeric key the reward
        function reports (``acc``, ...; ``pred`` votes for ``maj@n``) per data source, see
        ``engine.trainer.metrics.compute_validation_metrics``; ``val-aux/num_turns/*`` for
        multi-turn rollouts. The manager's ``score`` (the reward again) and ``reward_error``
        are left out.
        """
        assert self.val_dataset is not None
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        batch_size = self.config.data.val_batch_size or len(self.val_dataset)
        sources, uids, records, turns = [], [], [], []
        scores: list[float] = []
        infos: dict[str, list] = {}
        for start in range(0, len(self.val_dataset), batch_size):
            items = [
                self.val_dataset[i]
                for i in range(start, min(start + batch_size, len(self.val_dataset)))
            ]
            prompts = self.collate(items)
            prompts.non_tensor_batch["uid"] = np.array(
                [str(item["index"]) for item in items], dtype=object
            )
            batch = prompts.repeat(val_kwargs.n, interleave=True)
            gen = self.arr.generate_sequences(batch, validate=True)
            batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
            batch = batch.union(gen.to("cpu"))
            result = self.val_reward_fn(batch, return_dict=True)
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
            records += self.sample_records(batch, info, split="val", n=val_kwargs.n)
        metrics = compute_validation_metrics(sources, uids, scores, extra_infos=infos)
        if turns:
            metrics["val-aux/num_turns/min"] = float(np.min(turns))
            metrics["val-aux/num_turns/max"] = float(np.max(turns))
            metrics["val-aux/num_turns/mean"] = float(np.mean(turns))
        return metrics, records

    def report_val_samples(self, step: int, records: list[SampleRecord]) -> None:
        """Hand a validation pass's samples on: every one to the caller's recorder (the studio
        keeps them all for its inspector), and the ``trainer.log_val_generations`` picked by
        :func:`pick_val_generations` to ``trainer.logger``'s sinks (console table, jsonl,
        trackers); 0 gives the sinks none."""
        self.recorder.on_samples(step, records)
        picked = pick_val_generations(records, self.config.trainer.log_val_generations)
        if picked:
            for sink in self.log_sinks:
                sink.on_samples(step, picked)

    # -- samples for the recorder ------------------------------------------------------------
    def sample_records(
        self, batch: DataProto, reward_info: dict[str, list], *, split: str, n: int
    ) -> list[SampleRecord]:
        """Return one :class:`SampleRecord` per response in ``batch``."""
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
            adv_tokens = b["advantages"][i, :length].tolist() if has_adv else None
            logp_key = "old_log_probs" if "old_log_probs" in b else "rollout_log_probs"
            records.append(
                SampleRecord(
                    step=self.global_step,
                    split=split,
                    prompt_index=int(extra.get("index", nt["index"][i])),
                    sample_index=i % n,
                    group_id=str(nt["uid"][i]),
                    data_source=str(nt["data_source"][i]),
                    prompt_text=str(nt["prompt_text"][i]),
                    response_text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    ground_truth=_maybe_str(reward_model.get("ground_truth")),
                    reward=float(scores[i]),
                    reward_parts=parts,
                    reward_error=(reward_info.get("reward_error") or [None] * len(batch))[i],
                    advantage=float(np.mean(adv_tokens)) if adv_tokens else None,
                    response_length=length,
                    truncated=bool(nt["truncated"][i]),
                    turns=list(nt["turns"][i]) if "turns" in nt else None,
                    tokens=self.tokenizer.convert_ids_to_tokens(ids),
                    token_logprobs=b[logp_key][i, :length].tolist(),
                    token_ref_logprobs=(
                        b["ref_log_prob"][i, :length].tolist() if "ref_log_prob" in b else None
                    ),
                    token_advantages=adv_tokens,
                )
            )
        return records

    # -- checkpoints (the folder layout: engine.trainer.checkpoint) --------------------------
    def checkpointed_roles(self) -> list[tuple[str, Any, Any]]:
        """Return ``(folder, worker, checkpoint settings)`` for each role a checkpoint holds."""
        roles: list[tuple[str, Any, Any]] = [
            ("actor", self.arr, self.config.actor_rollout_ref.actor.checkpoint)
        ]
        if self.critic is not None:
            roles.append(("critic", self.critic, self.config.critic.checkpoint))
        return roles

    def save_checkpoint(self) -> Path:
        """Write ``global_step_<N>/`` (actor, critic, trainer state) and mark it the latest.

        Each worker's file holds what its ``checkpoint.save_contents`` lists; ``hf_model`` adds
        a Hugging Face folder ``<role>/huggingface/``. The trainer state is always written.
        """
        parts: dict[str, Any] = {}
        for role, worker, settings in self.checkpointed_roles():
            contents = list(settings.save_contents)
            state = checkpoint.select_contents(worker.state_dict(), contents)
            parts[f"{role}/state.pt"] = partial(checkpoint.save_state, state)
            if "hf_model" in contents:
                parts[f"{role}/{checkpoint.HF_FOLDER}"] = worker.export_hf
        parts[checkpoint.STATE_FILE] = partial(checkpoint.save_state, self.trainer_state())
        target = checkpoint.write_checkpoint(self.local_dir, self.global_step, parts)
        trainer_cfg = self.config.trainer
        checkpoint.prune(
            self.local_dir, trainer_cfg.max_actor_ckpt_to_keep, trainer_cfg.max_critic_ckpt_to_keep
        )
        self.report.on_checkpoint(self.global_step, str(target))
        return target

    def trainer_state(self) -> dict[str, Any]:
        """Return the controller's state: step, data position, KL coefficient and RNG."""
        return {
            "global_step": self.global_step,
            "dataloader": self.train_loader.state_dict(),
            "kl_coef": self.kl_ctrl.value if self.kl_ctrl is not None else None,
            "kl_ctrl": getattr(self.kl_ctrl, "__dict__", None),
            "rng": checkpoint.rng_states(),
        }

    def resume_dir(self) -> Path | None:
        """Return the checkpoint to resume from, as ``trainer.resume_mode`` says."""
        mode = self.config.trainer.resume_mode
        if mode == "disable":
            return None
        if mode == "resume_path":
            path = Path(resolve_path(self.config.trainer.resume_from_path) or "")
            if not checkpoint.is_complete(path):
                raise FileNotFoundError(
                    f"trainer.resume_from_path={str(path)!r} is not a checkpoint folder "
                    f"(no {checkpoint.STATE_FILE}); point it at .../global_step_<N>"
                )
            return path
        return checkpoint.latest_checkpoint(self.local_dir)

    def load_checkpoint(self) -> None:
        """Restore workers and controller from :meth:`resume_dir`, if there is one."""
        path = self.resume_dir()
        if path is None:
            return
        for role, worker, settings in self.checkpointed_roles():
            self.load_worker(path / role, worker, settings, role)
        state = checkpoint.load_state(path / checkpoint.STATE_FILE)
        self.global_step = state["global_step"]
        self.train_loader.load_state_dict(state["dataloader"])
        if self.kl_ctrl is not None and state.get("kl_ctrl"):
            self.kl_ctrl.__dict__.update(state["kl_ctrl"])
        checkpoint.restore_rng_states(state["rng"])
        print(f"resumed from {path} at step {self.global_step}")

    def load_worker(self, folder: Path, worker: Any, settings: Any, role: str) -> None:
        """Restore one worker from ``folder`` with only its ``checkpoint.load_contents``.

        A content the checkpoint lacks is refused; one left out keeps the worker's live value
        (a fresh optimizer, the starting schedule and RNG, the model path's weights), with a
        warning. ``hf_model`` loads nothing (the weights are ``model``): it only asks that the
        checkpoint has the Hugging Face folder.
        """
        key = "actor_rollout_ref.actor.checkpoint" if role == "actor" else f"{role}.checkpoint"
        contents = list(
            settings.save_contents if settings.load_contents is None else settings.load_contents
        )
        if not (folder / "state.pt").is_file():
            raise FileNotFoundError(
                f"the checkpoint {folder.parent} holds no {role} state ({role}/state.pt): "
                f"trainer.max_{role}_ckpt_to_keep pruned it from this older step; resume from a "
                "newer step (trainer.resume_mode=auto takes the newest)"
            )
        saved = checkpoint.load_state(folder / "state.pt")
        held = checkpoint.saved_contents(folder, saved)
        lacking = [name for name in contents if name not in held]
        if lacking:
            raise ValueError(
                f"{key}.load_contents asks for {lacking} but the checkpoint {folder} holds only "
                f"{held}; drop them from {key}.load_contents (what is not loaded starts fresh) "
                "or resume from a checkpoint saved with them"
            )
        skipped = [name for name in checkpoint.CONTENT_KEYS if name not in contents]
        if skipped:
            warnings.warn(
                f"resuming {role} from {folder} without {skipped} ({key}.load_contents="
                f"{contents}): {'; '.join(FRESH[name] for name in skipped)}",
                UserWarning,
                stacklevel=2,
            )
            saved = checkpoint.merge_contents(worker.state_dict(), saved, contents)
        worker.load_state_dict(saved)

    # -- the loop ----------------------------------------------------------------------------
    def fit(self) -> RunStatus:
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

    def _fit(self) -> RunStatus:
        from engine.config import config_to_dict

        config = self.config
        trainer_cfg = config.trainer
        self.load_checkpoint()
        self.report.on_start(
            config=config_to_dict(config), total_steps=self.total_steps, start_step=self.global_step
        )
        if trainer_cfg.val_only:  # verl: validate at the start (or resumed) step, then stop
            val_metrics, records = self.validate()
            self.report_val_samples(self.global_step, records)
            self.report.on_step(self.global_step, val_metrics)
            self.report.on_finish(status=RunStatus.SUCCEEDED)
            return RunStatus.SUCCEEDED
        if self.val_dataset is not None and trainer_cfg.val_before_train and self.global_step == 0:
            val_metrics, records = self.validate()
            self.report_val_samples(0, records)
            self.report.on_step(0, val_metrics)
        status = RunStatus.SUCCEEDED
        # One stream of batches over the epochs: filter_groups draws its extra batches from it.
        batches = self.prompt_batches()
        while self.global_step < self.total_steps and status == RunStatus.SUCCEEDED:
            for prompts in batches:
                self.global_step += 1
                metrics, batch, reward_info = self.train_step(prompts, batches)
                self.report.on_samples(
                    self.global_step,
                    self.sample_records(
                        batch, reward_info, split="train", n=config.actor_rollout_ref.rollout.n
                    ),
                )
                last = self.global_step >= self.total_steps
                test_freq = trainer_cfg.test_freq
                if (
                    self.val_dataset is not None
                    and test_freq > 0
                    and (self.global_step % test_freq == 0 or last)
                ):
                    timing: dict[str, float] = {}
                    with timer("testing", timing):
                        val_metrics, records = self.validate()
                    metrics.update(val_metrics)
                    metrics["timing_s/testing"] = timing["testing"]
                    self.report_val_samples(self.global_step, records)
                stop = self.report.should_stop()
                save_freq = trainer_cfg.save_freq
                if stop or (save_freq > 0 and (self.global_step % save_freq == 0 or last)):
                    timing = {}
                    with timer("save_checkpoint", timing):
                        self.save_checkpoint()
                    metrics["timing_s/save_checkpoint"] = timing["save_checkpoint"]
                self.report.on_step(self.global_step, metrics)
                if stop:
                    status = RunStatus.CANCELLED
                    break
                if last:
                    break
        self.report.on_finish(status=status)
        return status

    def train(self) -> RunStatus:
        """Train: :meth:`fit` under the name Python tutorials call (subclasses override fit)."""
        return self.fit()

    def prompt_batches(self) -> Iterator[DataProto]:
        """Yield the training loader's batches epoch after epoch, without end."""
        while True:
            yield from self.train_loader


def resolve_files(files: str | list[str]) -> list[str]:
    """Return local paths for ``data.train_files`` / ``data.val_files`` (str or list)."""
    items = [files] if isinstance(files, str) else list(files)
    return [resolve_path(f) for f in items]  # type: ignore[misc]


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


# What a worker keeps when a resume leaves a checkpoint content out (checkpoint.load_contents).
FRESH = {
    "model": "the weights stay those of the model path",
    "optimizer": "the optimizer starts fresh (no moment estimates)",
    "extra": "the learning-rate schedule and sampling RNG start afresh",
}


def load_data_tokenizer(config: Any, policy_tokenizer: Any) -> Any:
    """Return the tokenizer that reads the data: ``data.tokenizer`` when set, else the policy's.

    The prompt ids it produces are fed to the policy, so its vocabulary must be the policy's
    (token for token); only its chat template and settings may differ. ``custom_chat_template``
    applies to it as to the policy's tokenizer.
    """
    path = config.data.tokenizer
    if not path:
        return policy_tokenizer
    from types import SimpleNamespace

    from engine.workers.models import load_tokenizer

    settings = SimpleNamespace(
        path=path,
        trust_remote_code=config.data.trust_remote_code,
        custom_chat_template=config.actor_rollout_ref.model.custom_chat_template,
    )
    tokenizer = load_tokenizer(settings, path=path)
    data_vocab, policy_vocab = tokenizer.get_vocab(), policy_tokenizer.get_vocab()
    if data_vocab != policy_vocab:
        differ = sorted(
            token
            for token in data_vocab.keys() | policy_vocab.keys()
            if data_vocab.get(token) != policy_vocab.get(token)
        )
        raise ValueError(
            f"data.tokenizer={path!r} has a different vocabulary from the policy's tokenizer "
            f"({len(data_vocab)} vs {len(policy_vocab)} tokens; {len(differ)} differ, e.g. "
            f"{differ[:3]}), so the prompt ids would mean other tokens to the model; point "
            "data.tokenizer at a tokenizer with the policy's vocabulary, or unset it"
        )
    return tokenizer


def build_reward_scorer(config: Any, device: str | torch.device = "cpu") -> Any:
    """Return the reward model's scorer in this process when ``reward_model.enable=True``, else
    None (``RewardModelScorer.from_config``: sizes and defaults as verl's reward model worker).

    The single-process trainer's; with ``trainer.controller=ray`` the model is a role on the
    ranks instead (``engine.distributed.worker_group.RewardModelGroup``). Raise
    ``ConfigValidationError`` for the keys only that role reads (the validator's
    ``in_process_reward_model_problems``).
    """
    if not config.reward_model.enable:
        return None
    from engine.config import ConfigValidationError
    from engine.config.reward import in_process_reward_model_problems

    problems = in_process_reward_model_problems(config)
    if problems:
        raise ConfigValidationError(problems)
    from engine.rewards.reward_model import RewardModelScorer

    return RewardModelScorer.from_config(config, device)


def build_reward_manager(
    config: Any,
    tokenizer: Any,
    *,
    device: str | torch.device = "cpu",
    validation: bool = False,
    scorer: Any = None,
) -> Any:
    """Return the reward manager the config describes (custom function, composite or dispatch).

    With ``reward_model.enable=True`` the reward model is ``scorer`` (anything with
    ``score(prompts, responses)``, such as the Ray path's ``RewardModelGroup``) or, without one,
    a ``RewardModelScorer`` loaded here on ``device``; with no
    ``reward.components`` its score is the reward, as in verl (whose reward manager returns the
    reward model's ``rm_scores`` when the batch has them); a ``reward_model`` component weighs it
    against rule rewards, and a ``custom`` component is ``custom_reward_function``. With
    ``validation=True`` the reward model is left out, as verl's ``val_reward_fn`` leaves it: the
    other components score, or the data-source dispatch when none is left.
    """
    from engine.rewards import load_custom_reward_fn

    custom = config.custom_reward_function
    compute_score = None
    if custom.path:
        compute_score = load_custom_reward_fn(
            resolve_path(custom.path), custom.name, dict(custom.reward_kwargs or {})
        )
    components = [
        (c["name"], float(c.get("weight", 1.0)), dict(c.get("kwargs") or {}))
        if isinstance(c, dict)
        else (c.name, float(c.weight), dict(c.kwargs or {}))
        for c in (config.reward.components or [])
    ]
    if any(name == "custom" for name, _, _ in components):
        components = [(compute_score if c[0] == "custom" else c[0], *c[1:]) for c in components]
        compute_score = None
    model = None
    if validation:
        components = [c for c in components if c[0] != "reward_model"]
    elif config.reward_model.enable:
        model = scorer if scorer is not None else build_reward_scorer(config, device)
    settings = {
        "compute_score": compute_score,
        "reward_fn_key": config.data.reward_fn_key,
        "num_workers": config.reward.num_workers,
        "components": components or None,
        "reward_model": model,
    }
    if config.reward_model.reward_manager == "dapo":
        from engine.rewards.dapo import DAPORewardManager
        from engine.rewards.overlong import OverlongBuffer, overlong_buffer

        overlong = overlong_buffer(dict(config.reward_model.reward_kwargs or {}))
        recipe = config.reward_model.overlong_buffer  # verl's DAPO recipe spelling
        if recipe.enable:
            overlong = OverlongBuffer(
                config.data.max_response_length, recipe.len, recipe.penalty_factor, recipe.log
            )
        return DAPORewardManager(tokenizer, overlong=overlong, **settings)
    from engine.rewards.managers import REWARD_MANAGER_CLASSES

    manager = REWARD_MANAGER_CLASSES[config.reward_model.reward_manager]
    return manager(tokenizer, **settings, **dict(config.reward_model.reward_kwargs or {}))


def _maybe_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _json_safe(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value
