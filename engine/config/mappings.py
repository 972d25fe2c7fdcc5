"""What the config's free-form mappings may hold: one rule for every dict-valued key.

A mapping key (``actor_rollout_ref.model.override_config``, ``engine_kwargs.vllm``, reward
kwargs, ...) is handed on whole, to a model's config, an engine or a function, so the studio's
path rules (``resource`` metadata, ``webapp.experiments.configs``) cannot see inside it. Each one
has a rule here (``MAPPING_RULES``); a test walks the schema and fails on a dict key without one.
What every rule refuses:

- a value that is not plain data: numbers, strings, booleans, null, lists and mappings of them;
- a key that is an argument of a loader rather than data (``LOADER_ARGUMENTS``: ``subfolder``,
  ``offload_folder``, ``trust_remote_code``, ...), at any depth;
- a string that names a file (absolute, ``~``, ``./`` or with a ``..`` part, ``file://``) or
  code (``package.module.Name``, ``module:function``, a Hub ``repo--module.Class``).

``override_config`` sets model config attributes only, as verl's ``update_model_config`` does:
the loader reads the folder's config, changes those attributes and loads the weights with that
config (``engine.roles.model_loading``), so nothing reaches ``from_pretrained`` as an argument. A
key must be an attribute of the model's config: one of transformers' common ``PretrainedConfig``
attributes (``MODEL_CONFIG_ATTRIBUTES``), or a key of the folder's own ``config.json``, read at
validation when the folder can be read; attributes that name code, files or the weights' type
(``REFUSED_ATTRIBUTES``: ``auto_map``, ``architectures``, ``quantization_config``, ...) are
refused even when the folder's ``config.json`` has them. Override values may not name a file, a
Hub repository or code: any ``/`` or ``\\`` is refused there.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config.fields import ConfigFieldError, Validation
from engine.config.files import paths_of
from engine.rollout.names import VLLM_ENGINE_KWARGS, VLLM_MAPPED_ENGINE_KWARGS

# Arguments of transformers' and vLLM's loaders: they name files, code, servers or devices, or
# decide how weights are read, so no mapping passes them on.
LOADER_ARGUMENTS = {
    name: "an argument of the model loader, not a model config attribute"
    for name in (
        "adapter_kwargs",
        "adapter_name",
        "cache_dir",
        "code_revision",
        "config",
        "device_map",
        "distributed_config",
        "download_dir",
        "force_download",
        "from_flax",
        "from_tf",
        "gguf_file",
        "hf_overrides",
        "kernel_config",
        "key_mapping",
        "load_format",
        "local_files_only",
        "low_cpu_mem_usage",
        "max_memory",
        "mirror",
        "offload_buffers",
        "offload_folder",
        "offload_state_dict",
        "output_loading_info",
        "pretrained_model_name_or_path",
        "proxies",
        "resume_download",
        "revision",
        "state_dict",
        "subfolder",
        "token",
        "tokenizer_revision",
        "tp_plan",
        "tp_size",
        "trust_remote_code",
        "use_auth_token",
        "use_kernels",
        "use_safetensors",
        "variant",
        "weights_only",
    )
}
LOADER_FIX = "the engine loads models itself; leave it out"
# Config attributes a member may not set: they name code, files or classes, or decide how the
# weights are read and stored.
REFUSED_ATTRIBUTES = {
    "_name_or_path": "names the model's folder; set the role's model.path",
    "name_or_path": "names the model's folder; set the role's model.path",
    "auto_map": "names remote code to import; the engine loads no code from a config",
    "custom_pipelines": "names remote code to import; the engine loads no code from a config",
    "architectures": "names the model class (vLLM picks its implementation by it); keep the folder's",
    "model_type": "picks the model class; keep the folder's",
    "tokenizer_class": "names the tokenizer class; keep the folder's",
    "processor_class": "names a processor class; keep the folder's",
    "quantization_config": "loads a quantiser; quantise the model folder beforehand",
    "dtype": "the engine loads weights in float32 and casts them with fsdp_config.mixed_precision",
    "torch_dtype": "the engine loads weights in float32 and casts them with "
    "fsdp_config.mixed_precision",
    "transformers_version": "is written by transformers; leave it out",
    **{
        name: "sizes the weights, which come from the folder (another size would start layers "
        "from random weights or fail to load); keep the folder's"
        for name in (
            "head_dim",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_hidden_layers",
            "num_key_value_heads",
            "vocab_size",
        )
    },
}
# transformers' attention implementations an override may choose (a Hub kernel repository,
# which transformers would download and run, is not one).
ATTN_IMPLEMENTATIONS = (
    "eager",
    "sdpa",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
)
# Common attributes of transformers' configs (PretrainedConfig and the decoder families'): what
# verl's recipes override. A model's own attributes are read from its config.json.
MODEL_CONFIG_ATTRIBUTES = frozenset(
    {
        "activation_dropout",
        "attention_bias",
        "attention_dropout",
        "attention_probs_dropout_prob",
        "attn_implementation",
        "attn_pdrop",
        "bos_token_id",
        "classifier_dropout",
        "dropout",
        "embd_pdrop",
        "eos_token_id",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "hidden_act",
        "hidden_dropout",
        "hidden_dropout_prob",
        "initializer_range",
        "layer_norm_eps",
        "layer_types",
        "max_position_embeddings",
        "max_window_layers",
        "mlp_bias",
        "output_router_logits",
        "pad_token_id",
        "partial_rotary_factor",
        "resid_pdrop",
        "rms_norm_eps",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "router_aux_loss_coef",
        "sliding_window",
        "summary_first_dropout",
        "tie_word_embeddings",
        "use_cache",
        "use_sliding_window",
    }
)
CONFIG_JSON_LIMIT = 1 << 20  # bytes of a config.json read for its keys
_FILE = "names a file or folder"
_DATA_ONLY = (
    "this mapping holds data only (files and code have keys of their own, such as model.path "
    "or custom_reward_function.path)"
)
_PLAIN = "plain data (numbers, strings, booleans, null, lists and mappings of them)"
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")
_MODULE_ATTR = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_DRIVE = re.compile(r"[A-Za-z]:[\\/]")


def reference_problem(text: str, *, strict: bool = False) -> str | None:
    """Return what ``text`` names if it names a file or code (else None).

    ``strict`` (model config overrides, engine arguments) also refuses any ``/`` or ``\\``: a
    relative folder or a Hub repository (``org/name``) is a place too.
    """
    parts = re.split(r"[\\/]", text)
    if (
        text.startswith(("/", "~", "\\", "./"))
        or ".." in parts
        or _DRIVE.match(text)
        or text.lower().startswith("file:")
    ):
        return _FILE
    if _DOTTED.fullmatch(text) or _MODULE_ATTR.fullmatch(text) or ("--" in text and "." in text):
        return "names a Python module, class or function"
    if strict and len(parts) > 1:
        return "names a folder or a Hub repository"
    return None


def plain_data_problems(
    key: str, value: Any, *, strict: bool = False, files: bool = False
) -> list[ConfigFieldError]:
    """Return an error for each part of ``value`` (under ``key``) that is not plain data, is a
    loader argument or names a file or code; ``strict`` as ``reference_problem``; ``files``
    lets a file path through (the studio checks it as a path key: ``files_named``)."""
    return [
        ConfigFieldError(where, part, problem)
        for where, part, problem in _walk(key, value, strict)
        if not (files and problem.startswith(_FILE))
    ]


def files_named(key: str, value: Any) -> Iterator[tuple[str, str]]:
    """Yield (key, text) for every string in ``value`` that names a file or folder."""
    for where, part, problem in _walk(key, value, strict=False):
        if problem.startswith(_FILE):
            yield where, part


def _walk(key: str, value: Any, strict: bool, depth: int = 0) -> Iterator[tuple[str, Any, str]]:
    if depth > 16:
        yield key, "...", "is nested more than 16 levels deep; flatten it"
    elif value is None or isinstance(value, bool | int | float):
        return
    elif isinstance(value, str):
        problem = reference_problem(value, strict=strict)
        if problem:
            yield key, value, f"{problem}; {_DATA_ONLY}"
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _walk(f"{key}[{i}]", item, strict, depth + 1)
    elif isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                yield key, name, f"has a key that is not a string; use {_PLAIN}"
            elif name in LOADER_ARGUMENTS:
                yield f"{key}.{name}", item, f"{LOADER_ARGUMENTS[name]}; {LOADER_FIX}"
            else:
                yield from _walk(f"{key}.{name}", item, strict, depth + 1)
    else:
        yield key, type(value).__name__, f"is a {type(value).__name__}, not {_PLAIN}"


# --------------------------------------------------------------------------- model overrides


def config_json_keys(path: str | None) -> frozenset[str]:
    """Return the top-level keys of the ``config.json`` in the model folder ``path``.

    Empty for no path, a ``tiny://`` or remote one, and a folder without a readable, small JSON
    object there (the folder's own check reports that).
    """
    if not path or "://" in path:
        return frozenset()
    file = Path(path).expanduser() / "config.json"
    try:
        if not file.is_file() or file.stat().st_size > CONFIG_JSON_LIMIT:
            return frozenset()
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return frozenset()
    return (
        frozenset(k for k in data if isinstance(k, str)) if isinstance(data, dict) else frozenset()
    )


def _refused_names(value: Any) -> Iterator[str]:
    """Yield the refused attribute names at any depth of ``value`` (a nested text_config too)."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name in REFUSED_ATTRIBUTES:
                yield name
            yield from _refused_names(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refused_names(item)


def model_override_problems(
    key: str, overrides: Any, attributes: frozenset[str] | set[str] = frozenset()
) -> list[ConfigFieldError]:
    """Return the errors of a model's ``override_config`` (at ``key``).

    ``attributes`` are the model's own config attributes (its ``config.json`` keys, or the
    loaded config's) accepted beside ``MODEL_CONFIG_ATTRIBUTES``. The engine's loader asks here
    too, with the loaded config's attributes, before it applies anything.
    """
    if not isinstance(overrides, dict):
        return [ConfigFieldError(key, overrides, "must be a mapping of config attributes")]
    errors = []
    for name, value in overrides.items():
        where = f"{key}.{name}"
        if name in LOADER_ARGUMENTS:
            errors.append(ConfigFieldError(where, value, f"{LOADER_ARGUMENTS[name]}; {LOADER_FIX}"))
        elif name in REFUSED_ATTRIBUTES or (isinstance(name, str) and name.startswith("_")):
            why = REFUSED_ATTRIBUTES.get(name, "is transformers' own; leave it out")
            errors.append(
                ConfigFieldError(where, value, f"not a config attribute to change: {why}")
            )
        elif name not in MODEL_CONFIG_ATTRIBUTES and name not in attributes:
            errors.append(
                ConfigFieldError(
                    where,
                    value,
                    "not a config attribute of this model (neither a common transformers "
                    "config attribute nor a key of the folder's config.json); override_config "
                    "changes model config attributes only, such as attention_dropout or "
                    "rope_parameters",
                )
            )
        elif name == "attn_implementation" and value not in ATTN_IMPLEMENTATIONS:
            errors.append(
                ConfigFieldError(where, value, f"must be one of {', '.join(ATTN_IMPLEMENTATIONS)}")
            )
        else:
            errors += plain_data_problems(where, value, strict=True)
            errors += [
                ConfigFieldError(where, value, f"sets {nested}: {REFUSED_ATTRIBUTES[nested]}")
                for nested in sorted(set(_refused_names(value)))
            ]
    return errors


# ------------------------------------------------------------------------ engine arguments


def vllm_engine_kwargs_problems(kwargs: dict[str, Any]) -> list[ConfigFieldError]:
    """Return an error for each ``engine_kwargs.vllm`` key the vLLM rollout does not pass on,
    and for each value that is not a number, string or boolean or names a file or code.

    The validator and the adapters (``engine.rollout.vllm_args``) both ask here, so the CLI, the
    studio and a direct ``VLLMRollout`` agree on what a config may hand vLLM.
    """
    problems = []
    for key, value in kwargs.items():
        if key in VLLM_ENGINE_KWARGS:
            if isinstance(value, str) and reference_problem(value, strict=True):
                why = f"{reference_problem(value, strict=True)}; vLLM's sizes and switches never do"
            elif value is not None and not isinstance(value, bool | int | float | str):
                why = "must be a number, a string or a boolean"
            else:
                continue
            problems.append(
                ConfigFieldError(f"actor_rollout_ref.rollout.engine_kwargs.vllm.{key}", value, why)
            )
            continue
        if key in VLLM_MAPPED_ENGINE_KWARGS:
            why = f"is set from {VLLM_MAPPED_ENGINE_KWARGS[key]}; set that key instead"
        else:
            why = (
                "is not passed to vLLM: engine_kwargs.vllm takes only "
                f"{', '.join(VLLM_ENGINE_KWARGS)} (vLLM's other arguments name files, code "
                "or servers, or are set from the rollout keys)"
            )
        problems.append(
            ConfigFieldError(f"actor_rollout_ref.rollout.engine_kwargs.vllm.{key}", value, why)
        )
    return problems


# ----------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class MappingRule:
    """How one dict-valued key is checked: ``check(v, key, value)`` returns its errors;
    ``holds`` says what it may hold, for docs/security.md; ``files`` that a value may name a
    file (a reward function's own ``log_path``), which the studio checks as it checks a path
    key (``webapp.experiments.configs``)."""

    check: Callable[[Validation, str, Any], list[ConfigFieldError]]
    holds: str
    files: bool = False  # a file path passes here; the studio checks it as a path key


def _model_path(v: Validation, key: str) -> str | None:
    cfg = v.cfg
    if key.startswith("critic."):
        return cfg.critic.model.path or cfg.actor_rollout_ref.model.path
    if key.startswith("reward_model."):
        return cfg.reward_model.model.path
    return cfg.actor_rollout_ref.model.path


def _model_override(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    return model_override_problems(key, value, config_json_keys(_model_path(v, key)))


def _engine_kwargs(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    if key.endswith(".vllm"):
        return vllm_engine_kwargs_problems(value)
    return plain_data_problems(key, value, strict=True)


def _strict(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    return plain_data_problems(key, value, strict=True)


def _data(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    return plain_data_problems(key, value)


def _function_kwargs(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    return plain_data_problems(key, value, files=True)


def _chat_template_kwargs(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    errors = [
        ConfigFieldError(
            f"{key}.{name}",
            item,
            "is an argument of apply_chat_template, which the engine sets; this mapping holds "
            "the template's own variables (e.g. enable_thinking)",
        )
        for name, item in value.items()
        if name in CHAT_TEMPLATE_ARGUMENTS
    ]
    return errors + plain_data_problems(key, value)


def _column_map(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    return []  # data_problems names an unknown target; sources are column names (str, by type)


def _per_file(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    """A mapping by data file: each file one that data.train_files or data.val_files names (the
    studio checks those as paths), each entry plain data naming no file or code."""
    data = v.cfg.data
    named = set(paths_of(data.train_files)) | set(paths_of(data.val_files))
    errors = [
        ConfigFieldError(
            key,
            file,
            "names a file that neither data.train_files nor data.val_files lists; an entry is "
            "only for a file the run reads",
        )
        for file in value
        if file not in named
    ]
    for file, entry in value.items():
        if file in named:
            errors += plain_data_problems(f"{key}.{file}", entry, strict=True)
    return errors


def _read_by_nothing(v: Validation, key: str, value: Any) -> list[ConfigFieldError]:
    return []


# apply_chat_template's own parameters: data.apply_chat_template_kwargs may not set them.
CHAT_TEMPLATE_ARGUMENTS = (
    "add_generation_prompt",
    "chat_template",
    "continue_final_message",
    "conversation",
    "documents",
    "max_length",
    "padding",
    "processor_kwargs",
    "return_assistant_tokens_mask",
    "return_dict",
    "return_tensors",
    "tokenize",
    "tokenizer_kwargs",
    "tools",
    "truncation",
)
_OVERRIDE = MappingRule(
    _model_override,
    "model config attributes only (common transformers attributes or keys of the folder's "
    "config.json; none naming code, files or the weights' type), values plain data with no path",
)
# Keys of machinery this engine does not run (refused, or no effect): checked all the same, so
# that a later engine reading one inherits a rule.
_UNREAD_STRICT = MappingRule(
    _strict, "nothing read here; plain data naming no file, Hub repo or code"
)
_UNREAD = MappingRule(_data, "nothing read here; plain data naming no file or code")
_KWARGS = (
    "plain data handed to a function: no loader argument, no module reference; a file path only "
    "where the member may read (the studio checks it as a path key)"
)
# Every dict-valued key of the schema and its rule; ``[]`` stands for each item of a list.
MAPPING_RULES: dict[str, MappingRule] = {
    "actor_rollout_ref.model.override_config": _OVERRIDE,
    "critic.model.override_config": _OVERRIDE,
    "reward_model.model.override_config": _OVERRIDE,
    "actor_rollout_ref.rollout.engine_kwargs.vllm": MappingRule(
        _engine_kwargs,
        "the engine sizes and switches engine.rollout.names.VLLM_ENGINE_KWARGS lists, each a "
        "number, string or boolean naming no file or code",
    ),
    "actor_rollout_ref.rollout.engine_kwargs.sglang": MappingRule(
        _engine_kwargs, "nothing (refused); plain data naming no file, Hub repo or code"
    ),
    "actor_rollout_ref.actor.optim.override_optimizer_config": _UNREAD_STRICT,
    "critic.optim.override_optimizer_config": _UNREAD_STRICT,
    "reward_model.rollout.engine_kwargs": _UNREAD_STRICT,
    "data.data_key_map": MappingRule(
        _column_map, "column names: a known target (prompt, ground_truth, ...) to a source column"
    ),
    "data.file_key_maps": MappingRule(
        _per_file,
        "for a file data.train_files or data.val_files names, its column map (as data_key_map)",
    ),
    "data.file_data_sources": MappingRule(
        _per_file,
        "for a file data.train_files or data.val_files names, the data_source of its rows",
    ),
    "actor_rollout_ref.rollout.engine_kwargs.trtllm": _UNREAD_STRICT,
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs": _UNREAD_STRICT,
    "data.apply_chat_template_kwargs": MappingRule(
        _chat_template_kwargs,
        "the chat template's variables (rendered in transformers' sandboxed Jinja): plain data, "
        "no apply_chat_template argument, no file path, no module reference",
    ),
    "reward_model.reward_kwargs": MappingRule(
        _function_kwargs,
        f"the reward manager's keys (engine.config.reward_kwargs), {_KWARGS}",
        files=True,
    ),
    "custom_reward_function.reward_kwargs": MappingRule(_function_kwargs, _KWARGS, files=True),
    "reward_model.judge.verdicts": MappingRule(
        _strict, "verdict words to scores (checked by the judge's parser); plain data"
    ),
    "reward.components[].kwargs": MappingRule(_function_kwargs, _KWARGS, files=True),
    "global_profiler.global_tool_config.nsys.controller_nsight_options": _UNREAD,
    "global_profiler.global_tool_config.nsys.worker_nsight_options": _UNREAD,
    "global_profiler.global_tool_config.torch_memory.kw_args": _UNREAD,
    "extras": MappingRule(
        _read_by_nothing, "unknown +keys, kept to show and never read by the engine"
    ),
}


def mapping_values(cfg: Any, key: str) -> Iterator[tuple[str, Any]]:
    """Yield (concrete key, value) for a ``MAPPING_RULES`` key, one per list item for ``[]``."""
    head, sep, tail = key.partition("[].")
    obj = cfg
    for part in head.split("."):
        obj = getattr(obj, part)
    if not sep:
        yield key, obj
        return
    for i, item in enumerate(obj or []):
        value = item
        for part in tail.split("."):
            value = getattr(value, part)
        yield f"{head}[{i}].{tail}", value


def mapping_problems(
    v: Validation, skip: set[str] | frozenset[str] = frozenset()
) -> list[ConfigFieldError]:
    """Return the errors of every dict-valued key, each by its rule in ``MAPPING_RULES``.

    Keys in ``skip`` are left out: the validator has refused them already (a value over the size
    limits, which may share its parts, is never walked whole).
    """
    errors = []
    for key, rule in MAPPING_RULES.items():
        for where, value in mapping_values(v.cfg, key):
            if value and where not in skip:
                errors += rule.check(v, where, value)
    return errors
