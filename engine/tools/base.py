"""The built-in tools' base class and registry: what a policy may call in a multi-turn rollout.

A tool is a plain synchronous class: ``execute(arguments, extra_info)`` returns the answer's text
or raises (``engine.rollout.tool_calls`` turns both a raise and a timeout into a recorded tool
error). :func:`register_tool` adds a class to :data:`TOOL_CLASSES` under its name and its
qualified class name; ``engine.tools.loader`` reads verl's tools YAML against that registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
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
                f"{TOOL_CONFIG_KEY}: tool {self.name!r} has config.timeout_s={timeout!r}; "
                "give seconds > 0"
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
