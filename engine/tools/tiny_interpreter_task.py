"""A tiny task that needs the code interpreter: three-digit multiplication.

The embedded tiny model adds two-digit numbers after its warm start and cannot multiply
three-digit ones; a Python program can. The task offers one tool, the built-in
``code_interpreter`` (``engine.tools.code_interpreter``: each program runs in the code reward's
bubblewrap sandbox), and the policy calls it with a one-line program::

    <tool_call>{"name": "python", "arguments": {"code": "print(123*456)"}}</tool_call>

As for the calculator task (``engine.tools.tiny_task``; both are ``engine.tools.tool_task``'s
recipe), a policy that learns from scratch never writes such a call by chance, so the
behaviour is seeded by a short supervised pass on transcripts, a share of them calling the
interpreter and copying what it printed, the rest answering directly. RL then learns from the
answer reward alone (data source ``tiny_interpreter``, scored by ``engine.rewards.tiny_calculator``:
the first integer the program printed when the policy called it)::

    python -m engine.tools.tiny_interpreter_task /tmp/interp     # builds model/, data/, tools.yaml
    python -m engine.main_ppo --config-name grpo_tiny $(cat /tmp/interp/overrides.txt)

or ``--config-name grpo_tiny_interpreter``, which names the task by ``tiny://interpreter/*`` URIs
and builds it on first use. Measured in ``docs/results.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine.tools.tool_task import ToolTask, build_from_command_line, ensure_task

TOOLS_YAML = """tools:
  - class_name: code_interpreter
    config: {type: native, timeout_s: 5}
    tool_schema:
      type: function
      function:
        name: python
        description: Run a Python program and read what it prints.
        parameters:
          type: object
          properties:
            code: {type: string, description: "e.g. print(123*456)"}
          required: [code]
"""

INTERPRETER_TASK = ToolTask(
    name="interpreter",
    data_source="tiny_interpreter",
    op="*",
    tools_yaml=TOOLS_YAML,
    tool_name="python",
    argument="code",
    argument_template="print({expr})",
    reply_template="{answer}\n",  # print's line, as the sandbox returns it
    max_response_length=128,
    max_tool_response_length=16,
)


def ensure_interpreter_task(data_dir: Path | None = None) -> Path:
    """Return the folder of the built task (``<data_dir>/tiny_interpreter/<hash>/``)."""
    return ensure_task(INTERPRETER_TASK, data_dir)


def main(argv: list[str] | None = None) -> int:
    """Build the task into the folder given on the command line."""
    return build_from_command_line(INTERPRETER_TASK, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
