"""The configuration's one YAML reader: every YAML text a member sends (builder fields, imported
files, overrides) and the presets are read with ``yaml_load`` or ``_YamlLoader``, a SafeLoader
that reads ``1e-6`` as a float (YAML 1.2, as hydra does) and holds a document to the bounds below.
"""

import re
from typing import Any

import yaml

from engine.config.fields import ConfigError, ConfigFieldError

# Bounds on every YAML text read here: a builder field, an imported file, an override, a preset.
# An alias (``*a``) is refused outright: a few hundred bytes of nested aliases ("billion laughs")
# name billions of values, which every copy, check or print of the config then walks. The other
# bounds keep a document's cost linear in its size: a value that goes on the command line or in a
# form field has no business being larger.
MAX_YAML_BYTES = 256 * 1024
MAX_YAML_STRING = 64 * 1024  # characters in one scalar
MAX_YAML_ITEMS = 10_000  # items of one list, entries of one mapping
MAX_YAML_DEPTH = 64  # nested lists and mappings


class YamlLimitError(ConfigFieldError):
    """YAML text over one of the loader's bounds; the message names the bound and the fix.

    A ``ConfigFieldError`` without a key: whoever parses a field's text knows the field.
    """

    def __init__(self, message: str) -> None:
        super().__init__("", None, message)


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-6`` as a float (YAML 1.2, as hydra does), not as a string.

    It refuses aliases and holds a document to ``MAX_YAML_BYTES``, ``MAX_YAML_STRING``,
    ``MAX_YAML_ITEMS`` and ``MAX_YAML_DEPTH``, raising ``YamlLimitError`` as soon as one is
    passed (an alias at its first use, a list at its item over the limit).
    """

    def __init__(self, stream: str | bytes) -> None:
        if not isinstance(stream, str | bytes):
            raise TypeError("the YAML loader reads text, not a stream")
        size = len(stream.encode("utf-8")) if isinstance(stream, str) else len(stream)
        if size > MAX_YAML_BYTES:
            raise YamlLimitError(
                f"the YAML is {size:,} bytes, over the limit of {MAX_YAML_BYTES:,}; "
                "shorten it (a config is a few kilobytes)"
            )
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            raise YamlLimitError(
                f"an alias (*{anchor}) is not accepted: nested YAML aliases can stand for "
                "billions of values; write the value out in full"
            )
        if parent is not None and len(parent.value) >= MAX_YAML_ITEMS:
            raise YamlLimitError(
                f"a YAML list or mapping has more than {MAX_YAML_ITEMS:,} items, the limit; "
                "shorten it"
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlLimitError(
                    f"the YAML nests lists and mappings more than {MAX_YAML_DEPTH} deep, the "
                    "limit; flatten it"
                )
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.ScalarNode) and len(node.value) > MAX_YAML_STRING:
            raise YamlLimitError(
                f"a YAML value is {len(node.value):,} characters long, over the limit of "
                f"{MAX_YAML_STRING:,}; shorten it"
            )
        return node

    def construct_document(self, node: yaml.Node) -> Any:
        try:
            return super().construct_document(node)
        except YamlLimitError:
            raise
        except (ValueError, TypeError, OverflowError) as exc:  # 2020-13-45, !!float abc
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read a value ({exc})", node.start_mark
            ) from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # Python refuses to read ints of more than 4300 digits
            raise YamlLimitError(
                f"the number {node.value[:20]}... has too many digits; write a smaller number"
            ) from None


_YamlLoader.add_constructor("tag:yaml.org,2002:int", _YamlLoader.construct_yaml_int)
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_load(text: str, source: str = "YAML") -> Any:
    """Parse YAML text, reading ``1e-6`` as a float; raise ConfigError naming the source.

    Text over the loader's bounds (an alias, a huge document or value) raises ``YamlLimitError``.
    """
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
    except YamlLimitError as exc:
        raise YamlLimitError(f"{source}: {exc.message}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({exc})") from exc
