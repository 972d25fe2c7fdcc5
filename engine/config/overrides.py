"""Command-line overrides, applied to a plain config tree before it becomes a typed ``PPOConfig``.

Override grammar, as hydra spells it: ``key=value`` changes a known key; ``+key=value`` adds a key
(an entry of a dict-typed field such as ``data.data_key_map``, or, for a path the schema does not
know, an entry of ``config.extras`` with a warning); ``++key=value`` sets a key whether or not it
exists; ``~key`` deletes it. Values are YAML, read with YAML 1.2's float syntax so ``1e-6`` is a
float as in hydra. Unlike hydra, ``+`` on a key that exists sets it instead of failing: PostTrain's
schema has keys verl's YAML lacks, and verl scripts add those with ``+``.

Working on the plain tree keeps hydra's semantics simple: ``~key`` deletes what the presets set so
the dataclass default comes back, and a mapping value merges into the node it replaces (hydra
applies overrides with ``OmegaConf.update(..., merge=True)``). A tutorial's spelling
(``trainer.total_steps=5``) sets its verl key, as ``engine.config.aliases`` translates it.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import shlex
import warnings
from typing import Any

import yaml

from engine.config.aliases import apply_aliases, is_alias_key
from engine.config.aliases import translate as translate_alias
from engine.config.fields import ConfigError, ConfigFieldError, ConfigValidationError
from engine.config.keys import (
    _KEY,
    _is_runtime,
    _runtime_error,
    config_to_dict,
    resolve_key,
    unknown_key_error,
)
from engine.config.schema import PPOConfig
from engine.config.tree import get_in, put
from engine.config.yaml_io import YamlLimitError, _YamlLoader


@dataclasses.dataclass(frozen=True)
class Override:
    """One parsed command-line override: op is set, add (+), force (++) or delete (~)."""

    op: str
    key: str
    value: Any
    text: str


def parse_override(text: str) -> Override:
    """Parse ``key=value``, ``+key=value``, ``++key=value`` or ``~key`` with a YAML value."""
    op, body = "set", text
    for prefix, name in (("~", "delete"), ("++", "force"), ("+", "add")):
        if text.startswith(prefix):
            op, body = name, text[len(prefix) :]
            break
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not _KEY.fullmatch(key):
        raise ConfigFieldError(
            key, text, "not an override; write key=value, +key=value, ++key=value or ~key"
        )
    if op != "delete" and not sep:
        raise ConfigFieldError(key, text, f"no value; write {key}=<value>")
    value: Any = None
    if op != "delete" and raw != "":
        try:
            value = yaml.load(raw, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
        except YamlLimitError as exc:
            shown = raw if len(raw) <= 60 else f"{raw[:60]}..."
            raise ConfigFieldError(key, shown, exc.message) from None
        except yaml.YAMLError:
            raise ConfigFieldError(
                key, raw, "the value is not valid YAML; quote it, e.g. key='a: b'"
            ) from None
    elif op != "delete":
        value = ""
    return Override(op, key, value, text)


def _apply_override(tree: dict, override: Override) -> None:
    key, parts = override.key, override.key.split(".")
    if is_alias_key(key) and override.op != "delete":
        if key.startswith("reward_model."):  # read with its pair by apply_aliases afterwards
            put(tree, parts, override.value)
            return
        for target, value in translate_alias(key, override.value).items():
            put(tree, target.split("."), value)
        return
    try:
        path = resolve_key(key)
    except ConfigFieldError:
        extras: dict[str, Any] = tree["extras"] if isinstance(tree.get("extras"), dict) else {}
        if override.op in ("add", "force"):
            warnings.warn(
                f"{key} is not a PostTrain config key; it is kept in config.extras",
                UserWarning,
                stacklevel=4,
            )
            tree["extras"] = {**extras, key: override.value}
            return
        if override.op == "delete" and key in extras:
            del extras[key]
            return
        hint = (
            "to add a key PostTrain does not know, write +key=value" if override.op == "set" else ""
        )
        raise unknown_key_error(key, override.value, hint) from None
    if _is_runtime(path.field):
        raise _runtime_error(key)
    if override.op == "delete":
        found, parent = get_in(tree, parts[:-1])
        if found and isinstance(parent, dict) and parts[-1] in parent:
            del parent[parts[-1]]
        elif path.entries:
            raise ConfigFieldError(key, None, "no such entry to delete")
        return
    if path.entries and override.op == "set":
        present = get_in(tree, parts)[0] or get_in(config_to_dict(PPOConfig()), parts)[0]
        if not present:
            field_key = ".".join(path.attrs)
            raise ConfigFieldError(
                key,
                override.value,
                f"{field_key} has no entry '{'.'.join(path.entries)}'; add it with +{override.text}",
            )
    put(tree, parts, override.value)


def apply_overrides(
    tree: dict[str, Any], overrides: list[str], *, all_errors: bool = False
) -> dict[str, Any]:
    """Return a copy of the plain config tree with command-line overrides applied in order.

    With ``all_errors`` every override is tried and the problems are raised together as a
    ``ConfigValidationError``; otherwise the first one raises.
    """
    tree, errors = _applied(tree, overrides, all_errors)
    if errors:
        raise ConfigValidationError(errors)
    return tree


def _applied(
    tree: dict[str, Any], overrides: list[str], all_errors: bool
) -> tuple[dict[str, Any], list[ConfigFieldError]]:
    """Return the tree with the overrides that apply, and the problems of the others."""
    if isinstance(overrides, str):
        raise ConfigError("overrides must be a list of strings like ['data.train_batch_size=8']")
    tree = copy.deepcopy(tree)
    errors: list[ConfigFieldError] = []
    for text in overrides:
        try:
            _apply_override(tree, parse_override(text))
        except ConfigFieldError as exc:
            if not all_errors:
                raise
            errors.append(exc)
    return apply_aliases(tree, "overrides", check=False), errors


_OVERRIDE_LINE = re.compile(r"^(~[A-Za-z_][\w.\[\]-]*$|\+{0,2}[A-Za-z_][\w.\[\]-]*=)")


def override_lines(text: str) -> list[str] | None:
    """Return the overrides of pasted text, or None when it holds none.

    Two spellings: one override per line (``algorithm.adv_estimator=grpo``, ``+key=value``,
    ``# comments``), each line taken as written; or a verl command line (``python3 -m
    verl.trainer.main_ppo \\`` then ``key=value \\`` ...), split as a shell would, the command
    before the first override left out.
    """
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if lines and all(_OVERRIDE_LINE.match(line) for line in lines):
        return lines
    try:
        tokens = shlex.split(re.sub(r"\\\r?\n", " ", text), comments=True)
    except ValueError:
        return None
    start = next((i for i, t in enumerate(tokens) if _OVERRIDE_LINE.match(t)), None)
    if start is None:
        return None
    return [t for t in tokens[start:] if t not in ("$@", "$*", "${@}")]  # a script's own arguments
