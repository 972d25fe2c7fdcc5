"""The ``code_interpreter`` tool: the policy's program runs in the code reward's bubblewrap
sandbox with its limits, loaded from verl's tools YAML; its output is the answer, and a failure
or a timeout is the turn's recorded tool error with its seconds."""

from __future__ import annotations

import pytest

from engine.rewards.sandbox import resolve_limits
from engine.rollout.tool_calls import ToolCall, run_tool_calls
from engine.tools import load_tools
from engine.tools.base import ToolError
from engine.tools.code_interpreter import GRACE_S, CodeInterpreterTool

INTERPRETER = """tools:
  - class_name: {cls}
    config: {{type: native{extra}}}
    tool_schema:
      type: function
      function:
        name: python
        description: Run a Python program and read what it prints.
        parameters: {{type: object, properties: {{code: {{type: string}}}}, required: [code]}}
"""


def interpreter(tmp_path, extra: str = "", cls: str = "code_interpreter") -> CodeInterpreterTool:
    path = tmp_path / "tools.yaml"
    path.write_text(INTERPRETER.format(cls=cls, extra=extra))
    tools = load_tools(path)
    assert list(tools) == ["python"]
    return tools["python"]  # type: ignore[return-value]


@pytest.mark.parametrize(
    "cls", ["code_interpreter", "engine.tools.code_interpreter.CodeInterpreterTool"]
)
def test_the_program_runs_and_its_output_is_the_answer(tmp_path, cls):
    tool = interpreter(tmp_path, cls=cls)
    assert tool.execute({"code": "print(sum(i * i for i in range(10)))"}, {}) == "285\n"
    assert tool.execute({"code": "x = 1"}, {}) == "(no output)"
    # The thread waits for the sandbox's own limit, the server's ceiling, and a little more.
    assert tool.timeout_s == resolve_limits().timeout_s + GRACE_S


def test_the_program_runs_behind_the_code_rewards_boundary(tmp_path):
    tool = interpreter(tmp_path)
    probe = (
        "import os, socket\n"
        "print(os.getuid(), sorted(os.environ), os.path.exists('/work'))\n"
        "print(os.path.exists('/etc/passwd'), os.path.exists('/home'))\n"
        "s = socket.socket()\n"
        "try:\n"
        "    s.connect(('127.0.0.1', 5432)); print('reached')\n"
        "except OSError as e:\n"
        "    print('no route')\n"
    )
    # Its own uid, the sandbox's five variables only, no project, no host files, no network.
    assert tool.execute({"code": probe}, {}) == (
        "65534 ['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR'] False\nFalse False\nno route\n"
    )


def test_an_error_is_the_tools_answer_with_what_was_printed(tmp_path):
    tool = interpreter(tmp_path)
    with pytest.raises(ToolError) as exc:
        tool.execute({"code": "print('half')\n1 / 0"}, {})
    assert str(exc.value) == ("ZeroDivisionError: division by zero\n(printed before it: 'half\\n')")
    with pytest.raises(ToolError, match="missing argument 'code'"):
        tool.execute({"program": "print(1)"}, {})


def test_a_program_past_its_limit_is_killed_and_recorded_on_the_turn(tmp_path):
    tool = interpreter(tmp_path, extra=", timeout_s: 1")
    assert tool.timeout_s == 1 + GRACE_S
    calls = [
        ToolCall("python", {"code": "while True: pass"}),
        ToolCall("python", {"code": "print(6 * 7)"}),
        ToolCall("python", {"code": "import sys; sys.exit(3)"}),
    ]
    results = run_tool_calls(calls, {"python": tool}, {}, max_parallel_calls=3)
    slow, right, exited = (r.to_dict() for r in results)
    assert slow["error"] == "ToolError: the program ran past its 1 s limit"
    assert slow["content"] == "Error: ToolError: the program ran past its 1 s limit"
    assert 1.0 <= slow["seconds"] < 1 + GRACE_S
    assert right["content"] == "42\n" and right["error"] is None and right["seconds"] > 0
    assert exited["error"] == "ToolError: exit status 3"


def test_the_yaml_may_lower_the_limits_but_not_raise_them(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SANDBOX_TIMEOUT_S", "2")
    tool = interpreter(tmp_path, extra=", timeout_s: 30, memory_mb: 64")
    assert tool.timeout_s == 2 + GRACE_S
    with pytest.raises(ToolError, match="MemoryError"):
        tool.execute({"code": "x = bytearray(256 * 2**20)"}, {})
    with pytest.raises(ValueError, match=r"config keys \['sandbox_fusion_url'\]"):
        interpreter(tmp_path, extra=", sandbox_fusion_url: http://x")


def test_under_the_local_guard_it_runs_the_same_program(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SANDBOX", "local")
    tool = interpreter(tmp_path)
    assert tool.execute({"code": "print(input.__name__, 2 ** 10)"}, {}) == "input 1024\n"
    with pytest.raises(ToolError, match="ValueError: no"):
        tool.execute({"code": "raise ValueError('no')"}, {})
