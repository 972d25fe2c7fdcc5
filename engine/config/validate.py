"""Check a PPOConfig before anything heavy runs, and fill in its derived values.

``validate_config`` collects every problem instead of stopping at the first, so the web form can
mark each field and the CLI can print them all; each error names the key, the value and the fix.
The batch checks follow verl's (``RayPPOTrainer._validate_config`` and the FSDP workers): batch
sizes count prompts, a mini-batch times ``rollout.n`` is split evenly over the workers, and each
worker's share must be a multiple of its micro-batch. What only the running machine can tell (is
a GPU visible?) is checked when the run starts. A rule the trainers also check as they start (the
reward model's own pool, the keys the single-process trainer cannot honour) is a public function
here that they call, so the form, the CLI and the trainer give the same error.

``resolve_config`` plays the part of verl's YAML interpolations: fields left ``None`` take the
value verl would interpolate (critic batch sizes from the actor, rollout lengths from the data)
and ``${dotted.key}`` in string fields is substituted. Every run stores the resolved config.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.algorithms.names import TOKEN_BASELINE_ESTIMATORS
from engine.config.introspect import get_value
from engine.config.loader import (
    _REFERENCE,
    MAX_YAML_ITEMS,
    MAX_YAML_STRING,
    Reference,
    _fields,
    _is_runtime,
    _is_section,
    matches_type,
    type_error,
)
from engine.config.schema import (
    DATA_KEY_MAP_TARGETS,
    GROUP_ESTIMATORS,
    HONOURED,
    MAX_BATCH,
    NO_EFFECT,
    REFUSED,
    ConfigFieldError,
    ConfigValidationError,
    Limit,
    PPOConfig,
)
from engine.config.trackers import tracker_install_problems
from engine.config.tree import get_in
from engine.rewards.overlong import reward_kwargs_problems
from engine.rollout import SGLANG_MISSING
from engine.rollout.vllm_args import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    VLLM_MISSING,
    engine_kwargs_problems,
)
from engine.tools.tiny_uris import TINY_PREFIX, TINY_URIS

_REMOTE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_ARR = "actor_rollout_ref"
MAX_INT64 = 2**63 - 1  # what torch and numpy hold: a seed or a rank count beyond it fails at start
MAX_VALUES = 100_000  # strings and numbers in one field's value (override_config, reward kwargs)


class _Report:
    """Errors and warnings collected by the checks."""

    def __init__(self, cfg: PPOConfig) -> None:
        self.cfg = cfg
        self.errors: list[ConfigFieldError] = []
        self.warnings: list[str] = []

    def error(self, key: str, message: str, value: Any = ...) -> None:
        value = get_value(self.cfg, key) if value is ... else value
        self.errors.append(ConfigFieldError(key, value, message))


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[Any, dataclasses.Field, str, Any, Any]]:
    """Yield (owner, field, key, annotation, value) for every leaf, list items of sections too."""
    for name, (f, tp) in _fields(obj.__class__).items():
        if _is_runtime(f):
            continue
        key, value = prefix + name, getattr(obj, name)
        if _is_section(tp) and isinstance(value, tp):
            yield from _leaves(value, key + ".")
            continue
        yield obj, f, key, tp, value
        if isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    yield from _leaves(item, f"{key}[{i}].")


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


def _clamp_mini_batch(section: Any, batch: Any) -> None:
    """Use the whole batch as the mini-batch when the mini-batch is larger (verl refuses)."""
    mini = section.ppo_mini_batch_size
    if isinstance(mini, int) and isinstance(batch, int) and 0 < batch < mini:
        section.ppo_mini_batch_size = batch


def _mini_batch_warnings(cfg: PPOConfig, resolved: PPOConfig) -> list[str]:
    roles: list[tuple[str, Any, Any]] = [
        (f"{_ARR}.actor", cfg.actor_rollout_ref.actor, resolved.actor_rollout_ref.actor)
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


def resolve_config(cfg: PPOConfig) -> PPOConfig:
    """Fill derived values in place the way verl's interpolations do, and return cfg.

    Calling it again changes nothing. Call it on the final config: a derived value does not
    follow later edits of its source.
    """
    for owner, f, key, _, value in list(_leaves(cfg)):
        if isinstance(value, str) and "${" in value:
            setattr(owner, f.name, _interpolate(cfg, key, value))
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
    inherit(cfg.ray_init, "num_cpus", cfg.ray_kwargs.ray_init.num_cpus)
    inherit(cfg.data, "seed", cfg.trainer.seed)
    return cfg


def _legacy_micro_batches(cfg: PPOConfig) -> list[tuple[str, Any, str, str]]:
    """Return (section key, section, global key, per-GPU key) of verl's deprecated sizes."""
    arr = cfg.actor_rollout_ref
    per_gpu = "log_prob_micro_batch_size"
    return [
        (f"{_ARR}.actor", arr.actor, "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
        (f"{_ARR}.ref", arr.ref, per_gpu, f"{per_gpu}_per_gpu"),
        (f"{_ARR}.rollout", arr.rollout, per_gpu, f"{per_gpu}_per_gpu"),
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


def _check_legacy_keys(report: _Report, original: PPOConfig) -> None:
    """Check verl's deprecated global micro-batch sizes and its two spellings of some keys."""
    for prefix, section, legacy, per_gpu in _legacy_micro_batches(original):
        size, given = getattr(section, legacy), getattr(section, per_gpu)
        ranks, what = _legacy_ranks(original, prefix)
        if size is None:
            continue
        if given is not None and given != size:
            report.error(
                f"{prefix}.{legacy}",
                f"set both {prefix}.{legacy} and {prefix}.{per_gpu}; remove {legacy} "
                f"(deprecated) and keep {per_gpu}",
                size,
            )
        elif ranks < 1:
            continue  # a reward pool of no ranks: reported by reward_pool_problems
        elif size % ranks:
            report.error(
                f"{prefix}.{legacy}",
                f"a global size that the {ranks} {what} cannot share; make it a multiple of "
                f"{ranks}, or set {prefix}.{per_gpu}",
                size,
            )
        else:
            report.warnings.append(
                f"[DEPRECATED] {prefix}.{legacy}={size} is a global size; it is divided by the "
                f"{ranks} {what} into {prefix}.{per_gpu}={max(1, size // ranks)}: set "
                f"{prefix}.{per_gpu} instead"
            )
    arr = original.actor_rollout_ref
    for prefix, role in ((f"{_ARR}.actor", arr.actor), ("critic", original.critic)):
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
                report.error(
                    f"{prefix}.{new}",
                    f"disagrees with {prefix}.{old}={old_value!r}; the two name one setting, "
                    "set one of them",
                    new_value,
                )
    ray_cpus, verl_cpus = original.ray_init.num_cpus, original.ray_kwargs.ray_init.num_cpus
    if None not in (ray_cpus, verl_cpus) and ray_cpus != verl_cpus:
        report.error(
            "ray_kwargs.ray_init.num_cpus",
            f"disagrees with ray_init.num_cpus={ray_cpus}; set one of them",
            verl_cpus,
        )


def _check_effects(report: _Report) -> None:
    """Refuse a refused key set off its default; warn once about every no-effect key set."""
    inert: list[str] = []
    defaults = PPOConfig()
    for _, f, key, _, value in _leaves(report.cfg):
        effect, follows = f.metadata.get("effect", HONOURED), f.metadata.get("follows")
        if follows:
            expected = get_value(report.cfg, follows)
            as_default = value is None or value == expected
        elif "[" in key or f.metadata.get("extras"):  # reward.components items, +key extras
            continue
        else:
            expected = get_value(defaults, key)
            as_default = value == expected
        if as_default:
            continue
        if effect == REFUSED:
            report.error(key, f"not supported here: {f.metadata['why']}", value)
        elif effect == NO_EFFECT:
            inert.append(f"{key}={_shown(value)!r}")
        elif follows:
            report.error(
                key, f"must equal {follows} ({expected!r}) or be left out; set {follows}", value
            )
    if inert:
        report.warnings.append(
            "no effect here (settings of machinery this engine does not run, see "
            f"docs/config.md): {', '.join(inert)}"
        )


def _clone(obj: Any) -> Any:
    """Copy a config section by section; runtime objects (a loaded model) are shared, not copied."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: _clone(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not _is_runtime(f)
        }
        return dataclasses.replace(obj, **changes)
    return copy.deepcopy(obj) if isinstance(obj, list | dict) else obj


def _check_choices(report: _Report) -> None:
    for _, f, key, _, value in _leaves(report.cfg):
        choices = f.metadata.get("choices")
        if not choices or value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if item not in choices:
                close = difflib.get_close_matches(str(item), choices, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                report.error(key, f"must be one of {', '.join(choices)}{hint}", value)


def bounds_rule(metadata: Any) -> str | None:
    """Return the rule of a field's ``gt``/``ge``/``lt``/``le`` bounds (``> 0``), None if none."""
    gt, ge, lt, le = (metadata.get(name) for name in ("gt", "ge", "lt", "le"))
    if ge is not None and le is not None:
        return f"between {ge} and {le}"
    low = f"({gt}" if gt is not None else f"[{ge}" if ge is not None else None
    high = f"{lt})" if lt is not None else f"{le}]" if le is not None else None
    if low and high:
        return f"in {low}, {high}"
    for name, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if metadata.get(name) is not None:
            return f"{sign} {metadata[name]}"
    return None


def _within(value: Any, metadata: Any) -> bool:
    gt, ge, lt, le = (metadata.get(name) for name in ("gt", "ge", "lt", "le"))
    return (
        (gt is None or value > gt)
        and (ge is None or value >= ge)
        and (lt is None or value < lt)
        and (le is None or value <= le)
    )


def _bounds_message(value: Any, metadata: Any) -> str:
    """Return the error for a value outside its field's bounds.

    A count's upper bound is a ``Limit`` (``MAX_STEPS``: what the database stores): the message
    names the side that was crossed, and the limit's reason when it is the upper one.
    """
    upper = metadata.get("le") if metadata.get("le") is not None else metadata.get("lt")
    if not isinstance(upper, Limit):
        return f"must be {bounds_rule(metadata)}"
    lower = {name: metadata.get(name) for name in ("gt", "ge")}
    if bounds_rule(lower) and not _within(value, lower):
        return f"must be {bounds_rule(lower)}"
    sign = "<=" if metadata.get("le") is not None else "<"
    return f"must be {sign} {int(upper)} ({upper.why}); lower it"


def _size(value: Any, budget: list[int]) -> str | None:
    """Return what is too large in a value (a string, a list, a mapping, nested), or None.

    ``budget`` counts the values looked at, so a structure sharing its parts (built in Python;
    YAML aliases are refused) costs no more than ``MAX_VALUES`` steps to check.
    """
    budget[0] -= 1
    if budget[0] < 0:
        return f"holds more than {MAX_VALUES:,} values in all, the limit"
    if isinstance(value, str) and len(value) > MAX_YAML_STRING:
        return f"is {len(value):,} characters long, over the limit of {MAX_YAML_STRING:,}"
    if isinstance(value, list | tuple | dict) and len(value) > MAX_YAML_ITEMS:
        return f"has {len(value):,} items, over the limit of {MAX_YAML_ITEMS:,}"
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    for item in items if isinstance(value, list | tuple | dict) else ():
        problem = _size(item, budget)
        if problem:
            return problem
    return None


def _check_bounds(report: _Report) -> None:
    """Check every field's ``gt``/``ge``/``lt``/``le`` bounds, as ``_check_choices`` its choices.

    A section whose field has ``bounds_when`` (the critic's: ``critic.enable``) is skipped while
    that key's value is false. Every number must also be finite and fit in 64 bits, and every
    value be no larger than a YAML value may be (``MAX_YAML_STRING``, ``MAX_YAML_ITEMS``).
    """
    skipped = tuple(
        f"{f.name}."
        for f in dataclasses.fields(report.cfg)
        if f.metadata.get("bounds_when") and not get_value(report.cfg, f.metadata["bounds_when"])
    )
    for _, f, key, _, value in _leaves(report.cfg):
        numbers = [value] if isinstance(value, int | float) else []
        if isinstance(value, list):
            numbers = [v for v in value if isinstance(v, int | float)]
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            report.error(key, "must be a finite number (not nan or inf)", value)
            continue
        if any(isinstance(v, int) and abs(v) > MAX_INT64 for v in numbers):
            report.error(key, f"must be between -{MAX_INT64} and {MAX_INT64} (64 bits)", value)
            continue
        problem = _size(value, [MAX_VALUES])
        if problem:
            report.error(key, f"{problem}; shorten it", _shown(value))
            continue
        rule = bounds_rule(f.metadata)
        if rule is None or value is None or key.startswith(skipped):
            continue
        if not _within(value, f.metadata):
            report.error(key, _bounds_message(value, f.metadata), value)


def _shown(value: Any) -> Any:
    """Return a value as an error shows it: a long string or list cut short."""
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:60]}..."
    if isinstance(value, list | tuple | dict):
        return f"{type(value).__name__} of {len(value):,} items"
    return value


def _check_ranges(report: _Report) -> None:
    def check(keys: tuple[str, ...], ok: Any, rule: str) -> None:
        for key in keys:
            value = get_value(report.cfg, key)
            if value is not None and not ok(value):
                report.error(key, f"must be {rule}")

    _check_bounds(report)
    # Rules a bound cannot say: -1 for off, a pair of betas, the dual-clip constant's own words.
    off = "-1 (off) or a positive number of steps"
    check(("trainer.save_freq", "trainer.test_freq"), lambda v: v == -1 or v > 0, off)
    check(
        (f"{_ARR}.rollout.top_k", f"{_ARR}.rollout.val_kwargs.top_k"),
        lambda v: v == -1 or v > 0,
        "-1 (off) or > 0",
    )
    check(
        (f"{_ARR}.actor.optim.lr_warmup_steps", "critic.optim.lr_warmup_steps"),
        lambda v: v >= -1,
        ">= -1 (-1: use lr_warmup_steps_ratio)",
    )
    for key in (f"{_ARR}.actor.optim.betas", "critic.optim.betas"):
        betas = get_value(report.cfg, key)
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            report.error(key, "must be two numbers in [0, 1), e.g. [0.9, 0.999]")
    cfg = report.cfg
    if cfg.actor_rollout_ref.actor.clip_ratio_c <= 1:
        report.error(f"{_ARR}.actor.clip_ratio_c", "must be > 1 (dual-clip PPO; verl uses 3.0)")


def _check_algorithm(report: _Report, critic_enable: bool | None) -> None:
    cfg = report.cfg
    algo, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    estimator = algo.adv_estimator
    if estimator in TOKEN_BASELINE_ESTIMATORS and algo.rollout_correction.bypass_mode:
        # Their sum_pi_squared comes from the old-log-prob pass, which bypass mode skips (verl
        # fails there at its first step, asserting sum_pi_squared is in the batch).
        report.error(
            "algorithm.rollout_correction.bypass_mode",
            f"{estimator} weighs by each token's sum of squared probabilities, which the "
            "old-log-prob pass computes and bypass mode skips; set bypass_mode=False (decoupled "
            "correction) or choose another estimator such as grpo",
        )
    if estimator in GROUP_ESTIMATORS and rollout.n < 2 and not algo.allow_single_sample_groups:
        report.error(
            f"{_ARR}.rollout.n",
            f"{estimator} compares the responses to the same prompt, so it needs groups; "
            f"set actor_rollout_ref.rollout.n>=2 (e.g. 4), or "
            "algorithm.allow_single_sample_groups=True to run with single samples",
        )
    if estimator in GROUP_ESTIMATORS and rollout.n > 1 and not rollout.do_sample:
        report.warnings.append(
            f"{estimator} with actor_rollout_ref.rollout.do_sample=False: every response in a "
            "group is the same, so every advantage is 0; set do_sample=True"
        )
    if estimator == "gae" and critic_enable is False:
        report.error(
            "critic.enable",
            "gae needs a value model; set critic.enable=True (or null), or choose a critic-free "
            "estimator such as algorithm.adv_estimator=grpo",
            False,
        )
    if estimator != "gae" and critic_enable:
        report.warnings.append(
            f"critic.enable=True with algorithm.adv_estimator={estimator}: the critic is trained "
            "but its values are not used"
        )
    if algo.use_kl_in_reward and actor.use_kl_loss:
        report.warnings.append(
            "both algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss are on: "
            "the KL to the reference is penalised twice"
        )
    if estimator == "grpo" and not (algo.use_kl_in_reward or actor.use_kl_loss):
        report.warnings.append(
            "GRPO without a KL term: nothing keeps the policy near the reference; set "
            "actor_rollout_ref.actor.use_kl_loss=True (kl_loss_coef=0.001, as verl's examples)"
        )
    if algo.kl_ctrl.type in ("adaptive", "pid") and algo.kl_ctrl.target_kl <= 0:
        report.error(
            "algorithm.kl_ctrl.target_kl", f"must be > 0 for kl_ctrl.type={algo.kl_ctrl.type}"
        )
    if algo.kl_ctrl.type == "adaptive" and algo.kl_ctrl.horizon <= 0:
        report.error("algorithm.kl_ctrl.horizon", "must be > 0 for kl_ctrl.type=adaptive")
    _check_rollout_correction(report)


def _check_rollout_correction(report: _Report) -> None:
    """Check ``algorithm.rollout_correction``'s keys together (each one's range is a bound)."""
    rc = report.cfg.algorithm.rollout_correction
    key = "algorithm.rollout_correction"
    if rc.rollout_rs is not None and rc.rollout_rs_threshold is None:
        report.error(
            f"{key}.rollout_rs_threshold",
            f"must be set when rollout_rs={rc.rollout_rs} (verl requires it), e.g. 2.0 for "
            "token or sequence, 1.001 for geometric",
            None,
        )
    for name in ("rollout_rs_threshold", "rollout_rs_threshold_lower"):
        if rc.rollout_rs is None and getattr(rc, name) is not None:
            report.error(
                f"{key}.{name}", "applies only with rollout_rs; set rollout_rs or unset it"
            )
    upper, lower = rc.rollout_rs_threshold, rc.rollout_rs_threshold_lower
    if upper is not None and lower is not None and lower >= upper:
        report.error(
            f"{key}.rollout_rs_threshold_lower",
            f"must be < rollout_rs_threshold ({upper}); null uses 1 / rollout_rs_threshold",
            lower,
        )
    if rc.rollout_is_batch_normalize and rc.rollout_is is None:
        report.error(
            f"{key}.rollout_is_batch_normalize",
            "normalises the IS weights, so it needs rollout_is=token or sequence",
            True,
        )
    if rc.loss_type != "ppo_clip" and not rc.bypass_mode:
        report.error(
            f"{key}.loss_type",
            "is the loss of bypass mode; set algorithm.rollout_correction.bypass_mode=True or "
            "leave loss_type at ppo_clip",
            rc.loss_type,
        )
    loss_mode = report.cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if loss_mode == "bypass_mode" and not rc.bypass_mode:
        report.error(
            f"{_ARR}.actor.policy_loss.loss_mode",
            "bypass_mode is the loss algorithm.rollout_correction.bypass_mode=True trains with; "
            "set that (it picks the loss itself)",
            loss_mode,
        )
    if rc.bypass_mode and loss_mode not in ("vanilla", "bypass_mode"):
        report.error(
            f"{key}.bypass_mode",
            f"replaces the policy loss with bypass mode's (loss_type={rc.loss_type}), so "
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} would be ignored; leave "
            "loss_mode at vanilla or turn bypass_mode off",
            True,
        )


def _check_batches(report: _Report, role: str) -> None:
    """Check one trainable role's batch sizes as verl's FSDP workers do."""
    cfg = report.cfg
    section: Any = cfg.critic if role == "critic" else cfg.actor_rollout_ref.actor
    prefix = "critic" if role == "critic" else f"{_ARR}.actor"
    n, batch, mini = (
        cfg.actor_rollout_ref.rollout.n,
        cfg.data.train_batch_size,
        section.ppo_mini_batch_size,
    )
    workers = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if min(n, batch, mini, workers) <= 0 or max(n, batch, mini) > MAX_BATCH:
        return  # reported by the range checks
    if role == "actor" and batch * n % workers:
        report.error(
            "data.train_batch_size",
            f"train_batch_size * rollout.n = {batch * n} samples cannot be split evenly over "
            f"{workers} workers (trainer.nnodes * trainer.n_gpus_per_node); make it a multiple",
        )
    if batch % mini:
        # The largest divisor of batch up to mini, from the pairs (d, batch // d) with d <= sqrt.
        pairs = (
            p for d in range(1, math.isqrt(batch) + 1) if batch % d == 0 for p in (d, batch // d)
        )
        divisor = max(d for d in pairs if d <= mini)
        report.error(
            f"{prefix}.ppo_mini_batch_size",
            f"data.train_batch_size={batch} is not a multiple of it; use a divisor such as {divisor}",
        )
    if mini * n % workers:
        report.error(
            f"{prefix}.ppo_mini_batch_size",
            f"a mini-batch of {mini * n} samples (ppo_mini_batch_size * rollout.n) cannot be "
            f"split evenly over {workers} workers; make it a multiple of {workers}",
        )
        return
    per_worker, micro = mini * n // workers, section.ppo_micro_batch_size_per_gpu
    if micro and not section.use_dynamic_bsz and per_worker % micro:
        report.error(
            f"{prefix}.ppo_micro_batch_size_per_gpu",
            f"each worker's mini-batch has {per_worker} samples, not a multiple of {micro}; "
            f"use a divisor of {per_worker}",
        )
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    if section.use_dynamic_bsz and section.ppo_max_token_len_per_gpu < longest:
        report.error(
            f"{prefix}.ppo_max_token_len_per_gpu",
            f"must hold one full sequence: at least max_prompt_length + max_response_length = {longest}",
        )


def _local_path(report: _Report, key: str, value: str) -> Path | None:
    """Return the local path to check, or None for tiny:// (built on demand) and remote URIs."""
    if value.startswith("tiny://"):
        return None
    if _REMOTE.match(value):
        report.warnings.append(f"{key}={value!r} is not a local path and was not checked")
        return None
    return Path(value).expanduser()


def _check_file(report: _Report, key: str, value: str, fix: str) -> None:
    path = _local_path(report, key, value)
    if path is None:
        return
    if not path.exists():
        report.error(key, f"{path} does not exist; {fix}", value)
    elif not os.access(path, os.R_OK):
        report.error(key, f"{path} cannot be read (permissions); {fix}", value)


def _check_model_dir(report: _Report, key: str, value: str) -> None:
    path = _local_path(report, key, value)
    if path is None:
        return
    fix = f"point {key} at a local Hugging Face folder (with config.json), or use tiny://model"
    if not path.is_dir():
        problem = "is a file, not a folder" if path.exists() else "does not exist"
        report.error(key, f"{path} {problem}; {fix}", value)
    elif not os.access(path, os.R_OK | os.X_OK) or not (path / "config.json").is_file():
        report.error(key, f"{path} has no readable config.json; {fix}", value)


def _check_reward_model(report: _Report, value: str) -> None:
    """Check that a local reward model folder holds a one-label sequence classifier."""
    path = _local_path(report, "reward_model.model.path", value)
    if path is None or not (path / "config.json").is_file():
        return  # remote, tiny://, or already reported by _check_model_dir
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        report.error("reward_model.model.path", f"{path}/config.json cannot be read: {exc}", value)
        return
    architectures = config.get("architectures") or []
    labels = len(config["id2label"]) if "id2label" in config else config.get("num_labels", 2)
    if not any(a.endswith("ForSequenceClassification") for a in architectures) or labels != 1:
        report.error(
            "reward_model.model.path",
            f"{path} is not a one-label sequence classifier (architectures={architectures}, "
            f"{labels} labels); point it at a reward model saved from "
            "AutoModelForSequenceClassification with num_labels=1, or use tiny://reward_model",
            value,
        )


def _files(value: str | list[str] | None) -> list[str]:
    return [v for v in ([value] if isinstance(value, str) else value or []) if v]


def _check_inputs(report: _Report, original: PPOConfig, check_files: bool) -> None:
    cfg, data, trainer = report.cfg, report.cfg.data, report.cfg.trainer
    model, critic = cfg.actor_rollout_ref.model, cfg.critic
    if not _files(data.train_files):
        report.error(
            "data.train_files",
            "set it to a parquet, JSONL or CSV file (tiny://train.parquet: the embedded task)",
        )
    if not _files(data.val_files) and trainer.test_freq > 0:
        report.error(
            "data.val_files",
            f"validation is on (trainer.test_freq={trainer.test_freq}); set data.val_files, or "
            "turn validation off with trainer.test_freq=-1",
        )
    elif not _files(data.val_files) and trainer.val_before_train:
        # verl's default is on; a run given no validation data (a tutorial's) still trains.
        report.warnings.append(
            "data.val_files is not set: the validation before training "
            "(trainer.val_before_train=True, verl's default) is skipped; set data.val_files to "
            "validate, or trainer.val_before_train=False to silence this"
        )
    for target, column in data.data_key_map.items():
        if target not in DATA_KEY_MAP_TARGETS or not column:
            report.error(
                f"data.data_key_map.{target}",
                f"targets are {', '.join(DATA_KEY_MAP_TARGETS)}, each mapped to a source column "
                "(e.g. data.data_key_map.prompt=question)",
                column,
            )
    has_model = original.actor_rollout_ref.model.hf_model is not None
    if model.path is None and not has_model:
        report.error(
            f"{_ARR}.model.path",
            f"point {_ARR}.model.path at a local Hugging Face folder, or use tiny://model",
        )
    if cfg.reward_model.enable and not cfg.reward_model.model.path:
        report.error(
            "reward_model.model.path",
            "reward_model.enable=True needs a reward model folder (tiny://reward_model: the "
            "embedded one)",
        )
    if cfg.reward_model.enable and cfg.reward_model.micro_batch_size_per_gpu is None:
        report.error(
            "reward_model.micro_batch_size_per_gpu",
            "reward_model.enable=True needs the samples per reward-model forward; set "
            "reward_model.micro_batch_size_per_gpu (or verl's deprecated micro_batch_size)",
        )
    if cfg.reward_model.enable and cfg.custom_reward_function.path and not cfg.reward.components:
        report.error(
            "reward.components",
            "reward_model.enable=True and custom_reward_function.path both give the reward; "
            "combine them with reward.components=[{name: custom, weight: ...}, {name: "
            "reward_model, weight: ...}], or drop one",
        )
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        report.error(
            "trainer.resume_from_path", "resume_mode=resume_path needs a checkpoint folder here"
        )
    if not check_files:
        return
    data_fix = "check the path, or upload the data"
    for key in ("data.train_files", "data.val_files"):
        for value in _files(get_value(cfg, key)):
            _check_file(report, key, value, data_fix)
    if model.path and not has_model:
        _check_model_dir(report, f"{_ARR}.model.path", model.path)
    tokenizer = original.actor_rollout_ref.model
    if (
        tokenizer.tokenizer_path
        and tokenizer.tokenizer_path != model.path
        and tokenizer.tokenizer is None
    ):
        _check_file(
            report,
            f"{_ARR}.model.tokenizer_path",
            tokenizer.tokenizer_path,
            "point it at a tokenizer folder",
        )
    if data.tokenizer:
        _check_file(report, "data.tokenizer", data.tokenizer, "point it at a tokenizer folder")
    if critic.enable and critic.model.path and critic.model.path != model.path:
        _check_model_dir(report, "critic.model.path", critic.model.path)
    if cfg.reward_model.enable and cfg.reward_model.model.path:
        _check_model_dir(report, "reward_model.model.path", cfg.reward_model.model.path)
        _check_reward_model(report, cfg.reward_model.model.path)
    if cfg.custom_reward_function.path:
        _check_file(
            report,
            "custom_reward_function.path",
            cfg.custom_reward_function.path,
            "point it at a Python file",
        )
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if multi_turn.enable and multi_turn.interaction_path:
        _check_file(
            report,
            f"{_ARR}.rollout.multi_turn.interaction_path",
            multi_turn.interaction_path,
            "point it at a Python file",
        )
    if multi_turn.enable and multi_turn.interaction_config_path:
        _check_file(
            report,
            f"{_ARR}.rollout.multi_turn.interaction_config_path",
            multi_turn.interaction_config_path,
            "point it at verl's interaction YAML",
        )
    if multi_turn.enable and multi_turn.tool_config_path:
        _check_file(
            report,
            f"{_ARR}.rollout.multi_turn.tool_config_path",
            multi_turn.tool_config_path,
            "point it at a tools YAML",
        )
    if trainer.resume_mode == "resume_path" and trainer.resume_from_path:
        _check_file(
            report,
            "trainer.resume_from_path",
            trainer.resume_from_path,
            "point it at a checkpoint folder",
        )


def _check_tiny_uris(report: _Report, original: PPOConfig) -> None:
    """Check that every ``tiny://`` value of a path key names a known asset; nothing is built.

    Keys are read as given (a key left null that takes another's value is not checked twice),
    with ``${...}`` references filled in. No code key reads a ``tiny://`` asset.
    """
    for _, f, key, _, value in _leaves(original):
        resource = f.metadata.get("resource")
        if resource not in ("path", "code") or f.metadata.get("effect", HONOURED) != HONOURED:
            continue
        if isinstance(value, str) and "${" in value:
            value = get_value(report.cfg, key)
        for item in _files(value):  # one path, or a list of them (data.train_files)
            if not item.startswith(TINY_PREFIX):
                continue
            if resource == "code":
                report.error(
                    key,
                    "tiny:// names the embedded data and models, not code; point it at a "
                    "Python file",
                    item,
                )
            elif item not in TINY_URIS:
                report.error(
                    key,
                    f"{item} names no embedded asset; use one of {', '.join(TINY_URIS)}, or a "
                    "local path",
                    item,
                )


def own_reward_pool(cfg: Any) -> bool:
    """Return True when the reward model runs on a Ray pool of its own (verl's ``reward_pool``)."""
    return bool(cfg.reward_model.enable and cfg.reward_model.enable_resource_pool)


def reward_pool_problems(cfg: Any) -> list[ConfigFieldError]:
    """Return an error for each of ``reward_model.nnodes`` and ``n_gpus_per_node`` below 1 when
    the reward model has a pool of its own, as verl's ``main_ppo`` refuses them.

    ``RayPPOTrainer`` raises them too, before it asks Ray for the pools.
    """
    if not own_reward_pool(cfg):
        return []
    rm = cfg.reward_model
    return [
        ConfigFieldError(
            f"reward_model.{name}",
            value,
            "reward_model.enable_resource_pool=True gives the reward model a pool of "
            f"reward_model.nnodes x reward_model.n_gpus_per_node ranks, but they are {rm.nnodes} "
            f"x {rm.n_gpus_per_node}; set both to at least 1, or "
            "reward_model.enable_resource_pool=False to share the trainer's ranks",
        )
        for name, value in (("nnodes", rm.nnodes), ("n_gpus_per_node", rm.n_gpus_per_node))
        if value < 1
    ]


def in_process_reward_model_problems(cfg: Any) -> list[ConfigFieldError]:
    """Return an error for each reward-model key that only its Ray role reads, set True: the
    single-process trainer loads the reward model whole in its own process.

    The validator asks with ``trainer.controller=local``; ``build_reward_scorer`` raises them
    before it loads the model.
    """
    rm = cfg.reward_model
    if not rm.enable:
        return []
    ray_only = {
        "reward_model.enable_resource_pool": rm.enable_resource_pool,
        "reward_model.model.fsdp_config.param_offload": rm.model.fsdp_config.param_offload,
    }
    return [
        ConfigFieldError(
            key,
            value,
            "read where the reward model is a role on Ray ranks, but the single-process trainer "
            "(trainer.controller=local) loads it whole in its own process; set "
            f"trainer.controller=ray, or {key}=False",
        )
        for key, value in ray_only.items()
        if value
    ]


def _check_vllm(report: _Report) -> None:
    """Check the keys only the ``vllm`` rollout reads: its context length, its extra engine
    arguments and, on a CPU, ``gpu_memory_utilization`` (the adapter raises the same at start
    where ``trainer.device=auto`` resolves to a CPU)."""
    rollout = report.cfg.actor_rollout_ref.rollout
    longest = rollout.prompt_length + rollout.response_length
    if rollout.max_model_len is not None and rollout.max_model_len < longest:
        report.error(
            f"{_ARR}.rollout.max_model_len",
            f"is shorter than prompt_length + response_length = {longest}, so vLLM would cut "
            f"responses short; set at least {longest}, or null for exactly that",
        )
    if rollout.tensor_model_parallel_size > 1:
        report.error(
            f"{_ARR}.rollout.tensor_model_parallel_size",
            "each rank generates its own share of the batch, but the ranks of one tensor-parallel "
            "vLLM engine must ask it for the same prompts; keep 1 (every rank holds a whole "
            "rollout engine while FSDP shards the training)",
        )
    for key, why in engine_kwargs_problems(rollout.engine_kwargs.vllm):
        report.error(key, why, rollout.engine_kwargs.vllm[key.rsplit(".", 1)[1]])
    default = DEFAULT_GPU_MEMORY_UTILIZATION
    if report.cfg.trainer.device == "cpu" and rollout.gpu_memory_utilization != default:
        report.error(
            f"{_ARR}.rollout.gpu_memory_utilization",
            "sizes a GPU's KV cache, but trainer.device=cpu, where vLLM would take that fraction "
            f"of the machine's RAM; leave it at {default} and set "
            f"{_ARR}.rollout.engine_kwargs.vllm.kv_cache_memory_bytes",
        )


def _check_rollout_and_rewards(report: _Report) -> None:
    cfg = report.cfg
    rollout, workers = (
        cfg.actor_rollout_ref.rollout,
        cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node,
    )
    engine = {"vllm": "vLLM", "sglang": "SGLang"}.get(rollout.name)
    if rollout.name == "sglang" and cfg.trainer.device == "cpu":
        report.error(
            f"{_ARR}.rollout.name",
            f"{engine} needs a CUDA GPU; use actor_rollout_ref.rollout.name=hf or vllm",
        )
    elif (
        engine
        and cfg.trainer.controller == "local"  # built here; a Ray actor raises it where it runs
        and importlib.util.find_spec(rollout.name) is None
    ):
        report.error(f"{_ARR}.rollout.name", SGLANG_MISSING if engine == "SGLang" else VLLM_MISSING)
    if rollout.name == "vllm":
        _check_vllm(report)
    if engine and rollout.tensor_model_parallel_size > workers:
        report.error(
            f"{_ARR}.rollout.tensor_model_parallel_size", f"exceeds the {workers} workers; lower it"
        )
    multi_turn = rollout.multi_turn
    if multi_turn.interaction_config_path and (
        multi_turn.interaction_path or multi_turn.interaction_name
    ):
        report.error(
            f"{_ARR}.rollout.multi_turn.interaction_config_path",
            "and multi_turn.interaction_path / interaction_name both name an interaction; keep "
            "verl's YAML or the function",
            multi_turn.interaction_config_path,
        )
    for prefix, sampling in (
        (f"{_ARR}.rollout", rollout),
        (f"{_ARR}.rollout.val_kwargs", rollout.val_kwargs),
    ):
        if sampling.do_sample and sampling.temperature <= 0:
            report.error(
                f"{prefix}.temperature",
                f"must be > 0 when sampling; set {prefix}.do_sample=False for greedy decoding",
            )
    for i, component in enumerate(cfg.reward.components):
        key = f"reward.components[{i}]"
        if not math.isfinite(component.weight):
            report.error(f"{key}.weight", "must be a finite number", component.weight)
        if component.name == "custom" and not cfg.custom_reward_function.path:
            report.error(
                f"{key}.name", "custom needs custom_reward_function.path (a Python file)", "custom"
            )
        if component.name == "reward_model" and not cfg.reward_model.enable:
            report.error(
                f"{key}.name", "reward_model needs reward_model.enable=True", "reward_model"
            )
        if component.name == "reward_model" and component.kwargs:
            report.error(
                f"{key}.kwargs",
                "a reward-model component takes no kwargs: the model scores each (prompt, "
                "response) pair as it is; remove them",
                component.kwargs,
            )
    names = {component.name for component in cfg.reward.components}
    if names and cfg.custom_reward_function.path and "custom" not in names:
        report.error(
            "custom_reward_function.path",
            "is set, but reward.components has no custom component, so the function would "
            "score nothing; add {name: custom, weight: ...} to reward.components, or unset "
            "custom_reward_function.path",
        )
    if names and cfg.reward_model.enable and "reward_model" not in names:
        report.error(
            "reward_model.enable",
            "loads the reward model, but reward.components has no reward_model component, so "
            "its score would count nowhere; add {name: reward_model, weight: ...} to "
            "reward.components, or set reward_model.enable=False",
        )
    report.errors += reward_pool_problems(cfg)
    if cfg.trainer.controller != "ray":
        report.errors += in_process_reward_model_problems(cfg)


def _check_prime_and_batch(report: _Report, manager: str) -> None:
    """Check what the prime and batch managers score with: one function, and batch's call."""
    if manager not in ("prime", "batch"):
        return
    cfg, which = report.cfg, f"reward_model.reward_manager={manager}"
    if cfg.reward.components:
        report.error(
            "reward.components",
            f"are not read by {which}, which scores one reward function (custom_reward_function"
            f"{'' if manager == 'batch' else ' or the data_source dispatch'}); weighted "
            "components need reward_model.reward_manager=naive or dapo",
        )
    if cfg.reward_model.enable:
        report.error(
            "reward_model.enable",
            f"loads the reward model, which {which} does not score with; use "
            "reward_model.reward_manager=naive (the model's score is the reward) or dapo",
        )
    if manager != "batch":
        return
    custom = cfg.custom_reward_function
    if not custom.path:
        report.error(
            "reward_model.reward_manager",
            "batch calls custom_reward_function once per batch; set custom_reward_function.path "
            "and .name to a function compute_score(data_sources, solution_strs, ground_truths, "
            "extra_infos, **kwargs) returning one score per response",
        )
    if cfg.reward.num_workers != 1:
        report.error(
            "reward.num_workers",
            "has no effect with reward_model.reward_manager=batch, which makes one call in the "
            "trainer's process (a batch function parallelises itself); set it to 1",
        )
    for key in sorted(cfg.reward_model.reward_kwargs.keys() & (custom.reward_kwargs or {}).keys()):
        report.error(
            f"reward_model.reward_kwargs.{key}",
            "is also set in custom_reward_function.reward_kwargs, and batch passes both to the "
            "function; keep one",
            cfg.reward_model.reward_kwargs[key],
        )


def _check_dapo(report: _Report) -> None:
    """Check DAPO's keys: the reward manager and its kwargs, filter_groups, gen_batch_size."""
    cfg = report.cfg
    manager = cfg.reward_model.reward_manager
    _check_prime_and_batch(report, manager)
    kwargs = dict(cfg.reward_model.reward_kwargs)
    problems = reward_kwargs_problems(manager, kwargs)
    for key, message in problems:
        report.error(key, message, get_in(kwargs, key.split(".")[2:])[1])
    buffer = kwargs.get("overlong_buffer_cfg") or {}
    longest = cfg.data.max_response_length
    start = kwargs.get("max_resp_len", 0) - buffer.get("len", 0)
    if not problems and manager == "dapo" and buffer.get("enable") and start >= longest:
        report.warnings.append(
            f"reward_model.reward_kwargs: the overlong penalty starts after max_resp_len - len "
            f"= {start} tokens, but no response is longer than data.max_response_length="
            f"{longest}, so it never applies"
        )
    recipe, key = cfg.reward_model.overlong_buffer, "reward_model.overlong_buffer"
    if recipe.enable and manager != "dapo":
        report.error(f"{key}.enable", "is read by reward_model.reward_manager=dapo; set it", True)
    if recipe.enable and buffer.get("enable"):
        report.error(
            f"{key}.enable",
            "and reward_model.reward_kwargs.overlong_buffer_cfg are two spellings of one penalty; "
            "keep one",
            True,
        )
    if recipe.enable and not 0 < recipe.len <= longest:
        report.error(
            f"{key}.len",
            f"must be > 0 and at most data.max_response_length={longest} when enabled",
            recipe.len,
        )
    fg, data = cfg.algorithm.filter_groups, cfg.data
    key = "algorithm.filter_groups"
    if data.gen_batch_size is not None and not fg.enable:
        report.error(
            "data.gen_batch_size",
            f"is read only with {key}.enable=True (DAPO's dynamic sampling); unset it or "
            "enable filter_groups",
        )
    if data.gen_batch_size is not None and data.gen_batch_size < data.train_batch_size:
        report.error(
            "data.gen_batch_size",
            f"must be at least data.train_batch_size={data.train_batch_size}: each generation "
            "batch should be able to fill the step (DAPO generates about 3x as many)",
        )
    if not fg.enable:
        return
    metric = fg.metric
    others = bool(cfg.custom_reward_function.path or cfg.reward.components)
    if metric is None:
        report.error(
            f"{key}.metric",
            "must be set with filter_groups.enable=True: acc, score, seq_reward or "
            "seq_final_reward",
        )
    elif metric == "acc" and manager != "dapo" and not others:
        report.error(
            f"{key}.metric",
            "acc is recorded by reward_model.reward_manager=dapo (each float score is its acc, "
            "as verl's DAPO manager) or by a reward function returning {'acc': ...}; set "
            "reward_model.reward_manager=dapo or metric=score",
        )
    elif metric not in ("acc", "score", "seq_reward", "seq_final_reward") and not others:
        report.error(
            f"{key}.metric",
            "the built-in rewards produce acc (with reward_manager=dapo), score, seq_reward and "
            "seq_final_reward; another name needs a custom_reward_function that returns it",
        )
    if metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
        report.error(
            f"{key}.metric",
            "seq_final_reward with algorithm.use_kl_in_reward=True needs the KL penalty before "
            "filtering, which this engine applies after it; use seq_reward, or the KL loss "
            "(actor.use_kl_loss) instead of the KL in the reward",
        )
    if cfg.actor_rollout_ref.rollout.n < 2:
        report.error(
            f"{key}.enable",
            "filters groups of responses to one prompt, so it needs actor_rollout_ref.rollout.n "
            ">= 2 (a group of one is always kept)",
        )


def validate_config(cfg: PPOConfig, *, check_files: bool = True) -> list[str]:
    """Return warnings for cfg, or raise ConfigValidationError carrying every error found.

    ``cfg`` is not changed: the checks run on a resolved copy. ``check_files`` also checks that
    data files and model folders exist and can be read (``tiny://`` paths always pass).
    """
    errors = [
        type_error(key, value, tp)
        for _, _, key, tp, value in _leaves(cfg)
        if not matches_type(value, tp)
    ]
    if errors:
        raise ConfigValidationError(errors)
    try:
        resolved = resolve_config(_clone(cfg))
    except ConfigFieldError as exc:
        raise ConfigValidationError([exc]) from None
    report = _Report(resolved)
    report.warnings += _mini_batch_warnings(cfg, resolved)
    _check_choices(report)
    for problem in tracker_install_problems(resolved.trainer.logger):
        report.error("trainer.logger", problem)
    _check_ranges(report)
    _check_algorithm(report, cfg.critic.enable)
    _check_batches(report, "actor")
    if resolved.critic.enable:
        _check_batches(report, "critic")
    _check_inputs(report, cfg, check_files)
    _check_tiny_uris(report, cfg)
    _check_legacy_keys(report, cfg)
    _check_effects(report)
    _check_rollout_and_rewards(report)
    _check_dapo(report)
    if report.errors:
        raise ConfigValidationError(report.errors, report.warnings)
    return report.warnings
