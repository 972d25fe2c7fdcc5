"""The built-in ``code_interpreter`` tool: run the policy's Python program in the code reward's
sandbox and answer with what it printed (the ReTool / SkyRL pattern).

Each call runs one program, the ``code`` argument (``config.argument`` renames it), in a sandbox
of its own: ``engine.rewards.code_exec.run_program``, the same bubblewrap boundary and limits as
the code reward (``POSTTRAIN_SANDBOX``, its ceilings ``POSTTRAIN_SANDBOX_*``; the tools YAML's
``config`` may lower ``timeout_s``, ``memory_mb``, ``max_processes``, ``max_file_mb`` and
``max_output_bytes``, never raise them). Nothing is kept between calls: no state, no files.

The answer is the program's stdout (``(no output)`` when it printed nothing). A program that
raises, exits with a status other than 0, prints past ``max_output_bytes`` or runs past
``timeout_s`` is a tool error: the policy reads ``Error: ...`` with the last line of its stderr
(and what it printed before), and the turn records the error and the seconds it took, as for
every tool (``engine.rollout.tool_calls``). Without bubblewrap the tool does not load: the run
fails at its start with the sandbox's own sentence, rather than answering every call with an
error.
"""

from __future__ import annotations

from typing import Any

from engine import env
from engine.rewards import sandbox
from engine.rewards.code_exec import run_program
from engine.tools.base import TOOL_CONFIG_KEY, Tool, ToolError, register_tool

# The longest program a call may send, in characters.
MAX_CODE_CHARS = 20_000
# Seconds the tool's thread waits beyond the program's own limit (the sandbox's start and end).
GRACE_S = 5.0
# Its own config keys besides the sandbox limits; ``type`` is verl's (``native``).
_OWN_KEYS = ("argument", "type")


@register_tool("code_interpreter")
class CodeInterpreterTool(Tool):
    """Run the ``code`` argument as a Python program in the sandbox; return its stdout."""

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any]) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - set(env.SANDBOX_CEILINGS) - set(_OWN_KEYS))
        if unknown:
            raise ValueError(
                f"{TOOL_CONFIG_KEY}: tool {self.name!r} has config keys {unknown}; "
                f"code_interpreter takes {', '.join((*_OWN_KEYS, *env.SANDBOX_CEILINGS))}"
            )
        self.requested = {k: v for k, v in self.config.items() if k in env.SANDBOX_CEILINGS}
        limits = sandbox.resolve_limits(self.requested)  # the server's ceilings, read now
        if env.sandbox_mode() == "bwrap":
            sandbox.check_available()  # fails the run at its start, with the reason
        # The program's own limit kills it; the thread waits a little longer for the kill.
        self.timeout_s = limits.timeout_s + GRACE_S

    def execute(self, arguments: dict[str, Any], extra_info: dict[str, Any]) -> str:
        """Return what the program printed; ToolError with its error otherwise."""
        key = str(self.config.get("argument", "code"))
        code = arguments.get(key)
        if not isinstance(code, str):
            raise ToolError(f"missing argument {key!r}: the Python program to run, as text")
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"the program is longer than {MAX_CODE_CHARS} characters")
        limits = sandbox.resolve_limits(self.requested)
        stdout, error, timed_out = run_program(code, limits)
        if timed_out:
            error = f"the program ran past its {limits.timeout_s:g} s limit"
        if error is not None:
            printed = f"\n(printed before it: {stdout[-500:]!r})" if stdout else ""
            raise ToolError(f"{error}{printed}")
        return stdout or "(no output)"
