"""A LoRA policy's checkpoint: fold the adapter into the base weights, or write it as PEFT does.

The checkpoint holds PEFT's state dict (``base_model.model.<name>.base_layer.weight`` beside
``<name>.lora_A.default.weight`` and ``lora_B``) and the settings the trainer records with it
(``engine.lora.adapter_settings``: ``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``, ``exclude_modules``). :func:`fold_lora` turns it into a plain model,
``W + (alpha / r) B A`` (Hu et al. 2021).

:func:`write_adapter` writes the adapter alone with every setting training used, so
``PeftModel.from_pretrained(base, folder)`` rebuilds the trained policy: the recorded ones
(``exclude_modules`` as the run was given it) and the ones ``engine.lora.apply_lora``
always uses (dropout 0, bias ``none``, ``CAUSAL_LM``). An older checkpoint that does not record
``exclude_modules`` still shows which modules were left out: those ``target_modules`` selects
that hold no adapter tensors. They are written by full name, since PEFT would otherwise add a
zero adapter to each and warn that its weights are missing. The config is then checked to adapt
exactly the checkpoint's modules.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.model_merger.errors import MergeError

if TYPE_CHECKING:
    from peft import LoraConfig

PEFT_PREFIX = "base_model.model."
# What engine.lora.apply_lora passes to LoraConfig besides the recorded settings.
TRAINER_SETTINGS: dict[str, Any] = {
    "lora_dropout": 0.0,
    "bias": "none",
    "task_type": "CAUSAL_LM",
    "use_rslora": False,
}


def lora_settings(state: dict[str, Any], state_file: Path) -> dict[str, Any] | None:
    """Return the adapter settings when the state is a LoRA policy's, else None."""
    ranks = state.get("ranks")
    first = ranks[0] if ranks else state
    keys = first.get("model") or {}
    if not any(".lora_A." in k for k in keys):
        return None
    settings = first.get("lora")
    if not settings:
        raise MergeError(
            f"{state_file} holds a LoRA adapter but not its settings (r, lora_alpha): it was "
            "written before checkpoints kept them; save a new checkpoint with this trainer "
            "(resume the run for one step) and merge that"
        )
    return dict(settings)


def full_shape(name: str, plain: dict[str, torch.Size], lora: dict[str, Any] | None) -> torch.Size:
    """Return the full shape of checkpoint tensor ``name`` (a PEFT name under LoRA).

    ``plain`` holds the plain model's shapes; ``lora_A`` is ``(r, in)`` and ``lora_B``
    ``(out, r)`` of the weight they adapt. ``[-1]`` marks a name the model does not have.
    """
    if lora is None:
        return plain.get(name, torch.Size([-1]))
    r = int(lora["r"])
    module = name.removeprefix(PEFT_PREFIX)
    for part, shape in ((".lora_A.", lambda w: (r, w[1])), (".lora_B.", lambda w: (w[0], r))):
        if part in module:
            weight = plain.get(module.split(part)[0] + ".weight")
            return torch.Size(shape(weight)) if weight is not None else torch.Size([-1])
    return plain.get(module.replace(".base_layer.", "."), torch.Size([-1]))


def fold_lora(
    state_dict: dict[str, torch.Tensor], settings: dict[str, Any], state_file: Path
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Return ``(plain weights with W + scale B A, the adapter's tensors)`` from a PEFT state.

    ``scale`` is ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA), as PEFT computes it.
    The adapter's tensors keep PEFT's saved names (without the adapter name ``.default``).
    """
    unsupported = [k for k in state_dict if "lora_embedding" in k or "lora_magnitude" in k]
    if unsupported:
        raise MergeError(
            f"{state_file} has LoRA tensors this merger does not fold ({unsupported[:3]}): only "
            "LoRA on linear layers is supported (the trainer's target_modules)"
        )
    r, alpha = int(settings["r"]), float(settings["lora_alpha"])
    scale = alpha / (r**0.5) if settings.get("use_rslora") else alpha / r
    merged: dict[str, torch.Tensor] = {}
    adapter: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if ".lora_A." in key or ".lora_B." in key:
            adapter[key.replace(".default.", ".")] = tensor
            continue
        merged[key.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")] = tensor
    for key in [k for k in state_dict if ".lora_A." in k]:
        module = key.split(".lora_A.")[0]
        lora_a, lora_b = state_dict[key], state_dict[key.replace(".lora_A.", ".lora_B.")]
        name = module.removeprefix(PEFT_PREFIX) + ".weight"
        weight = merged[name]
        delta = (lora_b.double() @ lora_a.double()) * scale  # (out, r) @ (r, in)
        merged[name] = (weight.double() + delta).to(weight.dtype)
    return merged, adapter


def adapted_modules(adapter: dict[str, torch.Tensor]) -> set[str]:
    """Return the plain names of the modules ``adapter`` holds LoRA tensors for."""
    return {k.split(".lora_A.")[0].removeprefix(PEFT_PREFIX) for k in adapter if ".lora_A." in k}


def selected_modules(config: LoraConfig, skeleton: torch.nn.Module) -> set[str]:
    """Return the modules PEFT adapts when it applies ``config`` to ``skeleton`` (unchanged)."""
    from peft import inject_adapter_in_model
    from peft.tuners.lora import LoraLayer

    model = inject_adapter_in_model(config, copy.deepcopy(skeleton), low_cpu_mem_usage=True)
    return {name for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def adapter_config(
    settings: dict[str, Any], adapter: dict[str, torch.Tensor], skeleton: torch.nn.Module
) -> LoraConfig:
    """Return the ``LoraConfig`` training used, checked to adapt exactly ``adapter``'s modules.

    ``skeleton`` is the plain model (on the meta device is enough). See the module docstring
    for where each setting comes from.
    """
    import peft
    from peft import LoraConfig

    known = LoraConfig.__dataclass_fields__
    options = {**TRAINER_SETTINGS, **{k: v for k, v in settings.items() if k in known}}
    alpha = float(options["lora_alpha"])
    options["lora_alpha"] = int(alpha) if alpha.is_integer() else alpha  # apply_lora's int
    targets = options["target_modules"]
    options["target_modules"] = targets if isinstance(targets, str) else list(targets)
    trained = adapted_modules(adapter)
    if options.get("exclude_modules") is None:
        left_out = selected_modules(LoraConfig(**options), skeleton) - trained
        if left_out:
            if "exclude_modules" not in known:
                raise MergeError(
                    f"--save-lora-adapter: the run left {len(left_out)} of the target_modules "
                    f"without an adapter (actor_rollout_ref.model.exclude_modules), which needs "
                    f"peft>=0.14 to write (installed: {peft.__version__}); upgrade peft"
                )
            options["exclude_modules"] = sorted(left_out)
    config = LoraConfig(**options)
    selected = selected_modules(config, skeleton)
    if selected != trained:
        missing, extra = sorted(trained - selected), sorted(selected - trained)
        raise MergeError(
            f"--save-lora-adapter: target_modules={options['target_modules']!r} with "
            f"exclude_modules={options.get('exclude_modules')!r} (the checkpoint's LoRA "
            f"settings) select other modules than the checkpoint holds adapters for (trained, "
            f"not selected: {missing[:5]}; selected, not trained: {extra[:5]}); the settings "
            "do not belong to these weights, so merge without --save-lora-adapter"
        )
    return config


def write_adapter(
    folder: Path, config: LoraConfig, adapter: dict[str, torch.Tensor], base_model: str | None
) -> Path:
    """Write ``adapter`` with its ``LoraConfig`` (:func:`adapter_config`) as PEFT saves an
    adapter, so ``PeftModel.from_pretrained(base, folder)`` loads it; return ``folder``.

    ``base_model`` goes to the config's ``base_model_name_or_path``.
    """
    from safetensors.torch import save_file

    config.base_model_name_or_path = base_model
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(folder))
    tensors = {k: v.contiguous() for k, v in adapter.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder
