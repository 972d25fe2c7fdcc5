"""verl's tools YAML (``multi_turn.tool_config_path``): the built-in tools it lists, configured.

The YAML file reads::

    tools:
      - class_name: calculator            # or engine.tools.calculator.CalculatorTool
        config: {timeout_s: 5}
        tool_schema:
          type: function
          function: {name: calc, description: ..., parameters: {...}}

verl imports ``class_name`` as a Python path. Here it is looked up in
:data:`engine.tools.base.TOOL_CLASSES`, the registry of built-in tools, by its registered name or
its qualified class name; nothing else is imported, so a tools YAML is data, not code, and a
studio member's file cannot run anything the server did not install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import engine.tools.calculator  # noqa: F401  (registers the built-in tools)
import engine.tools.code_interpreter  # noqa: F401
from engine.tools.base import TOOL_CLASSES, TOOL_CONFIG_KEY, Tool
from engine.tools.tiny_uris import resolve_tiny_uri


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
        raise FileNotFoundError(
            f"{TOOL_CONFIG_KEY}={str(path)!r} is not a file; point it at a tools YAML"
        )
    try:
        spec = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{TOOL_CONFIG_KEY}={str(path)!r} is not valid YAML: {exc}") from exc
    entries = spec.get("tools") if isinstance(spec, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{TOOL_CONFIG_KEY}={str(path)!r} needs a non-empty list under 'tools:'")
    names = ", ".join(sorted(TOOL_CLASSES))
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
