"""The built-in ``calculator`` tool: exact arithmetic on integers and decimals, never ``eval``.

The expression is parsed with :mod:`ast` and walked node by node; only numbers, parentheses,
unary ``+``/``-`` and the binary operators ``+ - * / // % **`` are accepted. Anything else (a
name, an attribute, a call, a subscript, a string) is refused with a message naming it. Bounds
keep one call cheap whatever a policy writes: the expression's length, the size of an exponent
and of every intermediate result (``9**9**9`` is refused before it is computed).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from engine.tools.base import Tool, ToolError, register_tool

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 100  # of any intermediate integer result

Number = int | float
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _bounded(value: Any) -> Number:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise ToolError("the result is not a real number")
    if isinstance(value, int) and len(str(abs(value))) > MAX_DIGITS:
        raise ToolError(f"the result has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not a finite number")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"exponents are limited to {MAX_EXPONENT} in absolute value")
    # |base| ** exponent has exponent * log10|base| digits: refuse before computing it.
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > MAX_DIGITS:
        raise ToolError(f"the result has more than {MAX_DIGITS} digits")
    try:
        return base**exponent
    except OverflowError as exc:
        raise ToolError("the result is too large") from exc


def _walk(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"only numbers are allowed, not {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_walk(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow):
            return _bounded(_power(left, right))
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError as exc:
            raise ToolError("division by zero") from exc
    raise ToolError(
        f"{type(node).__name__} is not allowed; use numbers, parentheses and + - * / // % **"
    )


def evaluate(expression: str) -> Number:
    """Return the value of an arithmetic ``expression``; ToolError saying what is refused."""
    if not isinstance(expression, str):
        raise ToolError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"the expression is not valid arithmetic: {exc.msg}") from exc
    return _walk(tree)


def format_number(value: Number) -> str:
    """Return ``value`` as text: integers exactly, whole floats without ``.0``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


@register_tool("calculator")
class CalculatorTool(Tool):
    """Evaluate the ``expression`` argument (``config.argument`` renames it) and return the value."""

    def execute(self, arguments: dict[str, Any], extra_info: dict[str, Any]) -> str:
        """Return the expression's value as text."""
        key = str(self.config.get("argument", "expression"))
        if key not in arguments:
            raise ToolError(f"missing argument {key!r}")
        return format_number(evaluate(arguments[key]))
