"""FSDP2 for the policy, reference and critic: sharding, precision, offload, state dicts.

``fully_shard`` is applied to every decoder layer and then to the root, as verl's FSDP2 workers
do: each layer's parameters are all-gathered just before the layer runs and freed after, so the
peak is one layer's full weights plus the shards. (FSDP1, the ``FullyShardedDataParallel``
wrapper, is not used: FSDP2's per-parameter ``DTensor`` shards keep parameter names unchanged
and work on CPU with gloo.)

Precision: on a GPU the default keeps fp32 master weights and runs forward/backward in bf16 with
fp32 gradient reduction (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``); on a
CPU everything stays fp32. Offload: ``param_offload`` is torch's ``CPUOffloadPolicy``
(parameters, gradients and the optimizer step on the CPU); ``optimizer_offload`` alone moves the
optimizer state to the CPU between updates. Neither exists without an accelerator, so on a CPU
they are refused with an error that says so.

State: the full state dict is gathered (to rank 0, on the CPU) for export; checkpoints keep each
rank's own shards (``sharded_state_dict``), so saving never materialises the whole model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from engine.config.actor import FSDPConfig
    from engine.config.reward_model import RewardModelFSDPConfig

PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Return the transformer blocks of a Hugging Face model (its ``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(model).__name__}: it declares no "
            "_no_split_modules; FSDP2 needs a Hugging Face transformer (Qwen2, Llama, ...)"
        )
    return layers


def mixed_precision_policy(setting: str, device_type: str) -> MixedPrecisionPolicy:
    """Return the policy for ``fsdp_config.mixed_precision`` (auto: bf16 on GPU, fp32 on CPU)."""
    if setting == "auto":
        setting = "bf16" if device_type == "cuda" else "fp32"
    if setting not in PRECISIONS:
        raise ValueError(
            f"fsdp_config.mixed_precision={setting!r} is not one of auto, {', '.join(PRECISIONS)}"
        )
    if setting == "fp32":
        return MixedPrecisionPolicy()
    if device_type != "cuda":
        raise ValueError(
            f"fsdp_config.mixed_precision={setting} needs a CUDA device; on a CPU use "
            "fsdp_config.mixed_precision=fp32 (or auto)"
        )
    return MixedPrecisionPolicy(param_dtype=PRECISIONS[setting], reduce_dtype=torch.float32)


def check_offload(
    fsdp_config: FSDPConfig | RewardModelFSDPConfig, device_type: str, section: str
) -> None:
    """Raise ValueError when offload is asked for where torch cannot offload (a CPU device)."""
    if device_type == "cuda":
        return
    asked = [k for k in ("param_offload", "optimizer_offload") if getattr(fsdp_config, k, False)]
    if asked:
        keys = ", ".join(f"{section}.fsdp_config.{k}=True" for k in asked)
        raise ValueError(
            f"{keys}: offload is unavailable on a CPU device (it moves weights and optimizer "
            f"state from an accelerator to the CPU, and they are already there); set "
            f"{' and '.join(f'{section}.fsdp_config.{k}=False' for k in asked)}, or run with "
            "trainer.device=cuda"
        )


def shards_anything(
    fsdp_config: FSDPConfig | RewardModelFSDPConfig, device_type: str, world_size: int
) -> bool:
    """Return False when FSDP2 would change nothing: one rank, full precision, no offload.

    A one-rank mesh holds every parameter whole, so wrapping would only add an all-gather copy
    and hooks around every layer call; the rank then trains the plain module, as the
    single-process trainer does. Mixed precision and offload still need FSDP2 on one rank.
    """
    if world_size > 1 or getattr(fsdp_config, "param_offload", False):
        return True
    setting = getattr(fsdp_config, "mixed_precision", "auto")
    return mixed_precision_policy(setting, device_type).param_dtype is not None


def apply_fsdp2(
    model: nn.Module,
    mesh: DeviceMesh,
    fsdp_config: FSDPConfig | RewardModelFSDPConfig,
    device_type: str,
    section: str,
) -> nn.Module:
    """Shard ``model`` in place with ``fully_shard`` on each decoder layer, then the root."""
    check_offload(fsdp_config, device_type, section)
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": mixed_precision_policy(
            getattr(fsdp_config, "mixed_precision", "auto"), device_type
        ),
    }
    if getattr(fsdp_config, "param_offload", False):
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    # The root too: left unsharded after a no-grad forward (log-probs, no backward follows), its
    # embeddings would stay gathered and state dicts would see full tensors instead of shards.
    kwargs["reshard_after_forward"] = bool(getattr(fsdp_config, "reshard_after_forward", True))
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    settle_gradient_dtypes(model)
    return model


def settle_gradient_dtypes(model: nn.Module) -> None:
    """Fix each FSDP2 group's gradient dtypes now, from the parameters that require grad.

    FSDP2 sets a group's original and reduce dtypes at the root's first forward (its lazy init),
    from the parameters that require grad at that moment; a group with none gets neither, so a
    gradient reaching it later is reduced and assigned in the compute dtype. PEFT's
    ``disable_adapter()`` clears ``requires_grad`` on the adapter while it is off, so a LoRA
    policy whose first forward was the reference pass (adapter off) left every group without
    dtypes, and its first bf16 backward assigned bf16 gradients to the fp32 master weights
    ("a gradient with dtype BFloat16 to a tensor with grad_dtype Float"). Initialising here,
    where ``requires_grad`` says exactly what trains, makes it independent of which pass runs
    first. (FSDP2 has no public call for this; its own first forward would make the same one.)
    """
    cast(FSDPModule, model)._get_fsdp_state()._lazy_init()


def reshard_all(model: nn.Module) -> None:
    """Register every FSDP module's sharded parameters again (after a forward that kept them)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def full_tensor(param: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Return the whole tensor behind a (possibly sharded) parameter; a collective call."""
    if not isinstance(param, DTensor):
        return param.detach()
    local = param.to_local()
    if local.device != device:  # CPU-offloaded shards: gather on the accelerator
        param = DTensor.from_local(
            local.to(device),
            param.device_mesh,
            param.placements,
            shape=param.shape,
            stride=param.stride(),
            run_check=False,
        )
    return param.full_tensor().detach()


@torch.no_grad()
def copy_full_weights(sharded: nn.Module, target: nn.Module, device: torch.device) -> None:
    """Copy every parameter of the sharded module into an unsharded twin, one at a time.

    Every rank calls this together (each parameter is all-gathered). Going parameter by
    parameter keeps the extra memory to one full tensor, the bucket size of the weight sync.
    """
    reshard_all(sharded)
    target_params = dict(target.named_parameters())
    for name, param in sharded.named_parameters():
        if name not in target_params:
            raise KeyError(f"the rollout model has no parameter {name!r}; it must mirror the actor")
        target_params[name].copy_(full_tensor(param, device))


def gather_full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Return the full state dict on rank 0 (CPU tensors) and an empty dict elsewhere."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))


def _local(value: Any) -> Any:
    """Return a CPU copy of this rank's part of ``value`` (never a view of live weights)."""
    if isinstance(value, DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    return value


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def sharded_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Return this rank's shards of the weights and optimizer state, as plain CPU tensors."""
    reshard_all(model)
    return {
        "model": {name: _local(p) for name, p in model.named_parameters()},
        "optimizer": _local(optimizer.state_dict()) if optimizer is not None else None,
    }


def _as_shard_of(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Return ``value`` (this rank's shard) as a DTensor laid out like ``param``."""
    if not isinstance(param, DTensor):
        return value.to(param.device)
    local = param.to_local()
    return DTensor.from_local(
        value.to(device=local.device, dtype=local.dtype),
        param.device_mesh,
        param.placements,
        shape=param.shape,
        stride=param.stride(),
        run_check=False,
    )


@torch.no_grad()
def load_sharded_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any]
) -> None:
    """Restore a :func:`sharded_state_dict` written by the same rank of a same-sized group."""
    reshard_all(model)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(state["model"]))
    if missing:
        raise KeyError(f"the sharded checkpoint lacks parameters {missing[:5]}")
    for name, param in params.items():
        local = param.to_local() if isinstance(param, DTensor) else param
        saved = state["model"][name]
        if saved.shape != local.shape:
            raise ValueError(
                f"checkpoint shard of {name!r} has shape {tuple(saved.shape)} but this rank holds "
                f"{tuple(local.shape)}; resume with the same trainer.nnodes x "
                "trainer.n_gpus_per_node and fsdp_size the checkpoint was saved with"
            )
        local.copy_(saved)
    if optimizer is None or not state.get("optimizer"):
        return
    saved_optim = state["optimizer"]
    by_index = dict(enumerate(_optimizer_params(optimizer)))
    restored = {}
    for index, entry in saved_optim["state"].items():
        owner = by_index[int(index)]
        shard_shape = owner.to_local().shape if isinstance(owner, DTensor) else owner.shape
        restored[index] = {
            # Per-parameter moments (exp_avg, exp_avg_sq) are shards; ``step`` is a scalar.
            k: _as_shard_of(v, owner)
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == shard_shape
            else v
            for k, v in entry.items()
        }
    optimizer.load_state_dict({"state": restored, "param_groups": saved_optim["param_groups"]})


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move the optimizer's state tensors to ``device`` (CPU to offload, GPU before a step)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
