"""LoRA policies with PEFT: train a low-rank adapter, use the frozen base as the reference.

``actor_rollout_ref.model.lora_rank > 0`` wraps the policy with a PEFT LoRA adapter (Hu et al.
2021, "LoRA: Low-Rank Adaptation of Large Language Models"): ``W x + (alpha / r) B A x`` on the
``target_modules`` (``"all-linear"``: every linear layer but the output head), ``B`` starting at
zero so the adapted policy starts as the base model. Only ``A`` and ``B`` train.

``actor_rollout_ref.model.lora_adapter_path`` starts from a saved adapter instead
(:func:`load_lora_adapter`, a folder written by ``PeftModel.save_pretrained`` or by
:func:`export_lora` with ``merge=False``): its own rank, alpha and target modules apply, and it
trains on, as verl's ``PeftModel.from_pretrained(..., is_trainable=True)``.

The reference policy is then the same module with the adapter switched off
(:func:`adapter_disabled`), as in verl: no second copy of the base weights.

For the rollout engine and for export the adapter is merged *functionally*:
:func:`merged_state_dict` returns the base model's parameter names with ``W + delta W`` computed
from each LoRA layer, without touching the live module (merging in place and unmerging after
would drift the base weights by rounding at every sync). :func:`export_lora` writes either that
merged model as a plain Hugging Face folder or the adapter alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from engine.config import ModelConfig

PEFT_MISSING = "LoRA needs peft: pip install peft (actor_rollout_ref.model.lora_rank > 0)"


def is_lora(model: torch.nn.Module) -> bool:
    """Return True when ``model`` is a PEFT model (it carries an adapter)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def apply_lora(model: torch.nn.Module, model_config: ModelConfig) -> torch.nn.Module:
    """Return ``model`` wrapped with a LoRA adapter from ``lora_rank`` / ``lora_alpha`` /
    ``target_modules`` / ``exclude_modules``; only the adapter's parameters require grad.

    ``exclude_modules`` goes to PEFT as verl passes it: a string is a regular expression matched
    against the whole module name, a list names modules exactly or by their last parts.
    """
    try:
        import peft
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError(PEFT_MISSING) from exc
    excluded: dict[str, Any] = {}
    exclude = getattr(model_config, "exclude_modules", None)
    if exclude:
        if "exclude_modules" not in LoraConfig.__dataclass_fields__:
            raise ImportError(
                f"actor_rollout_ref.model.exclude_modules needs peft>=0.14 (installed: "
                f"{peft.__version__}); upgrade peft or leave exclude_modules unset"
            )
        excluded["exclude_modules"] = exclude if isinstance(exclude, str) else list(exclude)
    rank = int(model_config.lora_rank)
    if rank <= 0:
        raise ValueError(f"actor_rollout_ref.model.lora_rank must be > 0 for LoRA, got {rank}")
    targets = model_config.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    lora_config = LoraConfig(
        r=rank,
        lora_alpha=int(model_config.lora_alpha),
        target_modules=targets if isinstance(targets, str) else list(targets),
        **excluded,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = get_peft_model(model, lora_config)
    except ValueError as exc:
        raise ValueError(
            f"actor_rollout_ref.model.target_modules={model_config.target_modules!r}"
            + (f" less exclude_modules={exclude!r}" if exclude else "")
            + f" does not match the model's layers ({exc}); use 'all-linear' or names such as "
            "[q_proj, k_proj, v_proj, o_proj]"
        ) from exc
    return _with_input_grads(model, peft_model)


def load_lora_adapter(model: torch.nn.Module, adapter_path: str) -> torch.nn.Module:
    """Return ``model`` wrapped with the saved LoRA adapter at ``adapter_path``, trainable (only
    its parameters require grad); its ``adapter_config.json`` decides rank, alpha and targets.

    Raises ValueError naming ``actor_rollout_ref.model.lora_adapter_path`` when the folder holds
    no adapter or one that does not fit the model.
    """
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise ImportError(PEFT_MISSING.replace("lora_rank > 0", "lora_adapter_path")) from exc
    key = "actor_rollout_ref.model.lora_adapter_path"
    if not (Path(adapter_path) / "adapter_config.json").is_file():
        raise ValueError(
            f"{key}={adapter_path!r} holds no adapter_config.json; point it at a folder saved by "
            "PeftModel.save_pretrained (or python -m engine.model_merger --save-lora-adapter)"
        )
    try:
        peft_model = PeftModel.from_pretrained(model, adapter_path, is_trainable=True)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise ValueError(
            f"{key}={adapter_path!r} does not fit actor_rollout_ref.model.path ({exc}); use an "
            "adapter trained on that base model"
        ) from exc
    return _with_input_grads(model, peft_model)


def _with_input_grads(model: torch.nn.Module, peft_model: Any) -> Any:
    """Return ``peft_model``, its inputs made to require grad where ``model`` checkpoints its
    blocks: the embeddings are frozen, so checkpointed blocks would see inputs without grad."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers before the rename
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing:
        peft_model.enable_input_require_grads()
    return peft_model


def adapter_settings(model: Any) -> dict[str, Any] | None:
    """Return the active adapter's ``r``, ``lora_alpha``, ``target_modules``, ``use_rslora``
    and ``exclude_modules`` as plain values, or None for a model without LoRA.

    Checkpoints keep them beside the weights, so ``engine.model_merger`` can fold the adapter
    into the base weights (the scale ``alpha / r`` is not recoverable from the tensors).
    """
    if not is_lora(model):
        return None
    config = model.peft_config[model.active_adapter]
    targets = config.target_modules
    return {
        "r": int(config.r),
        "lora_alpha": float(config.lora_alpha),
        "target_modules": _plain_modules(targets),
        "use_rslora": bool(config.use_rslora),
        "exclude_modules": _plain_modules(config.exclude_modules),
    }


def _plain_modules(modules: Any) -> str | list[str] | None:
    """Return PEFT's module selector (a regex string, a set of names, or None) as plain values."""
    if modules is None or isinstance(modules, str):
        return modules
    return sorted(modules)


@contextmanager
def adapter_disabled(model: Any) -> Iterator[Any]:
    """Run the block with the adapter off, so ``model`` computes the base (reference) policy."""
    if not is_lora(model):
        raise TypeError("adapter_disabled needs a PEFT model (actor_rollout_ref.model.lora_rank>0)")
    with model.disable_adapter():
        yield model


def _is_adapter_key(key: str) -> bool:
    return any(part.startswith("lora_") for part in key.split("."))


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Return the base model's state dict with the active adapter merged in (model unchanged).

    Keys are the base model's own (``model.layers.0.self_attn.q_proj.weight``), so the result
    loads into the plain architecture or a rollout engine. Unadapted tensors are shared, not
    copied; adapted weights are new tensors ``W + delta W``.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or module.merged or module.disable_adapters:
            continue
        prefix = f"{name}.base_layer." if name else "base_layer."
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                delta = module.get_delta_weight(adapter)  # type: ignore[attr-defined]
                deltas[prefix + "weight"] = deltas.get(prefix + "weight", 0) + delta
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        if _is_adapter_key(key):
            continue
        value = tensor + deltas[key].to(tensor.dtype) if key in deltas else tensor
        merged[key.replace(".base_layer.", ".")] = value.detach()
    return merged


def export_lora(
    model: Any, directory: str | Path, *, merge: bool = True, tokenizer: Any = None
) -> Path:
    """Save the policy: merged into a full Hugging Face folder, or (``merge=False``) the adapter
    only (``adapter_config.json`` + weights, loadable with ``PeftModel.from_pretrained``)."""
    directory = Path(directory)
    if merge:
        base = model.get_base_model()
        base.save_pretrained(directory, state_dict=merged_state_dict(model))
    else:
        model.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory
