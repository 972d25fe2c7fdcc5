"""Loading the policy, reference, critic, reward model and tokenizer from a config (paths or live
objects)."""

from __future__ import annotations

import copy
import importlib
import os
from typing import TYPE_CHECKING, Any, NamedTuple, overload

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PretrainedConfig,
)

from engine.config.fields import ConfigValidationError
from engine.config.mappings import model_override_problems
from engine.lora import apply_lora, is_lora, load_lora_adapter
from engine.rewards.reward_model import RewardModelScorer
from engine.tools.tiny_uris import TINY_PREFIX, resolve_tiny_uri

if TYPE_CHECKING:
    from engine.config import CriticConfig, ModelConfig, PPOConfig


@overload
def resolve_path(path: str) -> str: ...
@overload
def resolve_path(path: None) -> None: ...
@overload
def resolve_path(path: str | None) -> str | None: ...
def resolve_path(path: str | None) -> str | None:
    """Return a local path: ``tiny://`` assets (``engine.tools.tiny_uris``) are built on demand,
    ``~`` is expanded."""
    if path is None:
        return None
    if path.startswith(TINY_PREFIX):
        return resolve_tiny_uri(path)
    return os.path.expanduser(path)


def resolve_device(device: str) -> torch.device:
    """Return the torch device for ``trainer.device`` (auto: cuda when one is visible)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "trainer.device=cuda but no CUDA GPU is visible; use trainer.device=cpu "
            "(or auto) on this machine"
        )
    return torch.device(device)


def _check_model_dir(path: str, key: str) -> None:
    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"{key}={path!r} is not a Hugging Face model folder (no config.json); point it at a "
            "local folder saved with save_pretrained, or use tiny://model"
        )


def model_config_of(path: str, model_config: Any, key: str, **attributes: Any) -> PretrainedConfig:
    """Return the config of the model folder ``path`` with ``override_config`` applied.

    As verl's ``update_model_config``: the overrides set config attributes, then the weights load
    with that config, so no override reaches ``from_pretrained`` as an argument (a ``subfolder``
    or ``offload_folder`` there would name another folder). The overrides are checked first,
    against the loaded config's attributes (``engine.config.mappings``), and a mapping value is
    merged into the attribute's own (``rope_parameters``). ``rope_theta`` is written into
    ``rope_parameters`` where the config keeps it there (transformers 5 reads it only there).
    ``attributes`` are the engine's own (the critic's ``num_labels``).
    """
    trust = bool(getattr(model_config, "trust_remote_code", False))
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
    values = config.to_dict()
    overrides = dict(getattr(model_config, "override_config", None) or {})
    problems = model_override_problems(key, overrides, frozenset(values))
    if problems:
        raise ConfigValidationError(problems)
    for name, value in overrides.items():
        own = values.get(name)
        values[name] = (
            {**own, **value} if isinstance(own, dict) and isinstance(value, dict) else value
        )
    if "rope_theta" in overrides and isinstance(values.get("rope_parameters"), dict):
        values["rope_parameters"] = {
            **values["rope_parameters"],
            "rope_theta": overrides["rope_theta"],
        }
    if "num_labels" in attributes:
        values.pop("id2label", None), values.pop("label2id", None)
    return type(config).from_dict({**values, **attributes})


def changed_config_attributes(path: str, model_config: Any, key: str) -> dict[str, Any]:
    """Return the attributes of ``path``'s config that ``override_config`` changes, as
    :func:`model_config_of` leaves them (a ``rope_theta`` inside ``rope_parameters``, a mapping
    merged whole), for an engine that builds the model itself (vLLM's ``hf_overrides``)."""
    if not getattr(model_config, "override_config", None):
        return {}
    trust = bool(getattr(model_config, "trust_remote_code", False))
    folder = AutoConfig.from_pretrained(path, trust_remote_code=trust).to_dict()
    changed = model_config_of(path, model_config, key).to_dict()
    return {name: value for name, value in changed.items() if folder.get(name) != value}


def import_external_lib(name: str | None, key: str) -> None:
    """Import the module ``name`` (``<role>.model.external_lib``) so a custom model registers.

    As verl's workers do, before the model is loaded; a module that fails to import is an error
    naming ``key``.
    """
    if not name:
        return
    try:
        importlib.import_module(name)
    except Exception as exc:
        raise ImportError(
            f"{key}={name!r} could not be imported ({type(exc).__name__}: {exc}); install the "
            f"module in the run's Python environment (or put it on PYTHONPATH), or leave {key} "
            "unset"
        ) from exc


def load_tokenizer(model_config: ModelConfig, *, path: str | None = None) -> Any:
    """Return the live tokenizer from the config, or load it from ``path`` (default:
    tokenizer_path, else the model path).

    ``custom_chat_template`` replaces the tokenizer's chat template, as verl's workers do, so
    every prompt (dataset, multi-turn rollout) is rendered with it.
    """
    tokenizer = None if path else getattr(model_config, "tokenizer", None)
    if tokenizer is None:
        path = resolve_path(
            path or getattr(model_config, "tokenizer_path", None) or model_config.path
        )
        tokenizer = AutoTokenizer.from_pretrained(
            path, trust_remote_code=getattr(model_config, "trust_remote_code", False)
        )
    template = getattr(model_config, "custom_chat_template", None)
    if template:
        tokenizer.chat_template = template
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(model_config: ModelConfig, device: torch.device) -> torch.nn.Module:
    """Return the policy model: the live ``hf_model`` if given, else loaded from ``path``.

    With ``lora_adapter_path`` it comes wrapped with that saved adapter, trainable; else with
    ``lora_rank > 0`` with a new PEFT LoRA adapter (see ``engine.lora``), as verl builds it.
    """
    model = getattr(model_config, "hf_model", None)
    if model is None:
        key = "actor_rollout_ref.model.external_lib"
        import_external_lib(getattr(model_config, "external_lib", None), key)
        if model_config.path is None:
            raise ValueError(
                "actor_rollout_ref.model.path is not set; point it at a Hugging Face model folder "
                "(tiny://model: the embedded one), or pass a loaded model as model.hf_model"
            )
        path = resolve_path(model_config.path)
        _check_model_dir(path, "actor_rollout_ref.model.path")
        model = AutoModelForCausalLM.from_pretrained(
            path,
            config=model_config_of(path, model_config, "actor_rollout_ref.model.override_config"),
            dtype=torch.float32,
            trust_remote_code=getattr(model_config, "trust_remote_code", False),
        )
    # transformers wraps PreTrainedModel.to with functools.wraps, whose typeshed stub does not
    # bind self, so mypy reads the device as the model.
    model.to(device)  # type: ignore[arg-type]
    if getattr(model_config, "enable_gradient_checkpointing", False):
        model.gradient_checkpointing_enable()
    model.config.use_cache = True
    adapter_path = getattr(model_config, "lora_adapter_path", None)
    if adapter_path and not is_lora(model):
        model = load_lora_adapter(model, resolve_path(adapter_path))
    elif getattr(model_config, "lora_rank", 0) > 0 and not is_lora(model):
        model = apply_lora(model, model_config)
    return model


def policy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Return a detached CPU copy of ``model``'s parameters and buffers."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


class PolicySkeleton(NamedTuple):
    """What the worker builds its copy of the policy from, before any weights reach it."""

    model_config: Any  # the Hugging Face ``PretrainedConfig``
    generation_config: Any  # ``GenerationConfig`` or None
    dtype: torch.dtype


def policy_skeleton(model: torch.nn.Module) -> PolicySkeleton:
    """Return ``model``'s skeleton: its config, generation config and parameter dtype."""
    return PolicySkeleton(
        model.config, getattr(model, "generation_config", None), next(model.parameters()).dtype
    )


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """Return a frozen deep copy (the reference policy)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def load_critic(
    critic_config: CriticConfig, actor_model_config: ModelConfig, device: torch.device
) -> Any:
    """Return a one-label token-classification model on the critic's (or actor's) backbone."""
    path = getattr(critic_config.model, "path", None) or actor_model_config.path
    if path is None:
        raise ValueError(
            "the critic needs a model: set critic.model.path when the policy is passed in as "
            "a live object"
        )
    import_external_lib(
        getattr(critic_config.model, "external_lib", None), "critic.model.external_lib"
    )
    path = resolve_path(path)
    _check_model_dir(path, "critic.model.path")
    config = model_config_of(
        path, critic_config.model, "critic.model.override_config", num_labels=1
    )
    model = AutoModelForTokenClassification.from_pretrained(
        path,
        config=config,
        dtype=torch.float32,
        trust_remote_code=getattr(critic_config.model, "trust_remote_code", False),
    )
    return model.to(device)


def load_reward_model(
    config: PPOConfig, device: str | torch.device = "cpu", *, offload: bool = False
) -> RewardModelScorer:
    """Return the scorer ``config.reward_model`` describes, on ``device`` (with ``offload``, in
    CPU memory between scorings: the single-process trainer's ``param_offload``).

    ``micro_batch_size_per_gpu`` samples go through each forward (null with verl's reward loop,
    ``use_reward_loop``: ``reward_model.rollout.max_num_seqs``, its server's sequences per step;
    ``resolve_config`` has
    divided verl's deprecated global ``micro_batch_size`` by the ranks that score: the
    reward model's own pool with ``enable_resource_pool``, else the trainer's);
    ``max_length`` defaults to the prompt and response budget, as verl's reward model worker
    reads ``max_prompt_length + max_response_length`` when it is unset.
    """
    rm, data = config.reward_model, config.data
    path = resolve_path(rm.model.path)
    if path is None:
        raise ValueError(
            "reward_model.model.path is not set; point it at a one-label sequence classifier "
            "folder (tiny://reward_model: the embedded one)"
        )
    micro_batch = rm.micro_batch_size_per_gpu or rm.rollout.max_num_seqs
    if not micro_batch:
        raise ValueError(
            "reward_model.micro_batch_size_per_gpu is not set; set the samples each forward "
            "scores (or verl's deprecated reward_model.micro_batch_size)"
        )
    return RewardModelScorer(
        path,
        micro_batch_size=micro_batch,
        device=str(device),
        max_length=rm.max_length or data.max_prompt_length + data.max_response_length,
        trust_remote_code=rm.model.trust_remote_code,
        offload=offload,
    )
