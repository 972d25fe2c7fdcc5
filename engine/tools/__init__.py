"""Tools for multi-turn rollouts: the registry of built-in tools and verl's tools YAML."""

from engine.tools.base import TOOL_CLASSES, Tool, ToolError, register_tool
from engine.tools.loader import load_tools

__all__ = ["TOOL_CLASSES", "Tool", "ToolError", "load_tools", "register_tool"]
