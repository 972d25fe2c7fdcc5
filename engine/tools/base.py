"""Tools a policy may call during a multi-turn rollout, and verl's tools YAML that lists them.

verl's ``multi_turn.tool_config_path`` names a YAML file::

    tools:
      - class_name: calculator            # or engine.tools.calculator.CalculatorTool
        config: {timeout_s: 5}
        tool_schema:
          type: function
          function: {name: calc, description: ..., parameters: {...}}

verl imports ``class_name`` as a Python path. Here it is looked up in :data:`TOOL_CLASSES`, the
registry of built-in tools, by its registered name or its qualified class name; nothing else is
imported, so a tools YAML is data, not code, and a studio member's file cannot run anything the
server did not install. A tool is a plain synchronous class: ``execute(arguments, extra_info)``
returns the answer's text or raises (``engine.rollout.tool_calls`` turns both a raise and a
timeout into a recorded tool error).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from engine.tools.tiny_uris import resolve_tiny_uri

_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
DEFAULT_TIMEOUT_S = 10.0


class ToolError(Exception):
    """A refusal or failure the tool reports to the policy as the tool's answer."""


class Tool:
    """Base class of the built-in tools: ``name`` and ``schema`` come from the tools YAML."""

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any]) -> None:
        self.config = dict(config or {})
        self.schema = tool_schema
        self.name: str = tool_schema["function"]["name"]
        timeout = self.config.get("timeout_s", DEFAULT_TIMEOUT_S)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(
                f"{_KEY}: tool {self.name!r} has config.timeout_s={timeout!r}; give seconds > 0"
            )
        self.timeout_s = float(timeout)

    def execute(self, arguments: dict[str, Any], extra_info: dict[str, Any]) -> str:
        """Return the tool's answer to a call with ``arguments`` for the row ``extra_info``."""
        raise NotImplementedError


TOOL_CLASSES: dict[str, type[Tool]] = {}


def register_tool(name: str) -> Callable[[type[Tool]], type[Tool]]:
    """Register a built-in tool class under ``name`` and its qualified class name."""

    def decorate(cls: type[Tool]) -> type[Tool]:
        for key in (name, f"{cls.__module__}.{cls.__qualname__}"):
            if key in TOOL_CLASSES:
                raise ValueError(f"tool class {key!r} is registered twice")
            TOOL_CLASSES[key] = cls
        return cls

    return decorate


def _builtin_names() -> str:
    import engine.tools.calculator  # noqa: F401  (registers the built-in tools)

    return ", ".join(sorted(TOOL_CLASSES))


def _check_schema(where: str, schema: Any) -> dict[str, Any]:
    if not isinstance(schema, dict) or schema.get("type") != "function":
        raise ValueError(f"{where}.tool_schema must be {{type: function, function: {{...}}}}")
    function = schema.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f"{where}.tool_schema.function needs a string 'name'")
    if not function["name"].strip():
        raise ValueError(f"{where}.tool_schema.function.name is empty")
    return schema


def load_tools(path: str | Path) -> dict[str, Tool]:
    """Return the tools the YAML at ``path`` (a file, or ``tiny://calculator/tools.yaml``) lists,
    keyed by their function name."""
    file = Path(resolve_tiny_uri(str(path))).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{_KEY}={str(path)!r} is not a file; point it at a tools YAML")
    try:
        spec = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{_KEY}={str(path)!r} is not valid YAML: {exc}") from exc
    entries = spec.get("tools") if isinstance(spec, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{_KEY}={str(path)!r} needs a non-empty list under 'tools:'")
    names = _builtin_names()
    tools: dict[str, Tool] = {}
    for i, entry in enumerate(entries):
        where = f"{file.name}: tools[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping with class_name and tool_schema")
        class_name = entry.get("class_name")
        if class_name not in TOOL_CLASSES:
            raise ValueError(
                f"{where}.class_name={class_name!r} is not a built-in tool; tool classes are not "
                f"imported from the YAML. Built-in tools: {names}"
            )
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{where}.config must be a mapping")
        tool = TOOL_CLASSES[class_name](config, _check_schema(where, entry.get("tool_schema")))
        if tool.name in tools:
            raise ValueError(f"{where}: two tools are named {tool.name!r}; rename one")
        tools[tool.name] = tool
    return tools
