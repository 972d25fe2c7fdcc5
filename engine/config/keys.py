"""The schema's dotted keys and the types of their values, for everything that reads or writes a
config: find a key (``resolve_key``, with the closest key named when it is unknown), walk the
leaves of a config, read a plain value as its key's type (``coerce``), build a section from a
plain tree (``_from_dict``) and turn a config back into one (``config_to_dict``).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import re
import types
from collections.abc import Iterator
from functools import cache
from typing import Any, Union, get_args, get_origin, get_type_hints

from engine.config.fields import ConfigFieldError
from engine.config.schema import PPOConfig

_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)*")
_BOOL_WORDS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}


# ---------------------------------------------------------------------------- keys


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


@cache
def _fields(cls: Any) -> dict[str, tuple[dataclasses.Field, Any]]:
    hints = get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}


def _is_runtime(f: dataclasses.Field | None) -> bool:
    return f is not None and bool(f.metadata.get("runtime"))


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


@cache
def schema_keys(cls: type = PPOConfig) -> tuple[str, ...]:
    """Return every dotted key of the schema, sections included, runtime fields left out."""
    keys: list[str] = []

    def walk(c: type, prefix: str) -> None:
        for name, (f, tp) in _fields(c).items():
            if _is_runtime(f) or f.metadata.get("extras"):
                continue
            keys.append(prefix + name)
            if _is_section(tp):
                walk(tp, f"{prefix}{name}.")

    walk(cls, "")
    return tuple(keys)


def closest_key(key: str) -> str | None:
    """Return the schema key most like ``key`` (same last part preferred), or None."""
    keys = schema_keys()
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0)[0]
    matches = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key_error(key: str, value: Any = None, hint: str = "") -> ConfigFieldError:
    """Return the error for a key the schema does not have, naming the closest valid key."""
    suggestion = closest_key(key)
    message = "unknown key" + (f"; did you mean {suggestion}?" if suggestion else "")
    return ConfigFieldError(key, value, message + (f" ({hint})" if hint else ""))


def _runtime_error(key: str) -> ConfigFieldError:
    return ConfigFieldError(
        key, None, f"runtime-only: assign a loaded object in Python (config.{key} = obj)"
    )


@dataclasses.dataclass(frozen=True)
class KeyPath:
    """Where a dotted key points: dataclass attributes, then entries inside a dict-typed field."""

    key: str
    attrs: tuple[str, ...]
    entries: tuple[str, ...]
    type: Any
    field: dataclasses.Field | None


def _dict_value_type(tp: Any) -> Any | None:
    if tp is Any:
        return Any
    if get_origin(tp) in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return _dict_value_type(inner[0]) if len(inner) == 1 else None
    return get_args(tp)[1] if get_origin(tp) is dict else None


def resolve_key(key: str, cls: type = PPOConfig) -> KeyPath:
    """Map a dotted key onto the schema; raise ConfigFieldError naming the closest key if unknown."""
    if not _KEY.fullmatch(key):
        raise ConfigFieldError(key, None, "not a dotted key like data.train_batch_size")
    parts = key.split(".")
    tp: Any = cls
    fld: dataclasses.Field | None = None
    for i, part in enumerate(parts):
        if _is_section(tp):
            entry = _fields(tp).get(part)
            if entry is None or entry[0].metadata.get("extras"):
                raise unknown_key_error(key)
            fld, tp = entry
            continue
        value_type = _dict_value_type(tp)
        if value_type is None:
            raise unknown_key_error(key)
        if i == len(parts) - 1 or value_type is Any:
            return KeyPath(key, tuple(parts[:i]), tuple(parts[i:]), value_type, fld)
        tp = value_type
    return KeyPath(key, tuple(parts), (), tp, fld)


# ---------------------------------------------------------------------------- typed values


def describe_type(tp: Any) -> str:
    """Return a reader's name for an annotation: ``int or null``, ``list of str``."""
    if tp is Any:
        return "any value"
    if tp is type(None):
        return "null"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in get_args(tp))
    if origin is list:
        return f"list of {describe_type(get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of str to {describe_type(get_args(tp)[1])}"
    if _is_section(tp):
        return f"mapping with keys {', '.join(_fields(tp))}"
    return {bool: "bool (true/false)", float: "float (e.g. 1e-6)"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def type_error(key: str, value: Any, tp: Any) -> ConfigFieldError:
    """Return the error for a value of the wrong type, naming the expected type."""
    return ConfigFieldError(key, value, f"expected {describe_type(tp)}, got {type(value).__name__}")


def _scalar(value: Any, tp: type) -> Any:
    """Return value as the scalar type tp, or raise ValueError."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.strip().lower()]
    elif isinstance(value, bool):
        pass  # a bool is an int in Python, but never an int, float or str in a config
    elif tp is int:
        if isinstance(value, int):
            return value
        number = float(value) if isinstance(value, float | str) else None
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value)
        if number is not None and number.is_integer():
            return int(number)
    elif tp is float:
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float | datetime.date):
            return str(value)
    raise ValueError


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Return value converted to the annotation tp, or raise ConfigFieldError naming the key."""
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in get_args(tp):
            return None
        for option in get_args(tp):
            if option is type(None):
                continue
            try:
                return coerce(value, option, key)
            except ConfigFieldError:
                continue
        raise type_error(key, value, tp)
    if origin is list:
        (item,) = get_args(tp)
        if isinstance(value, str) and item is str:
            return [value]
        if not isinstance(value, list | tuple):
            raise type_error(key, value, tp)
        return [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise type_error(key, value, tp)
        item = get_args(tp)[1]
        return {str(k): coerce(v, item, f"{key}.{k}") for k, v in value.items()}
    if _is_section(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):
            return _from_dict(tp, value, key)
        raise type_error(key, value, tp)
    try:
        return _scalar(value, tp)
    except (ValueError, TypeError, OverflowError):
        raise type_error(key, value, tp) from None


def matches_type(value: Any, tp: Any) -> bool:
    """Return True when value already has the annotation's type (no conversion needed)."""
    if tp is Any:
        return True
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(matches_type(value, option) for option in get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(matches_type(v, get_args(tp)[0]) for v in value)
    if origin is dict:
        item = get_args(tp)[1]
        return isinstance(value, dict) and all(
            isinstance(k, str) and matches_type(v, item) for k, v in value.items()
        )
    if isinstance(value, bool):
        return tp is bool
    if tp is float:
        return isinstance(value, int | float)
    return isinstance(value, tp)


def _accepts_str(tp: Any) -> bool:
    if tp in (str, Any):
        return True
    return get_origin(tp) in (Union, types.UnionType) and any(map(_accepts_str, get_args(tp)))


def _from_dict(
    cls: type, data: dict, prefix: str, errors: list[ConfigFieldError] | None = None
) -> Any:
    """Build section ``cls`` from ``data``; with an ``errors`` list, collect every problem there
    (a bad key keeps its default) instead of raising the first."""
    fields = _fields(cls)
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        entry = fields.get(name)
        try:
            if entry is None:
                raise unknown_key_error(key, value)
            if _is_runtime(entry[0]):
                raise _runtime_error(key)
            if errors is not None and _is_section(entry[1]) and isinstance(value, dict):
                kwargs[name] = _from_dict(entry[1], value, key, errors)
            else:
                kwargs[name] = coerce(value, entry[1], key)
        except ConfigFieldError as exc:
            if errors is None:
                raise
            errors.append(exc)
    return cls(**kwargs)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if _is_runtime(f) or (f.metadata.get("extras") and not value):
                continue
            out[f.name] = _plain(value)
        return out
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return obj


def config_to_dict(cfg: PPOConfig) -> dict[str, Any]:
    """Return the config as plain JSON-serialisable data, runtime-only fields dropped."""
    return _plain(cfg)
