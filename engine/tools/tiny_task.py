"""A tiny task where a tool helps: three-digit addition with the built-in calculator.

The embedded tiny model adds two-digit numbers after its warm start and cannot add three-digit ones;
the calculator can. The behaviour is seeded, and this is said plainly: a short supervised pass (800
steps, on one torch thread) from the embedded tiny model on transcripts, ``TOOL_FRACTION`` of them
calling the tool and copying its answer, the rest answering directly (``engine.tools.tool_task``,
the recipe this task and the interpreter task share). RL then has both behaviours to choose from
and is rewarded for the right answer (``engine.rewards.tiny_calculator``, which the default
dispatch runs on the rows' data source: the calculator's answer when the policy called it), which
the tool makes reachable::

    python -m engine.tools.tiny_task /tmp/calc      # builds model/, data/, tools.yaml
    python -m engine.main_ppo --config-name grpo_tiny $(cat /tmp/calc/overrides.txt)
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine.rewards import tiny_calculator
from engine.tools.tool_task import ToolTask, build_from_command_line, ensure_task

TOOL_NAME = "calc"
ARGUMENT = "expr"
TOOLS_YAML = f"""tools:
  - class_name: calculator
    config: {{argument: {ARGUMENT}, timeout_s: 5}}
    tool_schema:
      type: function
      function:
        name: {TOOL_NAME}
        description: Evaluate an arithmetic expression exactly.
        parameters:
          type: object
          properties:
            {ARGUMENT}: {{type: string, description: "e.g. 123+456"}}
          required: [{ARGUMENT}]
"""

CALCULATOR_TASK = ToolTask(
    name="calculator",
    data_source=tiny_calculator.DATA_SOURCE,
    op="+",
    tools_yaml=TOOLS_YAML,
    tool_name=TOOL_NAME,
    argument=ARGUMENT,
    argument_template="{expr}",
    reply_template="{answer}",
    max_response_length=128,
    max_tool_response_length=16,
)


def tool_call_text(question: str) -> str:
    """Return the hermes call of the calculator on ``question`` (``"123+456="``)."""
    return CALCULATOR_TASK.call_text(question)


def calculator_overrides(out_dir: Path) -> list[str]:
    """Return the ``main_ppo`` overrides that train on the task built in ``out_dir``."""
    return CALCULATOR_TASK.overrides(out_dir)


def ensure_calculator_task(data_dir: Path | None = None) -> Path:
    """Return the folder of the built task (``<data_dir>/tiny_calculator/<hash>/``)."""
    return ensure_task(CALCULATOR_TASK, data_dir)


def main(argv: list[str] | None = None) -> int:
    """Build the task into the folder given on the command line."""
    return build_from_command_line(CALCULATOR_TASK, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
