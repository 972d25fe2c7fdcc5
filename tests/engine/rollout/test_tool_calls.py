"""Hermes tool-call parsing, running tools with a timeout, and cutting long answers."""

from __future__ import annotations

import threading
import time

import pytest

from engine.rollout.tool_calls import (
    ToolCall,
    parse_hermes_tool_calls,
    run_tool_calls,
    truncate_tool_response,
)
from engine.tiny.tokenizer import build_tokenizer
from engine.tools import Tool
from engine.tools.calculator import CalculatorTool


def schema(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


class Raising(Tool):
    def execute(self, arguments, extra_info):
        raise RuntimeError("backend down")


class Hanging(Tool):
    release = threading.Event()

    def execute(self, arguments, extra_info):
        self.release.wait(30)
        return "late"


class Junk(Tool):
    def execute(self, arguments, extra_info):
        return {"not": "text"}


class Echo(Tool):
    def execute(self, arguments, extra_info):
        time.sleep(0.2)
        return f"{arguments['x']}@{extra_info['index']}"


def test_a_well_formed_call_is_parsed_with_its_arguments():
    text = (
        'let me check <tool_call>{"name": "calc", "arguments": {"expression": "1+2"}}</tool_call>'
    )
    assert parse_hermes_tool_calls(text) == [ToolCall("calc", {"expression": "1+2"})]


def test_several_calls_keep_their_order_and_string_arguments_are_decoded():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call>'
    )
    assert parse_hermes_tool_calls(text) == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": 2})]


def test_text_without_calls_has_none():
    assert parse_hermes_tool_calls("579") == []
    assert parse_hermes_tool_calls("</tool_call> only a closing tag") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>{name: calc}</tool_call>", "not valid JSON"),
        ('<tool_call>["calc"]</tool_call>', "needs {"),
        ('<tool_call>{"arguments": {}}</tool_call>', "needs {"),
        ('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calc", "arguments": {}}', "not closed"),
    ],
)
def test_malformed_calls_are_kept_with_their_error(text, message):
    (call,) = parse_hermes_tool_calls(text)
    assert call.error is not None and message in call.error


def test_errors_timeouts_and_junk_become_answers_not_exceptions():
    tools = {
        "raise": Raising({}, schema("raise")),
        "hang": Hanging({"timeout_s": 0.3}, schema("hang")),
        "junk": Junk({}, schema("junk")),
        "calc": CalculatorTool({}, schema("calc")),
    }
    calls = [
        ToolCall("raise"),
        ToolCall("hang"),
        ToolCall("junk"),
        ToolCall("calc", {"expression": "x"}),
        ToolCall("nope"),
        ToolCall("", error="the tool call is not valid JSON (Expecting value)"),
        ToolCall("calc", {"expression": "6*7"}),
    ]
    started = time.monotonic()
    results = run_tool_calls(calls, tools, {}, max_parallel_calls=10)
    Hanging.release.set()
    assert time.monotonic() - started < 5
    assert [r.error is not None for r in results] == [True] * 6 + [False]
    assert results[0].content == "Error: RuntimeError: backend down"
    assert "timed out after 0.3 s" in results[1].error
    assert "returned dict, not text" in results[2].error
    assert "Name is not allowed" in results[3].content
    assert "unknown tool 'nope'; the tools are: calc, hang, junk, raise" in results[4].error
    assert results[5].content.startswith("Error: the tool call is not valid JSON")
    assert results[6].content == "42"


def test_calls_run_in_parallel_up_to_the_limit_and_the_rest_are_dropped():
    tools = {"echo": Echo({}, schema("echo"))}
    calls = [ToolCall("echo", {"x": i}) for i in range(5)]
    started = time.monotonic()
    results = run_tool_calls(calls, tools, {"index": 7}, max_parallel_calls=3)
    assert [r.content for r in results] == ["0@7", "1@7", "2@7"]
    assert time.monotonic() - started < 0.55  # three 0.2 s calls at once, not one after another


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()  # one token per character


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("left", "abcd...(truncated)"),
        ("right", "(truncated)...ghij"),
        ("middle", "ab...(truncated)...ij"),
    ],
)
def test_long_answers_are_cut_at_the_configured_side(tokenizer, side, expected):
    assert truncate_tool_response("abcdefghij", tokenizer, 4, side) == expected
    assert truncate_tool_response("abcd", tokenizer, 4, side) == "abcd"


def test_an_unknown_side_is_refused(tokenizer):
    with pytest.raises(ValueError, match="left"):
        truncate_tool_response("abcdefghij", tokenizer, 4, "top")
