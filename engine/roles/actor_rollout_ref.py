"""The actor-rollout-reference worker: one object owning the policy, its rollout engine and the
frozen reference policy, with batch-in / batch-out methods the controller calls.

This is the hybrid engine of HybridFlow in one process: the rollout generates with the actor's
own module, so the weights it samples from are always the latest update. The Ray workers wrap
this same class per rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from engine.algorithms.rollout_correction import rollout_correction_active
from engine.data import DataProto
from engine.lora import adapter_disabled, adapter_settings, export_lora, is_lora
from engine.perf import ProcessMeter, rank_system_metrics, update_mfu
from engine.roles.actor import PolicyActor, is_on_policy, needs_sum_pi_squared
from engine.roles.batch_sizes import micro_size, per_rank_size
from engine.roles.model_loading import (
    PolicySkeleton,
    changed_config_attributes,
    frozen_copy,
    load_policy,
    load_tokenizer,
    policy_skeleton,
    policy_state,
    resolve_path,
)
from engine.roles.optim import build_lr_scheduler, build_optimizer
from engine.roles.protocols import RolloutEngine
from engine.roles.ulysses import sequence_parallel_group
from engine.rollout import get_rollout_builder
from engine.rollout.multi_turn import MultiTurnRollout
from engine.rollout.tensor_parallel import TensorParallelShare, engine_seed, tensor_parallel_group

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from engine.config import PPOConfig, RolloutConfig


def get_rollout(
    name: str,
    model: torch.nn.Module,
    tokenizer: Any,
    rollout_config: RolloutConfig,
    *,
    model_path: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    model_overrides: dict[str, Any] | None = None,
) -> RolloutEngine:
    """Return the rollout engine registered under ``actor_rollout_ref.rollout.name``.

    ``seed`` seeds an engine's own sampler (``vllm``, ``sglang``); ``model_overrides`` (the
    config attributes the policy's ``model.override_config`` changed) build a served engine's
    model as the policy's.

    With ``rollout.multi_turn.enable`` it is wrapped in a :class:`MultiTurnRollout`, which
    renders each turn with ``chat_template_kwargs`` (``data.apply_chat_template_kwargs``).
    """
    rollout = get_rollout_builder(name)(
        model, tokenizer, rollout_config, model_path, seed=seed, model_overrides=model_overrides
    )
    multi_turn = getattr(rollout_config, "multi_turn", None)
    if multi_turn is not None and multi_turn.enable:
        tools = getattr(multi_turn, "tool_config_path", None)
        interactions = getattr(multi_turn, "interaction_config_path", None)
        if not (
            multi_turn.interaction_path or multi_turn.interaction_name or interactions or tools
        ):
            # verl's agent loop with no tools and no interaction ends after the first assistant
            # turn; so does this, and says so rather than failing a tutorial's config.
            print(
                "note: actor_rollout_ref.rollout.multi_turn.enable=True names no interaction "
                "(multi_turn.interaction_config_path, or interaction_path / interaction_name): "
                "every conversation is the prompt and one assistant turn"
            )
            return rollout
        rollout = MultiTurnRollout(
            rollout, tokenizer, multi_turn, chat_template_kwargs=chat_template_kwargs
        )
    return rollout


def rollout_build_arguments(config: PPOConfig) -> dict[str, Any]:
    """Return :func:`get_rollout`'s keyword arguments that come from the run's config (all but
    ``seed``): a served engine (``vllm``, ``sglang``) loads the model itself from
    ``model_path``, built as the policy with its ``override_config``."""
    arr = config.actor_rollout_ref
    served = arr.rollout.name in ("vllm", "sglang")  # engines that load the model themselves
    model_path = resolve_path(arr.model.path) if served else None
    return {
        "model_path": model_path,
        "chat_template_kwargs": config.data.apply_chat_template_kwargs,
        "model_overrides": (
            changed_config_attributes(
                model_path, arr.model, "actor_rollout_ref.model.override_config"
            )
            if model_path
            else None
        ),
    }


def sampling_params(rollout: Any, validate: bool) -> dict[str, Any]:
    """Return the sampling keyword arguments of ``actor_rollout_ref.rollout`` for training or
    validation (``val_kwargs``) rollouts."""
    source = rollout.val_kwargs if validate else rollout
    return {
        "do_sample": bool(source.do_sample) and source.temperature > 0,
        "temperature": float(source.temperature),
        "top_k": int(source.top_k),
        "top_p": float(source.top_p),
        "ignore_eos": bool(rollout.ignore_eos),
    }


class ActorRolloutRefWorker:
    """Own the policy (with optimizer), its rollout engine and the reference policy.

    ``rank`` and ``world_size`` place it in a data-parallel group: the mini-batch is this rank's
    share, and each rank samples from its own random stream. ``shard`` (the rank's FSDP2 hook,
    ``engine.distributed.rank_worker``) is called with the worker once its models are loaded and
    before the optimizer is built, so the optimizer holds the sharded parameters; it may set
    :attr:`rollout_model`, the module the rollout samples from (the policy itself by default).
    """

    def __init__(
        self,
        config: PPOConfig,
        *,
        device: torch.device,
        total_steps: int,
        need_ref: bool,
        rank: int = 0,
        world_size: int = 1,
        shard: Callable[[ActorRolloutRefWorker], None] | None = None,
    ) -> None:
        self.config = config
        arr = config.actor_rollout_ref
        self.device = device
        self.tokenizer = load_tokenizer(arr.model)
        self.model = load_policy(arr.model, device)
        self.need_ref = need_ref
        # With LoRA the reference is the same module with its adapter disabled: no copy.
        self.ref_model = frozen_copy(self.model) if need_ref and not is_lora(self.model) else None
        self.rollout_model: torch.nn.Module | None = None
        if shard is not None:
            shard(self)
        optimizer = build_optimizer(self.model.parameters(), arr.actor.optim)
        scheduler = build_lr_scheduler(optimizer, arr.actor.optim, total_steps)
        # Ulysses: groups of ranks that split each sequence (every rank creates every group).
        key = "actor_rollout_ref.{}.ulysses_sequence_parallel_size"
        sp = sequence_parallel_group(
            arr.actor.ulysses_sequence_parallel_size, key.format("actor"), self.model.config
        )
        self.ref_sequence_parallel = sp
        if arr.ref.ulysses_sequence_parallel_size != arr.actor.ulysses_sequence_parallel_size:
            self.ref_sequence_parallel = sequence_parallel_group(
                arr.ref.ulysses_sequence_parallel_size, key.format("ref"), self.model.config
            )
        self.actor = PolicyActor(
            self.model,
            arr.actor,
            optimizer,
            scheduler,
            remove_padding=arr.model.use_remove_padding,
            sequence_parallel=sp,
            uniform_calls=world_size > 1,  # FSDP2 over several ranks: one plan for all
        )
        # vLLM over several ranks: one engine per tensor_model_parallel_size consecutive ranks.
        tensor_parallel = (
            arr.rollout.tensor_model_parallel_size if arr.rollout.name == "vllm" else 1
        )
        group = tensor_parallel_group(
            tensor_parallel, "actor_rollout_ref.rollout.tensor_model_parallel_size"
        )
        self.rollout = get_rollout(
            arr.rollout.name,
            self.model,
            self.tokenizer,
            arr.rollout,
            seed=engine_seed(config.trainer.seed, rank, tensor_parallel),
            **rollout_build_arguments(config),
        )
        if group is not None:
            self.rollout = TensorParallelShare(self.rollout, group)
        # Each rank samples its own prompts: give each its own random stream.
        self.generator = torch.Generator(device="cpu").manual_seed(config.trainer.seed + rank)
        self.meter = ProcessMeter()
        n = arr.rollout.n
        self.mini_batch_size = per_rank_size(
            arr.actor.ppo_mini_batch_size * n,
            world_size // arr.actor.ulysses_sequence_parallel_size,  # the data-parallel ranks
            "actor_rollout_ref.actor.ppo_mini_batch_size",
        )
        self.micro_batch_size = micro_size(
            arr.actor.ppo_micro_batch_size_per_gpu, self.mini_batch_size
        )
        self.log_prob_micro_batch_size = (
            arr.rollout.log_prob_micro_batch_size_per_gpu or self.micro_batch_size
        )
        self.ref_micro_batch_size = (
            arr.ref.log_prob_micro_batch_size_per_gpu or self.log_prob_micro_batch_size
        )
        # use_dynamic_bsz: token budgets instead of row counts (None: the row counts above).
        self.max_token_len = (
            arr.actor.ppo_max_token_len_per_gpu if arr.actor.use_dynamic_bsz else None
        )
        self.log_prob_max_token_len, self.ref_max_token_len = (
            section.log_prob_max_token_len_per_gpu if section.log_prob_use_dynamic_bsz else None
            for section in (arr.rollout, arr.ref)
        )

    # -- rollout -----------------------------------------------------------------------------
    def sampling_params(self, validate: bool) -> dict[str, Any]:
        """Return the sampling keyword arguments for training or validation rollouts."""
        return sampling_params(self.config.actor_rollout_ref.rollout, validate)

    def generate_sequences(self, prompts: DataProto, *, validate: bool = False) -> DataProto:
        """Return the rollout for prompts already repeated ``n`` times (see HFRollout)."""
        start = time.perf_counter()
        self.rollout.load_weights(self.model if self.rollout_model is None else self.rollout_model)
        sync_s = time.perf_counter() - start
        out = self.rollout.generate_sequences(
            prompts.to(self.device),
            max_new_tokens=self.config.actor_rollout_ref.rollout.response_length
            or self.config.data.max_response_length,
            sampling=self.sampling_params(validate),
            generator=self.generator if self.device.type == "cpu" else None,
        )
        out.meta_info["timing_s/update_weights"] = sync_s
        return out

    # -- log-probs ---------------------------------------------------------------------------
    def needs_old_log_prob(self, batch_size: int) -> bool:
        """Return False when the update is on-policy and old log-probs equal the current ones."""
        return not is_on_policy(
            self.config.actor_rollout_ref.actor, batch_size, self.mini_batch_size
        )

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Return ``old_log_probs`` (bs, R) and ``entropys`` (bs, R) under the current policy, and
        ``sum_pi_squared`` (bs, R) when the advantage estimator weighs by it (the optimal token
        baselines; verl's ``actor.calculate_sum_pi_squared``)."""
        stats = self.actor.compute_token_stats(
            data,
            micro_batch_size=self.log_prob_micro_batch_size,
            temperature=self.config.actor_rollout_ref.rollout.temperature,
            with_entropy=True,
            with_sum_pi_squared=needs_sum_pi_squared(self.config),
            max_token_len=self.log_prob_max_token_len,
            max_token_len_key="actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
        )
        stats["old_log_probs"] = stats.pop("log_probs")
        return DataProto.from_dict(stats)

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Return ``ref_log_prob`` (bs, R) under the frozen reference policy."""
        lora_ref = self.ref_model is None and self.need_ref and is_lora(self.model)
        ref_model = self.model if lora_ref else self.ref_model
        if ref_model is None:
            raise RuntimeError("no reference policy: enable use_kl_loss or use_kl_in_reward")
        ref = PolicyActor(
            ref_model,
            self.config.actor_rollout_ref.actor,
            remove_padding=self.actor.remove_padding,
            sequence_parallel=self.ref_sequence_parallel,
            uniform_calls=self.actor.uniform_calls,
        )
        with adapter_disabled(self.model) if lora_ref else nullcontext():
            log_probs, _ = ref.compute_log_prob(
                data,
                micro_batch_size=self.ref_micro_batch_size,
                temperature=self.config.actor_rollout_ref.rollout.temperature,
                with_entropy=False,
                max_token_len=self.ref_max_token_len,
                max_token_len_key="actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
            )
        return DataProto.from_dict({"ref_log_prob": log_probs})

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """Run the policy update and return its metrics, with this rank's ``perf/`` metrics
        (MFU, memory, CPU; ``engine.perf``) as verl's FSDP worker records them."""
        start = time.perf_counter()
        metrics = self._update_policy(data)
        seconds = time.perf_counter() - start
        mfu = update_mfu(
            self.model.config,
            data.batch["attention_mask"],
            seconds,
            epochs=self.config.actor_rollout_ref.actor.ppo_epochs,
            device=self.device,
        )
        if mfu is not None:
            metrics["perf/mfu/actor"] = mfu
        metrics.update(rank_system_metrics(self.meter, self.device))
        return metrics

    def _update_policy(self, data: DataProto) -> dict[str, float]:
        """Run the policy update (``PolicyActor.update_policy``) and return its metrics."""
        # verl's actor applies the rollout correction, and records its metrics, whenever the
        # correction is on or the rollout's log-probs are checked (calculate_log_probs).
        correction = self.config.algorithm.rollout_correction
        checked = self.config.actor_rollout_ref.rollout.calculate_log_probs
        return self.actor.update_policy(
            data,
            mini_batch_size=self.mini_batch_size,
            micro_batch_size=self.micro_batch_size,
            temperature=self.config.actor_rollout_ref.rollout.temperature,
            max_token_len=self.max_token_len,
            rollout_correction=(
                correction if checked or rollout_correction_active(correction) else None
            ),
        )

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return everything needed to continue exactly: weights, optimizer, schedule, RNG (and
        the LoRA settings, which ``engine.model_merger`` needs to fold the adapter in)."""
        actor = self.actor
        return {
            "model": self.model.state_dict(),
            "optimizer": actor.optimizer.state_dict() if actor.optimizer else None,
            "lr_scheduler": actor.lr_scheduler.state_dict() if actor.lr_scheduler else None,
            "generator": self.generator.get_state(),
            "lora": adapter_settings(self.model),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state written by :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        if state.get("optimizer") and self.actor.optimizer:
            self.actor.optimizer.load_state_dict(state["optimizer"])
        if state.get("lr_scheduler") and self.actor.lr_scheduler:
            self.actor.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.generator.set_state(state["generator"])

    def policy_skeleton(self) -> PolicySkeleton:
        """Return what a rollout worker process builds its weightless policy copy from."""
        return policy_skeleton(self.model)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Return a CPU copy of the policy's weights (what a rollout worker loads)."""
        return policy_state(self.model)

    def export_hf(self, directory: str | Path) -> Path:
        """Save the policy and tokenizer as a Hugging Face folder (``from_pretrained`` loads it)."""
        directory = Path(directory)
        if is_lora(self.model):  # the adapter merged in: a plain Hugging Face folder
            return export_lora(self.model, directory, tokenizer=self.tokenizer)
        cast("PreTrainedModel", self.model).save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory
