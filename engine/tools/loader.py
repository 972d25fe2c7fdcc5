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
its qualified class name; else, where ``POSTTRAIN_TOOL_MODULES_DIR`` names a folder of installed
tool modules (the studio sets it to its installed modules folder, ``POSTTRAIN_REWARD_MODULES_DIR``),
``module.ClassName`` names a :class:`~engine.tools.base.Tool` subclass in ``<folder>/module.py``
(``pkg.module.ClassName``: ``<folder>/pkg/module.py``). Nothing outside that folder is imported,
so a tools YAML is data, not code, and a studio member's file cannot run anything the server did
not install.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import yaml

import engine.tools.calculator  # noqa: F401  (registers the built-in tools)
import engine.tools.code_interpreter  # noqa: F401
from engine.tools.base import TOOL_CLASSES, TOOL_CONFIG_KEY, Tool
from engine.tools.tiny_uris import resolve_tiny_uri

TOOL_MODULES_ENV = "POSTTRAIN_TOOL_MODULES_DIR"


def installed_tool_class(class_name: str, where: str) -> type[Tool]:
    """Return the :class:`Tool` subclass ``module.ClassName`` from the installed tool modules
    (``POSTTRAIN_TOOL_MODULES_DIR``); ValueError naming ``where`` and the fix otherwise."""
    builtins = ", ".join(sorted(name for name in TOOL_CLASSES if "." not in name))
    folder_setting = os.environ.get(TOOL_MODULES_ENV)
    if not folder_setting:
        raise ValueError(
            f"{where}.class_name={class_name!r} is not a built-in tool ({builtins}), and no "
            f"folder of installed tools is set: a tool class is imported only from the folder "
            f"{TOOL_MODULES_ENV} names (the studio's installed modules folder)"
        )
    *module_parts, attr = class_name.split(".")
    if not module_parts or not all(part.isidentifier() for part in (*module_parts, attr)):
        raise ValueError(
            f"{where}.class_name={class_name!r} is neither a built-in tool ({builtins}) nor "
            "module.ClassName of an installed tool module"
        )
    folder = Path(folder_setting).expanduser().resolve()
    file = folder.joinpath(*module_parts[:-1], f"{module_parts[-1]}.py").resolve()
    if not file.is_relative_to(folder) or not file.is_file():
        raise ValueError(
            f"{where}.class_name={class_name!r}: no module {'/'.join(module_parts)}.py among the "
            f"installed tools in {folder}; built-in tools: {builtins}"
        )
    module_name = "posttrain_installed_tools." + ".".join(module_parts)
    module = sys.modules.get(module_name)
    if module is None or getattr(module, "__file__", None) != str(file):
        spec = importlib.util.spec_from_file_location(module_name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ValueError(
                f"{where}.class_name={class_name!r}: the installed module {file.name} failed to "
                f"import: {type(exc).__name__}: {exc}"
            ) from exc
        sys.modules[module_name] = module
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ValueError(
            f"{where}.class_name={class_name!r}: {file.name} has no class {attr} deriving from "
            "engine.tools.Tool (a tool implements execute(arguments, extra_info) -> str)"
        )
    return cls


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
    tools: dict[str, Tool] = {}
    for i, entry in enumerate(entries):
        where = f"{file.name}: tools[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping with class_name and tool_schema")
        class_name = entry.get("class_name")
        if not isinstance(class_name, str):
            raise ValueError(f"{where}.class_name must be a tool's name, e.g. calculator")
        cls = TOOL_CLASSES.get(class_name) or installed_tool_class(class_name, where)
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{where}.config must be a mapping")
        tool = cls(config, _check_schema(where, entry.get("tool_schema")))
        if tool.name in tools:
            raise ValueError(f"{where}: two tools are named {tool.name!r}; rename one")
        tools[tool.name] = tool
    return tools
