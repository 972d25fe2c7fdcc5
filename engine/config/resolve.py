"""Fill in what verl's YAML interpolates: ``${...}`` references, derived keys and legacy keys.

``${dotted.key}`` references in typed fields (a verl file's ``ppo_mini_batch_size:
${actor_rollout_ref.actor.ppo_mini_batch_size}``) are resolved while loading
(``_resolve_typed_references``), since an int field cannot hold them; in string fields they stay as
written until ``resolve_config``. ``${.sibling}`` and ``${oc.select:key,default}`` are read as
verl reads them.

``resolve_config`` plays the part of verl's YAML interpolations: fields left ``None`` take the
value verl would interpolate (critic batch sizes from the actor, rollout lengths from the data),
verl's deprecated global micro-batch sizes are divided into their per-GPU keys, verl 0.7's new
spellings (``optim.clip_grad``, ``lr_scheduler_type``, ``ray_kwargs``) fill the old ones, and
``${dotted.key}`` in string fields is substituted. Every run stores the resolved config.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from engine.config.algorithm import ratio_bound
from engine.config.fields import ConfigFieldError, Validation
from engine.config.introspect import get_value
from engine.config.keys import (
    _accepts_str,
    _fields,
    _is_section,
    _leaves,
    coerce,
    config_to_dict,
    matches_type,
)
from engine.config.reward_model import own_reward_pool
from engine.config.schema import PPOConfig
from engine.config.tree import deep_merge
from engine.config.yaml_io import yaml_load

_REFERENCE = re.compile(r"\$\{([^${}]*)\}")
# OmegaConf's marker of a value that must be given (``name: ???``): here, no value yet (null).
MISSING = "???"
_SELECT = "oc.select:"


@dataclasses.dataclass(frozen=True)
class Reference:
    """A ``${...}`` reference as verl's files write them, read relative to the key holding it.

    ``${a.b}`` names a key; ``${.b}`` a key of the same section (``..b``: the parent's);
    ``${oc.select:a.b,default}`` gives ``default`` where ``a.b`` is no key.
    """

    key: str
    has_default: bool = False
    default: Any = None

    @classmethod
    def parse(cls, text: str, holder: str) -> Reference:
        """Return the reference ``text`` (between the braces) held by the key ``holder``."""
        has_default, default = False, None
        if text.startswith(_SELECT):
            text, comma, raw = text[len(_SELECT) :].partition(",")
            has_default = bool(comma)
            default = (
                yaml_load(raw, f"the default of ${{{_SELECT}{text}}}") if raw.strip() else None
            )
        text = text.strip()
        dots = len(text) - len(text.lstrip("."))
        if dots:
            section = holder.split(".")[:-dots]
            text = ".".join([*section, text[dots:]])
        return cls(text, has_default, default)


def _resolve_typed_references(data: dict) -> dict:
    """Replace ``${key}`` values of non-string fields by the value that key holds."""
    merged = deep_merge(config_to_dict(PPOConfig()), data)

    def lookup(text: str, key: str, depth: int = 0) -> Any:
        reference = Reference.parse(text, key)
        node: Any = merged
        for part in reference.key.split("."):
            if not isinstance(node, dict) or part not in node:
                if reference.has_default:
                    return reference.default
                raise ConfigFieldError(
                    key, f"${{{text}}}", "refers to no config key; write ${dotted.key}"
                )
            node = node[part]
        match = _REFERENCE.fullmatch(node) if isinstance(node, str) else None
        if match and depth < 20:
            return lookup(match.group(1), reference.key, depth + 1)
        if match:
            raise ConfigFieldError(key, f"${{{text}}}", "circular ${...} reference")
        return None if node == MISSING else node

    def walk(cls: type, node: dict, prefix: str) -> dict:
        out = dict(node)
        for name, value in node.items():
            if name not in _fields(cls):
                continue
            tp, key = _fields(cls)[name][1], prefix + str(name)
            whole = _REFERENCE.fullmatch(value) if isinstance(value, str) else None
            if _is_section(tp) and whole:
                value = lookup(whole.group(1), key)  # a whole section
                if value is None:
                    del out[name]
                    continue
                out[name] = value
            if _is_section(tp) and isinstance(value, dict):
                out[name] = walk(tp, value, key + ".")
            elif value == MISSING and matches_type(None, tp):
                out[name] = None
            elif value == MISSING:
                raise ConfigFieldError(
                    key, value, "the file leaves this key to be given (???); set it"
                )
            elif isinstance(value, str) and not _accepts_str(tp):
                match = _REFERENCE.fullmatch(value)
                out[name] = lookup(match.group(1), key) if match else value
        return out

    return walk(PPOConfig, data, "")


def _interpolate(cfg: PPOConfig, key: str, text: str, depth: int = 0) -> Any:
    """Return ``text`` with its ``${...}`` references filled in from ``cfg``.

    A value that is one whole reference takes the referenced value as it is (null included);
    references inside a longer string become text, and a null there is an error.
    """

    def value_of(match: re.Match) -> Any:
        reference = Reference.parse(match.group(1), key)
        try:
            value = get_value(cfg, reference.key)
        except ConfigFieldError:
            if reference.has_default:
                return reference.default
            raise ConfigFieldError(key, text, f"${{{reference.key}}} names no config key") from None
        if isinstance(value, str) and "${" in value and depth < 20:
            return _interpolate(cfg, reference.key, value, depth + 1)
        if isinstance(value, str) and "${" in value:
            raise ConfigFieldError(key, text, "circular ${...} reference")
        return value

    whole = _REFERENCE.fullmatch(text)
    if whole:
        return value_of(whole)

    def substitute(match: re.Match) -> str:
        value = value_of(match)
        if value is None:
            name = Reference.parse(match.group(1), key).key
            raise ConfigFieldError(key, text, f"${{{name}}} is null; set {name}")
        return str(value)

    return _REFERENCE.sub(substitute, text)


def resolve_config(cfg: PPOConfig) -> PPOConfig:
    """Fill derived values in place the way verl's interpolations do, and return cfg.

    Calling it again changes nothing. Call it on the final config: a derived value does not
    follow later edits of its source.
    """
    for owner, f, key, tp, value in list(_leaves(cfg)):
        if isinstance(value, str) and "${" in value:
            # As the key's own value would be: ${trainer.seed} in a path key is the path "42".
            setattr(owner, f.name, coerce(_interpolate(cfg, key, value), tp, key))
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    actor, model = arr.actor, arr.model

    def inherit(obj: Any, name: str, value: Any) -> None:
        if getattr(obj, name) is None:
            setattr(obj, name, copy.deepcopy(value))

    inherit(model, "tokenizer_path", model.path)
    inherit(actor, "clip_ratio_low", actor.clip_ratio)
    inherit(actor, "clip_ratio_high", actor.clip_ratio)
    inherit(actor.checkpoint, "load_contents", actor.checkpoint.save_contents)
    inherit(arr.rollout, "prompt_length", cfg.data.max_prompt_length)
    inherit(arr.rollout, "response_length", cfg.data.max_response_length)
    for section in (arr.rollout, arr.ref):
        inherit(section, "log_prob_use_dynamic_bsz", actor.use_dynamic_bsz)
        inherit(section, "log_prob_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu)
    inherit(critic, "enable", cfg.algorithm.adv_estimator == "gae")
    _clamp_mini_batch(actor, cfg.data.train_batch_size)
    for name in ("strategy", "ppo_mini_batch_size", "ppo_epochs", "shuffle", "use_dynamic_bsz"):
        inherit(critic, name, getattr(actor, name))
    _clamp_mini_batch(critic, cfg.data.train_batch_size)
    inherit(critic.model, "path", model.path)
    inherit(critic.model, "tokenizer_path", model.tokenizer_path)
    inherit(critic.checkpoint, "load_contents", critic.checkpoint.save_contents)
    inherit(cfg.reward_model.model, "input_tokenizer", model.path)
    inherit(critic, "forward_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu)
    for prefix, section, legacy, per_gpu in _legacy_micro_batches(cfg):
        size, (ranks, _) = getattr(section, legacy), _legacy_ranks(cfg, prefix)
        if size is not None and getattr(section, per_gpu) in (None, size):
            # max: a reward pool of no ranks is reported by reward_pool_problems
            setattr(section, per_gpu, max(1, size // max(1, ranks)))
    inherit(critic, "forward_micro_batch_size_per_gpu", critic.ppo_micro_batch_size_per_gpu)
    for role in (actor, critic):  # verl 0.7's new spellings of grad_clip and warmup_style
        if role.grad_clip == 1.0:
            role.grad_clip = role.optim.clip_grad
        if role.optim.warmup_style in (None, "constant"):
            role.optim.warmup_style = role.optim.lr_scheduler_type
    rollout = arr.rollout  # verl 0.7's bucket key fills main's (legacy_key_problems warns)
    if rollout.update_weights_bucket_megabytes is not None:
        rollout.checkpoint_engine.update_weights_bucket_megabytes = (
            rollout.update_weights_bucket_megabytes
        )
    inherit(cfg.ray_init, "num_cpus", cfg.ray_kwargs.ray_init.num_cpus)
    inherit(cfg.data, "seed", cfg.trainer.seed)
    return cfg


def _clamp_mini_batch(section: Any, batch: Any) -> None:
    """Use the whole batch as the mini-batch when the mini-batch is larger (verl refuses)."""
    mini = section.ppo_mini_batch_size
    if isinstance(mini, int) and isinstance(batch, int) and 0 < batch < mini:
        section.ppo_mini_batch_size = batch


def mini_batch_warnings(cfg: PPOConfig, resolved: PPOConfig) -> list[str]:
    """Return a warning for each mini-batch that ``resolve_config`` cut to the whole batch."""
    roles: list[tuple[str, Any, Any]] = [
        ("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor, resolved.actor_rollout_ref.actor)
    ]
    if resolved.critic.enable:
        roles.append(("critic", cfg.critic, resolved.critic))
    return [
        f"{prefix}.ppo_mini_batch_size={before.ppo_mini_batch_size} is larger than "
        f"data.train_batch_size={after.ppo_mini_batch_size}: each step makes one update with "
        f"all {after.ppo_mini_batch_size} prompts; set {prefix}.ppo_mini_batch_size to choose"
        for prefix, before, after in roles
        if before.ppo_mini_batch_size not in (None, after.ppo_mini_batch_size)
    ]


def _legacy_micro_batches(cfg: PPOConfig) -> list[tuple[str, Any, str, str]]:
    """Return (section key, section, global key, per-GPU key) of verl's deprecated sizes."""
    arr = cfg.actor_rollout_ref
    per_gpu = "log_prob_micro_batch_size"
    return [
        (
            "actor_rollout_ref.actor",
            arr.actor,
            "ppo_micro_batch_size",
            "ppo_micro_batch_size_per_gpu",
        ),
        ("actor_rollout_ref.ref", arr.ref, per_gpu, f"{per_gpu}_per_gpu"),
        ("actor_rollout_ref.rollout", arr.rollout, per_gpu, f"{per_gpu}_per_gpu"),
        ("critic", cfg.critic, "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
        ("critic", cfg.critic, "forward_micro_batch_size", "forward_micro_batch_size_per_gpu"),
        ("reward_model", cfg.reward_model, "micro_batch_size", "micro_batch_size_per_gpu"),
    ]


def _legacy_ranks(cfg: PPOConfig, prefix: str) -> tuple[int, str]:
    """Return the ranks that share a section's deprecated global size, and what they are.

    As verl's workers divide it by their world size: the trainer's ranks, or for a reward model
    on a pool of its own (``RewardModelWorker`` on verl's ``reward_pool``) that pool's.
    """
    if prefix == "reward_model" and own_reward_pool(cfg):
        rm = cfg.reward_model
        return (
            rm.nnodes * rm.n_gpus_per_node,
            "ranks of the reward model's own pool (reward_model.nnodes x n_gpus_per_node)",
        )
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node, "data-parallel ranks"


def legacy_key_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of verl's deprecated global micro-batch sizes and of verl's two spellings
    of one setting set apart; warn about each deprecated size, divided as verl divides it."""
    original, errors = v.given, []
    for prefix, section, legacy, per_gpu in _legacy_micro_batches(original):
        size, given = getattr(section, legacy), getattr(section, per_gpu)
        ranks, what = _legacy_ranks(original, prefix)
        if size is None:
            continue
        if given is not None and given != size:
            errors.append(
                ConfigFieldError(
                    f"{prefix}.{legacy}",
                    size,
                    f"set both {prefix}.{legacy} and {prefix}.{per_gpu}; remove {legacy} "
                    f"(deprecated) and keep {per_gpu}",
                )
            )
        elif ranks < 1:
            continue  # a reward pool of no ranks: reported by reward_pool_problems
        elif size % ranks:
            errors.append(
                ConfigFieldError(
                    f"{prefix}.{legacy}",
                    size,
                    f"a global size that the {ranks} {what} cannot share; make it a multiple of "
                    f"{ranks}, or set {prefix}.{per_gpu}",
                )
            )
        else:
            v.warnings.append(
                f"[DEPRECATED] {prefix}.{legacy}={size} is a global size; it is divided by the "
                f"{ranks} {what} into {prefix}.{per_gpu}={max(1, size // ranks)}: set "
                f"{prefix}.{per_gpu} instead"
            )
    arr = original.actor_rollout_ref
    for prefix, role in (("actor_rollout_ref.actor", arr.actor), ("critic", original.critic)):
        pairs = (
            ("grad_clip", role.grad_clip, "optim.clip_grad", role.optim.clip_grad, 1.0),
            (
                "optim.warmup_style",
                role.optim.warmup_style,
                "optim.lr_scheduler_type",
                role.optim.lr_scheduler_type,
                "constant",
            ),
        )
        for old, old_value, new, new_value, default in pairs:
            if old_value not in (None, default) and new_value not in (old_value, default):
                errors.append(
                    ConfigFieldError(
                        f"{prefix}.{new}",
                        new_value,
                        f"disagrees with {prefix}.{old}={old_value!r}; the two name one setting, "
                        "set one of them",
                    )
                )
    errors += _moved_key_problems(v)
    ray_cpus, verl_cpus = original.ray_init.num_cpus, original.ray_kwargs.ray_init.num_cpus
    if None not in (ray_cpus, verl_cpus) and ray_cpus != verl_cpus:
        errors.append(
            ConfigFieldError(
                "ray_kwargs.ray_init.num_cpus",
                verl_cpus,
                f"disagrees with ray_init.num_cpus={ray_cpus}; set one of them",
            )
        )
    return errors


_BUCKET = "actor_rollout_ref.rollout.update_weights_bucket_megabytes"
_MAIN_BUCKET = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
_CORRECTION = "algorithm.rollout_correction"
# verl 0.7's rejection levels as main's k1 options (engine.algorithms.rollout_rejection).
_K1_OF_0_7 = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


def _moved_key_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the error of verl 0.7's and main's bucket keys set apart, and warn once about each
    key verl's main branch moved or removed that a config sets (it still works here)."""
    given, errors = v.given, []
    rollout = given.actor_rollout_ref.rollout
    legacy, main = rollout.update_weights_bucket_megabytes, rollout.checkpoint_engine
    default = type(main)().update_weights_bucket_megabytes
    if legacy is not None:
        if main.update_weights_bucket_megabytes not in (legacy, default):
            errors.append(
                ConfigFieldError(
                    _BUCKET,
                    legacy,
                    f"disagrees with {_MAIN_BUCKET}={main.update_weights_bucket_megabytes}; the "
                    "two name one setting, set one of them",
                )
            )
        else:
            v.warnings.append(
                f"[DEPRECATED] {_BUCKET}={legacy} is verl 0.7's spelling: verl main reads "
                f"{_MAIN_BUCKET}; set that instead"
            )
    rc = given.algorithm.rollout_correction
    option = _K1_OF_0_7.get(rc.rollout_rs or "")
    upper = ratio_bound(rc.rollout_rs_threshold)
    lower = rc.rollout_rs_threshold_lower or (1.0 / upper if upper else None)
    if option is not None and upper and lower and upper > 0 and lower > 0:  # bounds: their rules
        v.warnings.append(
            f"[DEPRECATED] {_CORRECTION}.rollout_rs={rc.rollout_rs} with ratio bounds "
            f"[{lower:g}, {upper:g}] is verl 0.7's spelling (verl main removed "
            f"rollout_rs_threshold_lower): verl main writes rollout_rs={option} "
            f"rollout_rs_threshold='{1 / upper:g}_{1 / lower:g}' (k1 is -log ratio)"
        )
    if rc.rollout_token_veto_threshold is not None:
        v.warnings.append(
            f"[DEPRECATED] {_CORRECTION}.rollout_token_veto_threshold is verl 0.7's; verl main "
            "removed it (it still applies here); main's nearest is rollout_rs=seq_max_k3"
        )
    return errors
