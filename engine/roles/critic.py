"""The value model's compute and update, as verl's ``DataParallelPPOCritic``.

The critic is a token-classification head (one label) on the same backbone architecture as the
policy; the value of response token t is read at the position that predicts it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.algorithms.torch_functional import masked_mean
from engine.algorithms.value import compute_value_loss
from engine.data import DataProto
from engine.roles.batch_sizes import epoch_batches, global_batch, micro_size, per_rank_size
from engine.roles.optim import (
    build_lr_scheduler,
    build_optimizer,
    finish_update,
    optimizer_step,
)
from engine.roles.packing import packed_response_values
from engine.roles.seqlen_balancing import restore_order, split_micro_batches
from engine.roles.ulysses import (
    SequenceParallel,
    role_forward,
    sequence_parallel_group,
)

if TYPE_CHECKING:
    from engine.config import CriticConfig, PPOConfig

CRITIC_MAX_TOKEN_LEN_KEY = "critic.ppo_max_token_len_per_gpu"
CRITIC_FORWARD_TOKEN_LEN_KEY = "critic.forward_max_token_len_per_gpu"  # the values pass


def response_values(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Return the values (bs, R) at the positions that predict each response token."""
    response_length = batch["responses"].shape[-1]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    )
    values = out.logits[:, -response_length - 1 : -1, 0]  # (bs, R)
    return values.float() if values.dtype in (torch.float16, torch.bfloat16) else values


class ValueCritic:
    """Compute values and update a value model with the clipped value loss.

    ``remove_padding`` (``critic.model.use_remove_padding``) runs each micro-batch packed into
    one row (``engine.roles.packing``); ``sequence_parallel`` splits that row over the group's
    ranks (``critic.ulysses_sequence_parallel_size``, ``engine.roles.ulysses``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        critic_config: CriticConfig,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any = None,
        *,
        remove_padding: bool = False,
        sequence_parallel: SequenceParallel | None = None,
    ) -> None:
        self.model = model
        self.config = critic_config
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.forward, self.sequence_parallel_size = role_forward(
            model,
            response_values,
            packed_response_values,
            remove_padding=remove_padding,
            sequence_parallel=sequence_parallel,
            keys="critic.model.use_remove_padding=True with critic.ulysses_sequence_parallel_size > 1",
        )

    @torch.no_grad()
    def compute_values(
        self, data: DataProto, *, micro_batch_size: int, max_token_len: int | None = None
    ) -> torch.Tensor:
        """Return values (bs, R), zero outside the response mask, in batch order.

        Micro-batches hold ``micro_batch_size`` rows, or at most ``max_token_len`` tokens.
        """
        self.model.eval()
        micros, order = split_micro_batches(
            data, micro_batch_size, max_token_len, CRITIC_FORWARD_TOKEN_LEN_KEY
        )
        values = [
            self.forward(self.model, micro.batch) * micro.batch["response_mask"] for micro in micros
        ]
        return restore_order(torch.cat(values), order)

    def update_critic(
        self,
        data: DataProto,
        *,
        mini_batch_size: int,
        micro_batch_size: int,
        max_token_len: int | None = None,
    ) -> dict[str, float]:
        """Fit values to ``returns`` (bs, R) for ``ppo_epochs`` passes; return averaged metrics.

        As the actor's update: micro-batches by rows or by ``max_token_len`` tokens, the value
        loss normalised over the mini-batch on every rank; ``critic/vf_loss`` is the
        mini-batch's loss.
        """
        cfg = self.config
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        for epoch_data in epoch_batches(data, cfg):
            for mini in epoch_data.split(mini_batch_size):
                self.optimizer.zero_grad(set_to_none=True)
                micros, _ = split_micro_batches(
                    mini, micro_batch_size, max_token_len, CRITIC_MAX_TOKEN_LEN_KEY
                )
                counts = global_batch(
                    mini.batch["response_mask"],
                    loss_scale_factor=None,
                    norm_times_dp=cfg.seq_mean_token_sum_norm_times_dp,
                    sequence_parallel_size=self.sequence_parallel_size,
                )
                vf_loss_total = 0.0
                for micro in micros:
                    batch = micro.batch
                    mask = batch["response_mask"]
                    vpreds = self.forward(self.model, batch)
                    vf_loss, vf_clipfrac = compute_value_loss(
                        vpreds,
                        batch["returns"],
                        batch["values"],
                        mask,
                        cliprange_value=cfg.cliprange_value,
                        loss_agg_mode=cfg.loss_agg_mode,
                        global_batch=counts,
                    )
                    vf_loss.backward()
                    vf_loss_total += vf_loss.item()
                    metrics["critic/vf_clipfrac"].append(float(vf_clipfrac))
                    metrics["critic/vpred_mean"].append(masked_mean(vpreds, mask).item())
                metrics["critic/vf_loss"].append(vf_loss_total)
                grad_norm = optimizer_step(self.model, self.optimizer, cfg.grad_clip)
                metrics["critic/grad_norm"].append(grad_norm)
        return finish_update(self.optimizer, self.lr_scheduler, metrics, "critic")


class CriticWorker:
    """Own the value model, its optimizer and schedule; batch-in / batch-out for the controller.

    ``world_size`` makes the mini-batch this rank's share; ``shard`` (the rank's FSDP2 hook) is
    called with the value model before the optimizer is built, as for the actor.
    """

    def __init__(
        self,
        config: PPOConfig,
        *,
        device: Any,
        total_steps: int,
        world_size: int = 1,
        shard: Callable[[torch.nn.Module], None] | None = None,
    ) -> None:
        from engine.roles.model_loading import load_critic

        critic_config = config.critic
        self.model = load_critic(critic_config, config.actor_rollout_ref.model, device)
        if critic_config.model.enable_gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        if shard is not None:
            shard(self.model)
        optimizer = build_optimizer(self.model.parameters(), critic_config.optim)
        scheduler = build_lr_scheduler(optimizer, critic_config.optim, total_steps)
        sp_size = critic_config.ulysses_sequence_parallel_size
        self.critic = ValueCritic(
            self.model,
            critic_config,
            optimizer,
            scheduler,
            remove_padding=critic_config.model.use_remove_padding,
            sequence_parallel=sequence_parallel_group(
                sp_size, "critic.ulysses_sequence_parallel_size", self.model.config
            ),
        )
        n = config.actor_rollout_ref.rollout.n
        if critic_config.ppo_mini_batch_size is None:
            raise ValueError(
                "critic.ppo_mini_batch_size is null; set it, or resolve the config "
                "(resolve_config) so it takes actor_rollout_ref.actor.ppo_mini_batch_size"
            )
        self.mini_batch_size = per_rank_size(
            critic_config.ppo_mini_batch_size * n,
            world_size // sp_size,  # the data-parallel ranks
            "critic.ppo_mini_batch_size",
        )
        self.micro_batch_size = micro_size(
            critic_config.ppo_micro_batch_size_per_gpu, self.mini_batch_size
        )
        # use_dynamic_bsz: micro-batches by a token budget instead of a row count.
        self.max_token_len = (
            critic_config.ppo_max_token_len_per_gpu if critic_config.use_dynamic_bsz else None
        )
        # The values pass (no gradient) has its own sizes, the update's when not set.
        self.forward_micro_batch_size = micro_size(
            critic_config.forward_micro_batch_size_per_gpu
            or critic_config.ppo_micro_batch_size_per_gpu,
            self.mini_batch_size,
        )
        self.forward_max_token_len = (
            (critic_config.forward_max_token_len_per_gpu or critic_config.ppo_max_token_len_per_gpu)
            if critic_config.use_dynamic_bsz
            else None
        )

    def compute_values(self, data: DataProto) -> DataProto:
        """Return ``values`` (bs, R), micro-batched by the forward_* sizes."""
        values = self.critic.compute_values(
            data,
            micro_batch_size=self.forward_micro_batch_size,
            max_token_len=self.forward_max_token_len,
        )
        return DataProto.from_dict({"values": values})

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Fit the value model to ``returns`` and return its metrics."""
        return self.critic.update_critic(
            data,
            mini_batch_size=self.mini_batch_size,
            micro_batch_size=self.micro_batch_size,
            max_token_len=self.max_token_len,
        )

    def state_dict(self) -> dict[str, Any]:
        """Return weights, optimizer and schedule state."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.critic.optimizer.state_dict(),
            "lr_scheduler": self.critic.lr_scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state written by :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.critic.optimizer.load_state_dict(state["optimizer"])
        self.critic.lr_scheduler.load_state_dict(state["lr_scheduler"])

    def export_hf(self, directory: str | Path) -> Path:
        """Save the value model as a Hugging Face folder (``AutoModelForTokenClassification``)."""
        directory = Path(directory)
        self.model.save_pretrained(directory)
        return directory
