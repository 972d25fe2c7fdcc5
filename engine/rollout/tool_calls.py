"""Tool calls inside a rollout: hermes parsing, running with a timeout, truncating the answer.

The hermes format (Qwen2.5, Hermes and most open chat models) puts each call in the assistant's
text as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; the answers go back as
``tool`` role messages, which the chat template renders (verl's ``multi_turn.format=hermes``).

Whatever the policy writes, a call ends as a :class:`ToolResult`: a malformed call (bad JSON, no
name, an unknown tool, an unclosed tag), a tool that raises, one that runs past its
``timeout_s`` and one that returns something other than text all become an answer
``"Error: ..."`` with ``error`` set, so the policy sees what went wrong and the run goes on. A
call that times out is abandoned, not killed (Python cannot stop a thread): its daemon thread
finishes or dies with the process. Calls beyond ``max_parallel_calls`` in one turn are dropped,
as in verl's tool agent loop.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine.rollout.names import TRUNCATE_SIDES
from engine.tools.base import Tool

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    """One parsed call; ``error`` says why it cannot run (then name/arguments may be empty)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class ToolResult:
    """One call's outcome: the answer text the policy sees, and the error if it failed."""

    name: str
    arguments: dict[str, Any]
    content: str
    error: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-serialisable dict (for the sample record)."""
        return {
            "name": self.name,
            "arguments": self.arguments,
            "content": self.content,
            "error": self.error,
            "seconds": round(self.seconds, 4),
        }


def _parse_one(body: str) -> ToolCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"the tool call is not valid JSON ({exc.msg})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall("", error='the tool call needs {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):  # left a string: refused below
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return ToolCall(call["name"], error="the tool call's arguments must be a JSON object")
    return ToolCall(call["name"], arguments)


def parse_hermes_tool_calls(text: str) -> list[ToolCall]:
    """Return the calls in an assistant message, in order; malformed ones carry an ``error``."""
    calls = [_parse_one(body) for body in _TOOL_CALL.findall(text)]
    rest = _TOOL_CALL.sub("", text)
    if "<tool_call>" in rest:
        calls.append(ToolCall("", error="the tool call is not closed with </tool_call>"))
    return calls


def truncate_tool_response(text: str, tokenizer: Any, max_tokens: int, side: str) -> str:
    """Return ``text`` cut to ``max_tokens`` tokens, as verl cuts it (verl counts characters).

    ``left`` keeps the first tokens, ``right`` the last, ``middle`` the first and last halves,
    each with verl's ``(truncated)`` marker where text was removed.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side={side!r}; use one of {TRUNCATE_SIDES}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    decode = tokenizer.decode
    if side == "left":
        return decode(ids[:max_tokens]) + "...(truncated)"
    if side == "right":
        return "(truncated)..." + decode(ids[len(ids) - max_tokens :])
    half = max_tokens // 2
    return decode(ids[:half]) + "...(truncated)..." + decode(ids[len(ids) - half :])


def _error(call: ToolCall, message: str, seconds: float = 0.0) -> ToolResult:
    return ToolResult(call.name, call.arguments, f"Error: {message}", message, seconds)


def run_tool_calls(
    calls: list[ToolCall],
    tools: dict[str, Tool],
    extra_info: dict[str, Any],
    *,
    max_parallel_calls: int,
) -> list[ToolResult]:
    """Run the first ``max_parallel_calls`` calls at once, each in a thread with its timeout."""
    calls = calls[:max_parallel_calls]
    outcomes: list[Any] = [None] * len(calls)
    threads: list[tuple[int, threading.Thread, Tool]] = []
    started = time.monotonic()
    results: list[ToolResult | None] = [None] * len(calls)
    for i, call in enumerate(calls):
        if call.error is not None:
            results[i] = _error(call, call.error)
        elif call.name not in tools:
            known = ", ".join(sorted(tools))
            results[i] = _error(call, f"unknown tool {call.name!r}; the tools are: {known}")
        else:

            def target(i: int = i, call: ToolCall = call) -> None:
                try:
                    outcomes[i] = ("ok", tools[call.name].execute(call.arguments, extra_info))
                except Exception as exc:  # a tool's failure is the policy's answer, not a crash
                    outcomes[i] = ("raised", f"{type(exc).__name__}: {exc}")

            thread = threading.Thread(target=target, name=f"tool-{call.name}", daemon=True)
            thread.start()
            threads.append((i, thread, tools[call.name]))
    for i, thread, tool in threads:
        call = calls[i]
        thread.join(max(0.0, tool.timeout_s - (time.monotonic() - started)))
        seconds = time.monotonic() - started
        outcome = outcomes[i]
        if thread.is_alive() or outcome is None:
            message = f"tool {call.name!r} timed out after {tool.timeout_s:g} s"
            results[i] = _error(call, message, seconds)
        elif outcome[0] == "raised":
            results[i] = _error(call, outcome[1], seconds)
        elif not isinstance(outcome[1], str):
            got = type(outcome[1]).__name__
            results[i] = _error(call, f"tool {call.name!r} returned {got}, not text", seconds)
        else:
            results[i] = ToolResult(call.name, call.arguments, outcome[1], None, seconds)
    return [r for r in results if r is not None]
