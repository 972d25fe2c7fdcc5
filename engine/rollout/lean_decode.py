"""One-token decode steps for Llama-family decoders (Qwen2, Llama) without per-call overhead.

In a rollout of short responses from a small model, most of a decode step's time goes around
the matrix products rather than into them: module calls, decorators, configuration lookups, the
attention-mask builder and the per-head repetition of grouped keys. :class:`LeanDecoder` runs
the same computation from the model's own weights with functional ops: RMSNorm, the q/k/v
projections (with their biases), the model's own rotary module (so rope scaling is honoured),
the KV cache's ``update``, grouped-query SDPA under the padding mask, the gated SiLU MLP, the
final norm and the LM head. The prefill keeps using the model's forward.

Only models whose forward is exactly this computation are accepted (:meth:`LeanDecoder.build`
returns None otherwise, and the caller decodes with the model's forward): a Qwen2 or Llama
causal LM in eval mode, SiLU MLP, no sliding window, no adapter wrapper, and no forward hooks
anywhere (a hook would expect to see every call; sharding wrappers and steering hooks are hooks). ``tests/engine/rollout`` holds the
decoder to the model's forward within float rounding.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """Return ``norm(x)`` for a Qwen2/Llama RMSNorm (computed in fp32, as the module does)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _has_hooks(model: torch.nn.Module) -> bool:
    """Return True when a forward hook (global or on any submodule) would see the model's calls."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanDecoder:
    """Decode one token per row for a supported model; see the module docstring."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.body = model.model
        self.layers = list(self.body.layers)
        config = model.config
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )

    @classmethod
    def build(cls, model: Any) -> LeanDecoder | None:
        """Return a decoder for ``model``, or None when its forward is not the one mirrored here."""
        if type(model).__name__ not in ARCHITECTURES or model.training or _has_hooks(model):
            return None
        config = model.config
        if getattr(config, "hidden_act", None) != "silu":
            return None
        if getattr(config, "use_sliding_window", False) or (
            type(model).__name__ == "LlamaForCausalLM" and getattr(config, "sliding_window", None)
        ):
            return None
        return cls(model)

    def __call__(
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
        cos, sin = self.body.rotary_emb(hidden, position_ids)  # (a, 1, D) each
        cos, sin = cos[:, None], sin[:, None]  # (a, 1, 1, D): broadcast over heads
        mask = attention_mask[:, None, None, :].bool()  # (a, 1, 1, L)
        a = input_ids.shape[0]
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = _rms_norm(hidden, layer.input_layernorm)
            q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(a, 1, -1, self.head_dim)
            k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(a, 1, -1, self.head_dim)
            v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(a, 1, -1, self.head_dim)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (a, h, 1, D)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = cache.update(k, v, index)  # (a, kv, L, D)
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=True
            )  # (a, h, 1, D)
            out = out.transpose(1, 2).reshape(a, 1, -1)
            hidden = hidden + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            x = _rms_norm(hidden, layer.post_attention_layernorm)
            mlp = layer.mlp
            gate = F.silu(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias))
            up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
            hidden = hidden + F.linear(gate * up, mlp.down_proj.weight, mlp.down_proj.bias)
        hidden = _rms_norm(hidden, self.body.norm)
        head = self.model.lm_head
        return F.linear(hidden[:, -1], head.weight, head.bias)  # (a, V)
