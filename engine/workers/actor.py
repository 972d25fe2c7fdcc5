"""The policy's data-parallel compute: log-probs of responses and the PPO-family update.

Mirrors verl's ``DataParallelPPOActor``: the batch arrives as a ``DataProto`` with
``input_ids`` / ``attention_mask`` / ``position_ids`` (bs, P + R) and ``responses`` /
``response_mask`` (bs, R); the update walks mini-batches (one optimizer step each) made of
micro-batches (gradient accumulation), for ``ppo_epochs`` passes.

On-policy shortcut: with one epoch and one mini-batch, the policy that produced the rollout is
exactly the policy being updated, so ``old_log_prob`` is the current ``log_prob`` detached (as
verl does). The trainer then skips the separate old-log-prob forward pass entirely.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from engine.algorithms import (
    agg_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
)
from engine.data import DataProto


def response_logits(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0
) -> torch.Tensor:
    """Return the logits (bs, R, V) that predict each response token, divided by temperature."""
    response_length = batch["responses"].shape[-1]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
        logits_to_keep=response_length + 1,
    )
    logits = out.logits[:, :-1].float()  # (bs, R, V): position t predicts response token t
    return logits / temperature if temperature and temperature != 1.0 else logits


def is_on_policy(actor_config: Any, batch_size: int, mini_batch_size: int) -> bool:
    """Return True when one update step sees the whole batch once (old policy == current)."""
    return actor_config.ppo_epochs == 1 and mini_batch_size >= batch_size


class PolicyActor:
    """Compute log-probs and update a causal LM policy with a PPO-family loss."""

    def __init__(
        self,
        model: torch.nn.Module,
        actor_config: Any,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
    ) -> None:
        self.model = model
        self.config = actor_config
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, *, micro_batch_size: int, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return ``(log_probs, entropy)`` each (bs, R); entropy is None unless asked for."""
        was_training = self.model.training
        self.model.eval()
        log_probs, entropies = [], []
        for micro in data.split(micro_batch_size):
            logits = response_logits(self.model, micro.batch, temperature)
            log_probs.append(logprobs_from_logits(logits, micro.batch["responses"]))
            if with_entropy:
                entropies.append(entropy_from_logits(logits))
        self.model.train(was_training)
        entropy = torch.cat(entropies) if with_entropy else None
        return torch.cat(log_probs), entropy

    def _policy_loss_kwargs(self) -> dict[str, Any]:
        cfg = self.config
        kwargs: dict[str, Any] = {
            "loss_agg_mode": cfg.loss_agg_mode,
            "clip_ratio": cfg.clip_ratio,
            "clip_ratio_low": cfg.clip_ratio_low,
            "clip_ratio_high": cfg.clip_ratio_high,
            "clip_ratio_c": cfg.clip_ratio_c,
        }
        policy_loss = cfg.policy_loss
        mode = policy_loss.loss_mode
        if mode == "clip_cov":
            kwargs.update(
                clip_cov_ratio=policy_loss.clip_cov_ratio,
                clip_cov_lb=policy_loss.clip_cov_lb,
                clip_cov_ub=policy_loss.clip_cov_ub,
            )
        elif mode == "kl_cov":
            kwargs.update(
                kl_cov_ratio=policy_loss.kl_cov_ratio, ppo_kl_coef=policy_loss.ppo_kl_coef
            )
        return kwargs

    def update_policy(
        self, data: DataProto, *, mini_batch_size: int, micro_batch_size: int, temperature: float
    ) -> dict[str, float]:
        """Run ``ppo_epochs`` passes of mini-batch updates; return the averaged metrics.

        ``data`` carries ``advantages`` (bs, R), and ``old_log_probs`` (bs, R) unless the update
        is on-policy, and ``ref_log_prob`` (bs, R) when ``use_kl_loss``.
        """
        assert self.optimizer is not None, "update_policy needs an optimizer"
        cfg = self.config
        policy_loss_fn = get_policy_loss_fn(cfg.policy_loss.loss_mode)
        loss_kwargs = self._policy_loss_kwargs()
        on_policy = "old_log_probs" not in data.batch
        if on_policy and not is_on_policy(cfg, len(data), mini_batch_size):
            raise ValueError(
                "old_log_probs are required unless ppo_epochs == 1 and the whole batch is one "
                "mini-batch"
            )
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        for epoch in range(cfg.ppo_epochs):
            epoch_data = data
            if cfg.shuffle and cfg.ppo_epochs > 1:
                order = torch.randperm(len(data), generator=torch.Generator().manual_seed(epoch))
                epoch_data = data[order]
            mini_batches = epoch_data.split(mini_batch_size)
            for mini in mini_batches:
                self.optimizer.zero_grad(set_to_none=True)
                micros = mini.split(micro_batch_size)
                for micro in micros:
                    batch = micro.batch
                    mask = batch["response_mask"]
                    logits = response_logits(self.model, batch, temperature)  # (b, R, V)
                    log_prob = logprobs_from_logits(logits, batch["responses"])  # (b, R)
                    old_log_prob = log_prob.detach() if on_policy else batch["old_log_probs"]
                    pg_loss, pg_metrics = policy_loss_fn(
                        old_log_prob, log_prob, batch["advantages"], mask, **loss_kwargs
                    )
                    loss = pg_loss
                    if cfg.entropy_coeff != 0:
                        entropy = entropy_from_logits(logits)
                        entropy_loss = agg_loss(entropy, mask, cfg.loss_agg_mode)
                        loss = loss - cfg.entropy_coeff * entropy_loss
                    else:
                        with torch.no_grad():
                            entropy_loss = agg_loss(
                                entropy_from_logits(logits), mask, cfg.loss_agg_mode
                            )
                    if cfg.use_kl_loss:
                        kld = kl_penalty(log_prob, batch["ref_log_prob"], cfg.kl_loss_type)
                        kl_loss = agg_loss(kld, mask, cfg.loss_agg_mode)
                        loss = loss + cfg.kl_loss_coef * kl_loss
                        metrics["actor/kl_loss"].append(kl_loss.item())
                        metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
                    # Each micro-batch's share of the mini-batch mean.
                    (loss * (len(micro) / len(mini))).backward()
                    metrics["actor/pg_loss"].append(pg_loss.item())
                    metrics["actor/entropy"].append(entropy_loss.item())
                    for key, value in pg_metrics.items():
                        metrics[key].append(float(value))
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    self.optimizer.zero_grad(set_to_none=True)
                metrics["actor/grad_norm"].append(float(grad_norm))
        self.optimizer.zero_grad(set_to_none=True)
        metrics["actor/lr"].append(self.optimizer.param_groups[0]["lr"])
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return {key: sum(values) / len(values) for key, values in metrics.items()}
