"""The schema as a flat list of fields, and dotted-key access, for forms and tools.

A form builder needs, per leaf field: its dotted key, a type to pick a widget, the default, the
help text, the valid choices, the bounds of a number, a group for the form's sections and whether it belongs in the
advanced part. All of it comes from the dataclasses of ``schema.py``, so the form cannot drift
from what the CLI and the validator accept. Defaults are read from a default instance, not from
the field declarations, because a section may override them (``critic.optim.lr`` is 1e-5).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Union, get_args, get_origin

import yaml

from engine.config.fields import HONOURED, ConfigFieldError
from engine.config.keys import _accepts_str, _fields, _is_runtime, _is_section, coerce, resolve_key
from engine.config.schema import PPOConfig
from engine.config.yaml_io import _YamlLoader


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One leaf field of the config, described for a form."""

    key: str
    type: Any
    default: Any
    help: str
    choices: list[str] | None
    group: str
    advanced: bool
    nullable: bool = False
    item_type: Any = None
    annotation: Any = None
    # Bounds of a number from the field's metadata (> gt, >= ge, < lt, <= le); None: unbounded.
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    # Which table of docs/config.md the key is in (fields.EFFECTS), why a refused key is, and the
    # key a derived key follows.
    effect: str = HONOURED
    why: str | None = None
    follows: str | None = None

    @property
    def minimum(self) -> float | None:
        """Return the least value a form input may take: ge, or gt (plus one for an int)."""
        if self.ge is not None:
            return self.ge
        if self.gt is not None and self.type is int:
            return self.gt + 1
        return self.gt

    @property
    def maximum(self) -> float | None:
        """Return the greatest value a form input may take: le, or lt (minus one for an int)."""
        if self.le is not None:
            return self.le
        if self.lt is not None and self.type is int:
            return self.lt - 1
        return self.lt


def _widget_type(tp: Any) -> tuple[Any, bool, Any]:
    """Return (type, nullable, item type) of an annotation: ``str | list[str] | None`` is str."""
    nullable = False
    if get_origin(tp) in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        nullable = len(options) < len(get_args(tp))
        lists = [a for a in options if get_origin(a) is list]
        item = get_args(lists[0])[0] if lists else None
        base = options[0]
        return (get_origin(base) or base), nullable, item
    origin = get_origin(tp)
    if origin is list:
        return list, nullable, get_args(tp)[0]
    if origin is dict:
        return dict, nullable, get_args(tp)[1]
    return tp, nullable, None


def _group(key: str) -> str:
    parts = key.split(".")
    if parts[0] == "actor_rollout_ref" and len(parts) > 2:
        return parts[1]
    return parts[0]


def iter_field_specs(cls: type = PPOConfig) -> list[FieldSpec]:
    """Return a FieldSpec for every leaf field of ``cls``, in declaration order."""
    specs: list[FieldSpec] = []

    def walk(obj: Any, prefix: str) -> None:
        for name, (f, tp) in _fields(obj.__class__).items():
            if _is_runtime(f) or f.metadata.get("extras"):
                continue
            key, default = prefix + name, getattr(obj, name)
            if _is_section(tp):
                walk(default, key + ".")
                continue
            widget, nullable, item = _widget_type(tp)
            choices = f.metadata.get("choices")
            specs.append(
                FieldSpec(
                    key=key,
                    type=widget,
                    default=default,
                    help=f.metadata["help"],
                    choices=list(choices) if choices else None,
                    group=_group(key),
                    advanced=not f.metadata.get("basic", False),
                    nullable=nullable,
                    item_type=item,
                    annotation=tp,
                    gt=f.metadata.get("gt"),
                    ge=f.metadata.get("ge"),
                    lt=f.metadata.get("lt"),
                    le=f.metadata.get("le"),
                    effect=f.metadata.get("effect", HONOURED),
                    why=f.metadata.get("why"),
                    follows=f.metadata.get("follows"),
                )
            )

    walk(cls(), "")
    return specs


def get_value(cfg: PPOConfig, key: str) -> Any:
    """Return the value at a dotted key (``actor_rollout_ref.actor.optim.lr``)."""
    path = resolve_key(key, type(cfg))
    obj = cfg
    for attr in path.attrs:
        obj = getattr(obj, attr)
    for entry in path.entries:
        if not isinstance(obj, dict) or entry not in obj:
            raise ConfigFieldError(key, None, f"{'.'.join(path.attrs)} has no entry '{entry}'")
        obj = obj[entry]
    return obj


def set_value(cfg: PPOConfig, key: str, value: Any) -> None:
    """Set the value at a dotted key, converting form text (``"8"``, ``"1e-6"``) to its type."""
    path = resolve_key(key, type(cfg))
    if isinstance(value, str) and not _is_runtime(path.field):
        nullable = get_origin(path.type) in (Union, types.UnionType) and type(None) in get_args(
            path.type
        )
        if value == "" and nullable:
            value = None
        elif path.type is Any or not _accepts_str(path.type):
            try:
                value = yaml.load(value, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
            except yaml.YAMLError:
                raise ConfigFieldError(key, value, "the value is not valid YAML") from None
    value = coerce(value, path.type, key)
    owner = cfg
    for attr in path.attrs[:-1]:
        owner = getattr(owner, attr)
    if not path.entries:
        setattr(owner, path.attrs[-1], value)
        return
    owner = getattr(owner, path.attrs[-1])
    for entry in path.entries[:-1]:
        if not isinstance(owner.get(entry), dict):
            owner[entry] = {}
        owner = owner[entry]
    owner[path.entries[-1]] = value
