"""Check a PPOConfig before anything heavy runs.

``validate_config`` collects every problem instead of stopping at the first, so the web form can
mark each field and the CLI can print them all; each error names the key, the value and the fix.
It checks a copy resolved by ``resolve_config`` (``engine.config.resolve``), and does two things:

- the checks every key gets from its field's metadata (``engine.config.fields``): its type, its
  ``choices``, its bounds (and that every number is finite and fits in 64 bits, every value no
  larger than a YAML value may be), a ``tiny://`` path naming a known asset, and its effect (a
  refused key set is an error, no-effect keys set share one warning);
- what every dict-valued key may hold (``engine.config.mappings``: model config attributes in
  ``override_config``, never a loader argument, a file or code in any of them);
- it gathers the rules of each section, which live beside the section's fields
  (``data_problems`` in ``engine.config.data``, ...), and verl's legacy keys (``resolve``).

What only the running machine can tell (is a GPU visible?) is checked when the run starts.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
from typing import Any

from engine.config.actor import actor_problems
from engine.config.algorithm import algorithm_problems
from engine.config.async_training import fully_async_problems, one_step_off_problems
from engine.config.critic import critic_problems
from engine.config.data import data_problems
from engine.config.fields import (
    HONOURED,
    NO_EFFECT,
    REFUSED,
    ConfigFieldError,
    ConfigValidationError,
    Limit,
    Validation,
)
from engine.config.files import paths_of
from engine.config.introspect import get_value
from engine.config.keys import _is_runtime, _leaves, matches_type, type_error
from engine.config.mappings import mapping_problems
from engine.config.resolve import legacy_key_problems, mini_batch_warnings, resolve_config
from engine.config.reward import reward_problems
from engine.config.rollout import rollout_problems
from engine.config.schema import PPOConfig
from engine.config.trainer import trainer_problems
from engine.config.yaml_io import MAX_YAML_ITEMS, MAX_YAML_STRING
from engine.tools.names import TINY_PREFIX, TINY_URIS

MAX_INT64 = 2**63 - 1  # what torch and numpy hold: a seed or a rank count beyond it fails at start
MAX_VALUES = 100_000  # strings and numbers in one field's value (override_config, reward kwargs)
# The rules of each section, beside its fields; each returns its errors and appends its warnings.
SECTION_RULES = (
    data_problems,
    actor_problems,
    rollout_problems,
    critic_problems,
    reward_problems,
    algorithm_problems,
    trainer_problems,
    one_step_off_problems,
    fully_async_problems,
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
    v = Validation(resolved, cfg, check_files, mini_batch_warnings(cfg, resolved))
    errors = _choice_problems(v) + _bound_problems(v) + _tiny_uri_problems(v)
    errors += _effect_problems(v) + legacy_key_problems(v)
    errors += mapping_problems(v, skip={error.key for error in errors})  # too large: walked once
    for rules in SECTION_RULES:
        errors += rules(v)
    if errors:
        raise ConfigValidationError(errors, v.warnings)
    return v.warnings


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


def _choice_problems(v: Validation) -> list[ConfigFieldError]:
    """Return an error for every value outside its field's ``choices``, naming the closest one."""
    errors = []
    for _, f, key, _, value in _leaves(v.cfg):
        choices = f.metadata.get("choices")
        if not choices or value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if item not in choices:
                close = difflib.get_close_matches(str(item), choices, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                message = f"must be one of {', '.join(choices)}{hint}"
                errors.append(ConfigFieldError(key, value, message))
    return errors


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


def _bound_problems(v: Validation) -> list[ConfigFieldError]:
    """Return an error for every value outside its field's ``gt``/``ge``/``lt``/``le`` bounds.

    A section whose field has ``bounds_when`` (the critic's: ``critic.enable``) is skipped while
    that key's value is false. Every number must also be finite and fit in 64 bits, and every
    value be no larger than a YAML value may be (``MAX_YAML_STRING``, ``MAX_YAML_ITEMS``).
    """
    skipped = tuple(
        f"{f.name}."
        for f in dataclasses.fields(v.cfg)
        if f.metadata.get("bounds_when") and not get_value(v.cfg, f.metadata["bounds_when"])
    )
    errors = []
    for _, f, key, _, value in _leaves(v.cfg):
        numbers = [value] if isinstance(value, int | float) else []
        if isinstance(value, list):
            numbers = [n for n in value if isinstance(n, int | float)]
        if any(isinstance(n, float) and not math.isfinite(n) for n in numbers):
            errors.append(ConfigFieldError(key, value, "must be a finite number (not nan or inf)"))
            continue
        if any(isinstance(n, int) and abs(n) > MAX_INT64 for n in numbers):
            message = f"must be between -{MAX_INT64} and {MAX_INT64} (64 bits)"
            errors.append(ConfigFieldError(key, value, message))
            continue
        problem = _size(value, [MAX_VALUES])
        if problem:
            errors.append(ConfigFieldError(key, _shown(value), f"{problem}; shorten it"))
            continue
        rule = bounds_rule(f.metadata)
        if rule is None or value is None or key.startswith(skipped):
            continue
        if not _within(value, f.metadata):
            errors.append(ConfigFieldError(key, value, _bounds_message(value, f.metadata)))
    return errors


def _shown(value: Any) -> Any:
    """Return a value as an error shows it: a long string or list cut short."""
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:60]}..."
    if isinstance(value, list | tuple | dict):
        return f"{type(value).__name__} of {len(value):,} items"
    return value


def _tiny_uri_problems(v: Validation) -> list[ConfigFieldError]:
    """Return an error for every ``tiny://`` value of a path key that names no known asset, and
    of a code key; nothing is built.

    Keys are read as given (a key left null that takes another's value is not checked twice),
    with ``${...}`` references filled in. No code key reads a ``tiny://`` asset.
    """
    errors = []
    for _, f, key, _, value in _leaves(v.given):
        resource = f.metadata.get("resource")
        if resource not in ("path", "code") or f.metadata.get("effect", HONOURED) != HONOURED:
            continue
        if isinstance(value, str) and "${" in value:
            value = get_value(v.cfg, key)
        for item in paths_of(value):  # one path, or a list of them (data.train_files)
            if not item.startswith(TINY_PREFIX):
                continue
            if resource == "code":
                message = (
                    "tiny:// names the embedded data and models, not code; point it at a "
                    "Python file"
                )
                errors.append(ConfigFieldError(key, item, message))
            elif item not in TINY_URIS:
                message = (
                    f"{item} names no embedded asset; use one of {', '.join(TINY_URIS)}, or a "
                    "local path"
                )
                errors.append(ConfigFieldError(key, item, message))
    return errors


def _effect_problems(v: Validation) -> list[ConfigFieldError]:
    """Refuse a refused key set off its default, and a key that follows another set to another
    value; warn once about every no-effect key set."""
    errors, inert = [], []
    defaults = PPOConfig()
    for _, f, key, _, value in _leaves(v.cfg):
        effect, follows = f.metadata.get("effect", HONOURED), f.metadata.get("follows")
        if follows:
            expected = get_value(v.cfg, follows)
            as_default = value is None or value == expected
        elif "[" in key or f.metadata.get("extras"):  # reward.components items, +key extras
            continue
        else:
            expected = get_value(defaults, key)
            as_default = value == expected
        if as_default:
            continue
        if effect == REFUSED:
            errors.append(ConfigFieldError(key, value, f"not supported here: {f.metadata['why']}"))
        elif effect == NO_EFFECT:
            inert.append(f"{key}={_shown(value)!r}")
        elif follows:
            message = f"must equal {follows} ({expected!r}) or be left out; set {follows}"
            errors.append(ConfigFieldError(key, value, message))
    if inert:
        v.warnings.append(
            "no effect here (settings of machinery this engine does not run, see "
            f"docs/config.md): {', '.join(inert)}"
        )
    return errors
