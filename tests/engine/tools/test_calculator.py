"""The built-in calculator: exact arithmetic, and refusals that name what was refused."""

from __future__ import annotations

import pytest

from engine.tools import TOOL_CLASSES, ToolError
from engine.tools.calculator import CalculatorTool, evaluate

SCHEMA = {"type": "function", "function": {"name": "calc"}}


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("123+456", 579),
        ("2*(3+4)", 14),
        ("7/2", 3.5),
        ("-7//2", -4),
        ("10%3", 1),
        ("2**10", 1024),
        ("-(2-5)", 3),
        ("1.5*4", 6.0),
    ],
)
def test_arithmetic_is_exact(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('__import__("os").system("true")', "Call is not allowed"),
        ("x+1", "Name is not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("[1][0]", "Subscript is not allowed"),
        ("'a'*3", "only numbers are allowed"),
        ("True+1", "only numbers are allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("9**9**9", "exponents are limited to 64"),
        ("2**1000", "exponents are limited to 64"),
        ("99**60", "more than 100 digits"),
        ("10**60*10**60", "more than 100 digits"),
        ("1e308*10", "not a finite number"),
        ("(-8)**0.5", "not a real number"),
        ("1/0", "division by zero"),
        ("1+", "not valid arithmetic"),
        ("1+" * 150 + "1", "longer than 200 characters"),
    ],
)
def test_everything_else_is_refused_with_its_reason(expression, message):
    with pytest.raises(ToolError, match=message):
        evaluate(expression)


def test_the_tool_is_registered_under_its_name_and_its_class_path():
    assert TOOL_CLASSES["calculator"] is CalculatorTool
    assert TOOL_CLASSES["engine.tools.calculator.CalculatorTool"] is CalculatorTool


def test_the_tool_reads_its_argument_and_formats_whole_numbers():
    tool = CalculatorTool({"argument": "expr"}, SCHEMA)
    assert tool.name == "calc"
    assert tool.execute({"expr": "6/3"}, {}) == "2"
    assert tool.execute({"expr": "7/2"}, {}) == "3.5"
    with pytest.raises(ToolError, match="missing argument 'expr'"):
        tool.execute({"expression": "1"}, {})
    with pytest.raises(ToolError, match="must be a string"):
        tool.execute({"expr": 12}, {})
