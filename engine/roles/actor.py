"""The policy's data-parallel compute: log-probs of responses and the PPO-family update.

Mirrors verl's ``DataParallelPPOActor``: the batch arrives as a ``DataProto`` with
``input_ids`` / ``attention_mask`` / ``position_ids`` (bs, P + R) and ``responses`` /
``response_mask`` (bs, R); the update walks mini-batches (one optimizer step each) made of
micro-batches (gradient accumulation), for ``ppo_epochs`` passes.

On-policy shortcut: with one epoch and one mini-batch, the policy that produced the rollout is
exactly the policy being updated, so ``old_log_prob`` is the current ``log_prob`` detached (as
verl does). The trainer then skips the separate old-log-prob forward pass entirely.

Shared prompts: the ``n`` samples of a GRPO group repeat one prompt, and under causal attention
the prompt's hidden states do not depend on what follows. ``response_logits`` therefore runs each
distinct prompt through the model once, filling a KV cache (part of the autograd graph when
training, so gradients still reach every prompt position), indexes that cache out to the rows,
and runs only the responses on top of it. The logits equal one full forward over prompt +
response up to float rounding; the prompt work falls by the group size. The last response token
never predicts anything, so it is not fed to the model at all.

Qwen2 and Llama policies run these passes through :class:`engine.llama_forward.LlamaForward` (the model's own
parameters through functional ops, under autograd when training) rather than the module's
forward: on the tiny model it takes a fifth off the reference pass and 8-15% off the update
(``bench/training/lean_forward.py``). Other models, and models with hooks (FSDP2, PEFT), use their
forward.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from engine.algorithms.kl import kl_penalty
from engine.algorithms.loss_aggregation import agg_loss
from engine.algorithms.names import TOKEN_BASELINE_ESTIMATORS
from engine.algorithms.policy_loss.base import PolicyLossInputs, get_policy_loss_fn
from engine.algorithms.rollout_correction import (
    IS_IN_UPDATE,
    compute_rollout_corr_metrics_from_logprobs,
    compute_rollout_correction_and_rejection_mask,
    correction_settings,
)
from engine.algorithms.torch_functional import (
    entropy_from_logits,
    logprobs_from_logits,
    sum_pi_squared_from_logits,
)
from engine.data import DataProto
from engine.llama_forward import LlamaForward, causal_mask, checkpointing
from engine.roles.batch_sizes import epoch_batches, global_batch
from engine.roles.optim import finish_update, optimizer_step
from engine.roles.packing import packed_response_logits
from engine.roles.seqlen_balancing import (
    agree_call_plan,
    length_buckets,
    restore_order,
    split_micro_batches,
)
from engine.roles.ulysses import SequenceParallel, role_forward
from engine.rollout.sampling import new_kv_cache, shared_prompts, trim_left_padding, with_cache

if TYPE_CHECKING:
    from engine.config import ActorConfig, PPOConfig

PPO_MAX_TOKEN_LEN_KEY = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"


def response_logits(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float = 1.0,
    *,
    lean: bool = True,
    uniform_calls: bool = False,
    max_buckets: int = 4,
) -> torch.Tensor:
    """Return the logits (bs, R, V) that predict each response token, divided by temperature.

    Rows are run in buckets of similar response length (``length_buckets``), each cut to its
    longest response; positions past a bucket's longest response get zero logits (every loss
    masks them). Models :class:`~engine.llama_forward.LlamaForward` supports run through it (``lean=False``
    keeps the model's own forward); the logits are the same up to float rounding.

    ``uniform_calls``: every data-parallel rank makes the same forward calls. A model sharded
    over several ranks needs it: every FSDP2 forward (and its backward) is a collective, so a rank
    that made one call more than another would wait for it forever, or pair its gathers with the
    next model's. The ranks agree on one plan a micro-batch (``agree_call_plan``, one
    all-reduce): the most buckets any rank's rows want, and the shared prompt pass where every
    rank can run it. ``max_buckets`` caps the buckets (1: one call for the micro-batch).
    """
    responses = batch["responses"]  # (bs, R)
    response_length = responses.shape[-1]
    input_ids, attention_mask, position_ids = trim_left_padding(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    )  # (bs, P + R), P without the columns that are padding in every row
    prompt_length = input_ids.shape[-1] - response_length
    lengths = attention_mask[:, prompt_length:].sum(-1)  # (bs,) response lengths
    runner = LlamaForward.build(model) if lean else None
    groups = None
    # checkpointed layers drop the KV cache the shared pass needs
    if not checkpointing(model):
        groups = shared_prompts(input_ids[:, :prompt_length], attention_mask[:, :prompt_length])
    buckets = length_buckets(lengths, response_length, max_buckets=max_buckets)
    if uniform_calls:
        count, shared = agree_call_plan(
            len(buckets), len(lengths), groups is not None, lengths.device
        )
        groups = groups if shared else None
        # A shared pass makes a call for each bucket longer than one token: make every bucket
        # longer (one masked position at most) unless no response can be.
        planned = lengths.clamp(min=2) if shared else lengths
        buckets = length_buckets(planned, response_length, count=count)
    prompt_logits = prompt_state = None
    if groups is not None:
        first = groups[0]  # (u,) one row per distinct prompt
        prompt_logits, prompt_state = _prompt_pass(
            model,
            runner,
            input_ids[first, :prompt_length],
            attention_mask[first, :prompt_length],
            position_ids[first, :prompt_length],
        )  # (u, 1, V): predicts response token 0
    pieces = []
    for rows, length in buckets:
        end = prompt_length + length - 1  # the last response token predicts nothing
        if groups is None:
            logits = _full_pass(
                model,
                runner,
                input_ids[rows, :end],
                attention_mask[rows, :end],
                position_ids[rows, :end],
                keep=length,
            )  # (b, length, V)
        else:
            assert prompt_logits is not None
            prompt_rows = groups[1][rows]  # (b,) each row's distinct prompt
            parts = [prompt_logits[prompt_rows]]
            if length > 1:
                parts.append(
                    _response_pass(
                        model,
                        runner,
                        responses[rows, : length - 1],
                        attention_mask[rows, :end],
                        position_ids[rows, prompt_length:end],
                        prompt_state,
                        prompt_rows,
                        last=len(buckets) == 1,
                    )  # (b, length - 1, V): predict response tokens 1 .. length - 1
                )
            logits = torch.cat(parts, dim=1)  # (b, length, V)
        pieces.append(torch.nn.functional.pad(logits, (0, 0, 0, response_length - length)))
    logits = pieces[0] if len(pieces) == 1 else torch.cat(pieces)  # (bs, R, V), bucket order
    if len(buckets) > 1:
        order = torch.cat([rows for rows, _ in buckets])
        logits = logits[torch.argsort(order)]  # back to batch order
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # fp32 losses under bf16 compute; fp32/fp64 models keep theirs
    return logits / temperature if temperature and temperature != 1.0 else logits


def _prompt_pass(
    model: torch.nn.Module,
    runner: LlamaForward | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
) -> tuple[torch.Tensor, Any]:
    """Run the distinct prompts (u, P); return the logits at their last token (u, 1, V) and the
    state the response passes attend to (a KV cache, or the lean per-layer keys and values)."""
    if runner is None:
        cache = new_kv_cache(model)
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **with_cache(cache),
            use_cache=True,
            logits_to_keep=1,
        ).logits
        return logits, cache
    hidden, keys_values = runner.forward(
        input_ids, position_ids, causal_mask(attention_mask), keep_kv=True
    )
    return runner.logits(hidden[:, -1:]), keys_values


def _response_pass(
    model: torch.nn.Module,
    runner: LlamaForward | None,
    response_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_state: Any,
    prompt_rows: torch.Tensor,
    *,
    last: bool,
) -> torch.Tensor:
    """Run response tokens (b, T) on top of their prompts; return their logits (b, T, V).

    ``attention_mask`` (b, P + T) covers prompt and responses, ``prompt_rows`` (b,) picks each
    row's prompt out of ``prompt_state``; ``last`` lets the KV cache be cut down in place.
    """
    if runner is None:
        return model(
            input_ids=response_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **with_cache(select_cache(prompt_state, prompt_rows, model, last=last)),
            use_cache=True,
        ).logits
    b, t = response_ids.shape
    prompt_length = attention_mask.shape[-1] - t
    sees_prompt = attention_mask[:, None, None, :prompt_length].bool().expand(b, 1, t, -1)
    causal = torch.ones(t, t, dtype=torch.bool, device=response_ids.device).tril()
    mask = torch.cat([sees_prompt, causal.expand(b, 1, t, t)], dim=-1)  # (b, 1, T, P + T)
    past = [(keys[prompt_rows], values[prompt_rows]) for keys, values in prompt_state]
    hidden, _ = runner.forward(response_ids, position_ids, mask, past=past)
    return runner.logits(hidden)


def _full_pass(
    model: torch.nn.Module,
    runner: LlamaForward | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    keep: int,
) -> torch.Tensor:
    """Run whole left-padded rows (b, L); return the logits of the last ``keep`` positions."""
    if runner is None:
        return model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=keep,
        ).logits
    hidden, _ = runner.forward(input_ids, position_ids, causal_mask(attention_mask))
    return runner.logits(hidden[:, -keep:])


def select_cache(cache: Any, rows: torch.Tensor, model: torch.nn.Module, *, last: bool) -> Any:
    """Return a KV cache holding ``rows`` of ``cache`` (in place when it is not needed again)."""
    if last:
        cache.batch_select_indices(rows)
        return cache
    selected = new_kv_cache(model)
    for index, layer in enumerate(cache.layers):
        selected.update(layer.keys[rows], layer.values[rows], index)
    return selected


def set_training(model: torch.nn.Module, training: bool) -> None:
    """Switch train/eval mode only when it changes: ``train()`` walks every submodule."""
    if model.training != training:
        model.train(training)


_ROW = "update_row"  # a row's index in the update's batch, while IS weights are taken in it


def is_on_policy(actor_config: ActorConfig, batch_size: int, mini_batch_size: int) -> bool:
    """Return True when one update step sees the whole batch once (old policy == current)."""
    return actor_config.ppo_epochs == 1 and mini_batch_size >= batch_size


def needs_sum_pi_squared(config: PPOConfig) -> bool:
    """Return True when ``algorithm.adv_estimator`` weighs by each token's ``sum_v pi_v^2``: the
    old-log-prob pass then computes it (verl's ``actor.calculate_sum_pi_squared``) and runs even
    where an on-policy update could skip it."""
    return config.algorithm.adv_estimator in TOKEN_BASELINE_ESTIMATORS


class PolicyActor:
    """Compute log-probs and update a causal LM policy with a PPO-family loss.

    ``remove_padding`` (``model.use_remove_padding``) runs each micro-batch packed into one row
    (``engine.roles.packing``) instead of :func:`response_logits`' padded buckets;
    ``uniform_calls`` (a model sharded over several ranks) makes the padded forward's calls the
    same on every rank (the packed one makes one call a micro-batch anyway).
    ``sequence_parallel`` (``ulysses_sequence_parallel_size`` > 1, packed rows only) splits that
    row over the group's ranks (``engine.roles.ulysses``), which hold the same micro-batches.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        actor_config: ActorConfig,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        *,
        remove_padding: bool = False,
        sequence_parallel: SequenceParallel | None = None,
        uniform_calls: bool = False,
    ) -> None:
        self.model = model
        self.config = actor_config
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.remove_padding = remove_padding
        self.uniform_calls = uniform_calls
        self.forward, self.sequence_parallel_size = role_forward(
            model,
            partial(response_logits, uniform_calls=True) if uniform_calls else response_logits,
            packed_response_logits,
            remove_padding=remove_padding,
            sequence_parallel=sequence_parallel,
            keys="actor_rollout_ref.model.use_remove_padding=True with "
            "ulysses_sequence_parallel_size > 1",
        )

    def compute_log_prob(
        self,
        data: DataProto,
        *,
        micro_batch_size: int,
        temperature: float,
        with_entropy: bool,
        max_token_len: int | None = None,
        max_token_len_key: str = "log_prob_max_token_len_per_gpu",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return ``(log_probs, entropy)`` each (bs, R); entropy is None unless asked for.

        Micro-batches hold ``micro_batch_size`` rows, or with ``max_token_len`` (dynamic batch
        size) at most that many tokens; the outputs come back in batch order either way.
        """
        out = self.compute_token_stats(
            data,
            micro_batch_size=micro_batch_size,
            temperature=temperature,
            with_entropy=with_entropy,
            max_token_len=max_token_len,
            max_token_len_key=max_token_len_key,
        )
        return out["log_probs"], out.get("entropys")

    @torch.no_grad()
    def compute_token_stats(
        self,
        data: DataProto,
        *,
        micro_batch_size: int,
        temperature: float,
        with_entropy: bool,
        with_sum_pi_squared: bool = False,
        max_token_len: int | None = None,
        max_token_len_key: str = "log_prob_max_token_len_per_gpu",
    ) -> dict[str, torch.Tensor]:
        """Return ``log_probs`` (bs, R), and ``entropys`` / ``sum_pi_squared`` (bs, R) when asked
        for, all in batch order, from one forward per micro-batch (as :meth:`compute_log_prob`).

        ``sum_pi_squared`` is each position's ``sum_v pi_v^2`` under the temperature-scaled policy
        (verl's ``calculate_sum_pi_squared``), the optimal token baselines' input; like the
        entropy it is reduced chunk by chunk, never holding more than one chunk's temporaries.
        """
        was_training = self.model.training
        set_training(self.model, False)
        stats: dict[str, list[torch.Tensor]] = defaultdict(list)
        micros, order = split_micro_batches(
            data, micro_batch_size, max_token_len, max_token_len_key
        )
        for micro in micros:
            logits = self.forward(self.model, micro.batch, temperature)
            stats["log_probs"].append(logprobs_from_logits(logits, micro.batch["responses"]))
            if with_entropy:
                stats["entropys"].append(entropy_from_logits(logits))
            if with_sum_pi_squared:
                stats["sum_pi_squared"].append(sum_pi_squared_from_logits(logits))
        set_training(self.model, was_training)
        return {key: restore_order(torch.cat(parts), order) for key, parts in stats.items()}

    def update_policy(
        self,
        data: DataProto,
        *,
        mini_batch_size: int,
        micro_batch_size: int,
        temperature: float,
        max_token_len: int | None = None,
        rollout_correction: Any = None,
    ) -> dict[str, float]:
        """Run ``ppo_epochs`` passes of mini-batch updates; return the averaged metrics.

        ``data`` carries ``advantages`` (bs, R), and ``old_log_probs`` (bs, R) unless the update
        is on-policy, and ``ref_log_prob`` (bs, R) when ``use_kl_loss``. Micro-batches hold
        ``micro_batch_size`` rows, or at most ``max_token_len`` tokens (``use_dynamic_bsz``).
        Every loss term is normalised over the mini-batch's tokens (or sequences) on all ranks
        (``batch_sizes.global_batch``), so the gradient is that of the mini-batch however it
        was split; ``actor/pg_loss``, ``actor/kl_loss`` and ``actor/entropy`` are the
        mini-batch's losses, the sums of their micro-batch shares.

        ``rollout_correction`` (``algorithm.rollout_correction``, given when it is on): a
        ``rollout_is_weights`` (bs, R) column multiplies the token losses; in bypass mode the loss
        is verl's bypass-mode loss against ``rollout_log_probs``; otherwise the current policy's
        ``rollout_corr/*`` off-policy metrics against ``rollout_log_probs`` are recorded. With
        the trainer's ``IS_IN_UPDATE`` flag and no ``old_log_probs``, each micro-batch's weights
        are taken from pi_old, its own forward before the step, and ``rollout_is_weights`` is
        added to ``data`` afterwards for the samples' records.
        """
        assert self.optimizer is not None, "update_policy needs an optimizer"
        cfg = loss_config = self.config
        bypass = rollout_correction is not None and rollout_correction.bypass_mode
        if bypass:  # verl's apply_bypass_mode: the bypass loss, which applies the correction
            policy_loss = replace(
                cfg.policy_loss, loss_mode="bypass_mode", rollout_correction=rollout_correction
            )
            loss_config = replace(cfg, policy_loss=policy_loss)
        policy_loss_fn = get_policy_loss_fn(loss_config.policy_loss.loss_mode)
        on_policy = "old_log_probs" not in data.batch
        if on_policy and not is_on_policy(cfg, len(data), mini_batch_size):
            raise ValueError(
                "old_log_probs are required unless ppo_epochs == 1 and the whole batch is one "
                "mini-batch"
            )
        # The trainer skipped the pi_old pass (``weights_in_update``): each micro-batch's IS
        # weights come from this update's own forward and are gathered, by each row's ``_ROW``
        # index, into ``weights_out`` (bs, R), which goes back in ``data``.
        weigh_here = bool(data.meta_info.get(IS_IN_UPDATE)) and rollout_correction is not None
        if weigh_here and not on_policy:
            raise ValueError(f"{IS_IN_UPDATE} is for an update without old_log_probs")
        weights_out = None
        if weigh_here:
            response_mask = data.batch["response_mask"]
            weights_out = torch.zeros(response_mask.shape, device=response_mask.device)
            data.batch[_ROW] = torch.arange(len(data), device=response_mask.device)
        set_training(self.model, True)
        metrics: dict[str, list[float]] = defaultdict(list)
        for epoch_data in epoch_batches(data, cfg):
            mini_batches = epoch_data.split(mini_batch_size)
            for mini in mini_batches:
                self.optimizer.zero_grad(set_to_none=True)
                micros, _ = split_micro_batches(
                    mini, micro_batch_size, max_token_len, PPO_MAX_TOKEN_LEN_KEY
                )
                counts = global_batch(
                    mini.batch["response_mask"],
                    loss_scale_factor=None,
                    norm_times_dp=cfg.seq_mean_token_sum_norm_times_dp,
                    sequence_parallel_size=self.sequence_parallel_size,
                )
                totals: dict[str, float] = defaultdict(float)
                for micro in micros:
                    batch = micro.batch
                    mask = batch["response_mask"]
                    logits = self.forward(self.model, batch, temperature)  # (b, R, V)
                    log_prob = logprobs_from_logits(logits, batch["responses"])  # (b, R)
                    old_log_prob = log_prob.detach() if on_policy else batch["old_log_probs"]
                    is_weights = batch.get("rollout_is_weights")
                    is_metrics: dict[str, float] = {}
                    if weights_out is not None and mask.any():
                        is_weights, _, is_metrics = compute_rollout_correction_and_rejection_mask(
                            old_log_prob,
                            batch["rollout_log_probs"],
                            mask,
                            **correction_settings(rollout_correction),
                        )
                        assert is_weights is not None  # weights_in_update: rollout_is is set
                        rows = batch[_ROW].to(weights_out.device)
                        weights_out[rows, : is_weights.shape[1]] = is_weights.to(weights_out)
                    inputs = PolicyLossInputs(
                        old_log_prob,
                        log_prob,
                        batch["advantages"],
                        mask,
                        cfg.loss_agg_mode,
                        is_weights,
                        counts,  # every loss term is normalised over the mini-batch
                    )
                    pg_loss, pg_metrics = policy_loss_fn(inputs, loss_config)
                    pg_metrics.update(is_metrics)
                    if rollout_correction is not None and not bypass and mask.any():
                        pg_metrics.update(
                            compute_rollout_corr_metrics_from_logprobs(
                                log_prob, batch["rollout_log_probs"], mask
                            )
                        )
                    loss = pg_loss
                    if cfg.entropy_coeff != 0:
                        entropy_loss = agg_loss(
                            entropy_from_logits(logits), mask, cfg.loss_agg_mode, counts
                        )
                        loss = loss - cfg.entropy_coeff * entropy_loss
                    else:
                        with torch.no_grad():
                            entropy_loss = agg_loss(
                                entropy_from_logits(logits), mask, cfg.loss_agg_mode, counts
                            )
                    if cfg.use_kl_loss:
                        kld = kl_penalty(log_prob, batch["ref_log_prob"], cfg.kl_loss_type)
                        kl_loss = agg_loss(kld, mask, cfg.loss_agg_mode, counts)
                        loss = loss + cfg.kl_loss_coef * kl_loss
                        totals["actor/kl_loss"] += kl_loss.item()
                    loss.backward()
                    totals["actor/pg_loss"] += pg_loss.item()
                    totals["actor/entropy"] += entropy_loss.item()
                    for key, value in pg_metrics.items():
                        metrics[key].append(float(value))
                # Each share carries the factor dp_size (FSDP averages gradients over ranks):
                # the worker group's mean over ranks of these sums is the mini-batch's loss.
                for key, value in totals.items():
                    metrics[key].append(value)
                if cfg.use_kl_loss:
                    metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
                grad_norm = optimizer_step(self.model, self.optimizer, cfg.grad_clip)
                metrics["actor/grad_norm"].append(grad_norm)
        if weights_out is not None:
            data.pop(batch_keys=[_ROW])
            data.batch["rollout_is_weights"] = weights_out
        return finish_update(self.optimizer, self.lr_scheduler, metrics, "actor")
