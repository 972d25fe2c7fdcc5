"""Llama-family decoders (Qwen2, Llama) run from their own weights, without per-call overhead.

On a small model most of a call's time goes around the matrix products rather than into them:
module calls, decorators, configuration lookups, the attention-mask builder, the per-head
repetition of grouped keys, and in training the autograd nodes all of these leave behind.
:class:`LlamaForward` runs the same computation with functional ops on the model's own parameters
(no copies, so gradients reach them): RMSNorm, the q/k/v projections (with their biases), the
model's own rotary module (so rope scaling is honoured), grouped-query SDPA under a boolean
mask the caller builds, the gated SiLU MLP, the final norm and the LM head. It serves two
callers:

* :meth:`LlamaForward.decode` takes one token per row against a transformers ``DynamicCache``
  (the rollout's decode loop, whose prefill is a :meth:`LlamaForward.forward` that keeps its keys
  and values for the cache);
* :meth:`LlamaForward.forward` runs many tokens per row, optionally on top of per-layer keys and
  values computed earlier (a shared prompt), under autograd when the model trains (the actor's
  log-prob and update passes, ``engine.roles.actor.response_logits``).

Only models whose forward is exactly this computation are accepted (:meth:`LlamaForward.build`
returns None otherwise, and callers use the model's forward): a Qwen2 or Llama causal LM with a
SiLU MLP, no sliding window, no attention dropout while training, no gradient checkpointing, no
adapter wrapper, and no forward hooks anywhere (a hook expects to see every call; sharding
wrappers such as FSDP2 and steering hooks are hooks). ``tests/engine/test_llama_forward.py`` holds both
entry points to the model's forward: logits, caches, samples and gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")

# Per-layer keys and values (b, kv_heads, S, head_dim), in layer order.
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
# attend(q (b, h, T, D), k (b, kv, S, D), v (b, kv, S, D), scale) -> (b, h, T, D)
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """Return ``norm(x)`` for a Qwen2/Llama RMSNorm (computed in fp32, as the module does)."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        # One fused op (and one autograd node) for the same arithmetic.
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def has_hooks(model: torch.nn.Module) -> bool:
    """Return True when a forward hook (global or on any submodule) would see the model's calls."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def checkpointing(model: torch.nn.Module) -> bool:
    """Return True when the model recomputes activations (gradient checkpointing) in training."""
    if not model.training:
        return False
    flag = getattr(model, "is_activation_checkpointing", None)  # a walk over every module
    if flag is None:
        flag = getattr(model, "is_gradient_checkpointing", False)
    return bool(flag)


def causal_mask(key_mask: torch.Tensor) -> torch.Tensor:
    """Return the attention mask (b, 1, L, L) of a left-padded batch with ``key_mask`` (b, L).

    Each position sees the real tokens up to itself; a padding position also sees itself, so
    that no row of the softmax is empty (an empty row is NaN, and NaN survives the zero
    gradient the loss gives padding).
    """
    length = key_mask.shape[-1]
    lower = torch.ones(length, length, dtype=torch.bool, device=key_mask.device).tril()
    diagonal = torch.eye(length, dtype=torch.bool, device=key_mask.device)
    return (lower & key_mask.bool()[:, None, None, :]) | diagonal


class LlamaForward:
    """A supported causal LM's forward through functional ops; see the module docstring."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.body = model.model
        self.layers = list(self.body.layers)
        config = model.config
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )

    @classmethod
    def build(cls, model: Any) -> LlamaForward | None:
        """Return a lean runner for ``model``, or None when its forward is not the one here."""
        if type(model).__name__ not in ARCHITECTURES or has_hooks(model):
            return None
        config = model.config
        if getattr(config, "hidden_act", None) != "silu":
            return None
        if getattr(config, "use_sliding_window", False) or (
            type(model).__name__ == "LlamaForCausalLM" and getattr(config, "sliding_window", None)
        ):
            return None
        if model.training and (getattr(config, "attention_dropout", 0.0) or checkpointing(model)):
            return None  # dropout draws and activation recomputation are the module's own
        return cls(model)

    # -- the shared layer stack ----------------------------------------------------------------
    def _layers(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        keys_values: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        attend: Attention | None = None,
    ) -> torch.Tensor:
        """Run every decoder layer on ``hidden`` (b, T, H) and return the final-normed states.

        ``mask`` (b, 1, T, S) says which of the S keys each query sees; ``keys_values(index, k,
        v)`` turns this call's keys and values (b, kv, T, D) into the S the layer attends to.
        ``attend(q, k, v, scale)``, when given, replaces the masked SDPA (packed sequences,
        ``engine.roles.packing``).
        """
        b, t = hidden.shape[:2]
        cos, sin = self.body.rotary_emb(hidden, position_ids)  # (b, T, D) each
        cos, sin = cos[:, None], sin[:, None]  # (b, 1, T, D): broadcast over heads
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = _rms_norm(hidden, layer.input_layernorm)
            q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(b, t, -1, self.head_dim)
            k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(b, t, -1, self.head_dim)
            v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(b, t, -1, self.head_dim)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (b, h, T, D)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = keys_values(index, k, v)  # (b, kv, S, D)
            if attend is None:
                out = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=True
                )  # (b, h, T, D)
            else:
                out = attend(q, keys, values, attn.scaling)  # (b, h, T, D)
            out = out.transpose(1, 2).reshape(b, t, -1)
            hidden = hidden + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            x = _rms_norm(hidden, layer.post_attention_layernorm)
            mlp = layer.mlp
            gate = F.silu(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias))
            up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
            hidden = hidden + F.linear(gate * up, mlp.down_proj.weight, mlp.down_proj.bias)
        return _rms_norm(hidden, self.body.norm)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return the LM head's logits for final-normed ``hidden`` (..., H) -> (..., V)."""
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias)

    # -- entry points ----------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        past: LayerKV | None = None,
        keep_kv: bool = False,
        attend: Attention | None = None,
    ) -> tuple[torch.Tensor, LayerKV]:
        """Return the final-normed hidden states (b, T, H) of ``input_ids`` (b, T).

        ``mask`` (b, 1, T, P + T) covers the ``past`` keys (P per row; none without ``past``)
        then this call's T tokens; ``attend`` replaces the masked attention (``mask`` None).
        With ``keep_kv`` the second value holds this call's own per-layer keys and values (not
        the past ones), ready to be ``past`` of a later call; they stay in the autograd graph.
        """
        kept: LayerKV = []

        def keys_values(
            index: int, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if keep_kv:
                kept.append((k, v))
            if past is None:
                return k, v
            past_k, past_v = past[index]
            return torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)

        hidden = self.body.embed_tokens(input_ids)  # (b, T, H)
        return self._layers(hidden, position_ids, mask, keys_values, attend), kept

    def decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        """Return the next-token logits (a, V) for one new token per row (a, 1).

        ``attention_mask`` (a, L) covers the cached tokens and the new one; ``position_ids``
        (a, 1) is each row's position; ``cache`` grows by one token in every layer.
        """
        hidden = self.body.embed_tokens(input_ids)  # (a, 1, H)
        mask = attention_mask[:, None, None, :].bool()  # (a, 1, 1, L)

        def keys_values(
            index: int, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return cache.update(k, v, index)  # (a, kv, L, D)

        hidden = self._layers(hidden, position_ids, mask, keys_values)
        return self.logits(hidden[:, -1])  # (a, V)
