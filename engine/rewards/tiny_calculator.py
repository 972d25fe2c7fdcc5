"""Reward for the tiny tool tasks: the calculator task (``engine.tools.tiny_task``,
``data_source == "tiny_calculator"``) and the interpreter task
(``engine.tools.tiny_interpreter_task``, ``"tiny_interpreter"``), which score alike.

The task rewards getting the arithmetic right, by delegating it to the tool with the right
expression or by computing directly; the policy's closing words are not scored (copying the tool's
answer is a separate skill the tiny model does not pick up from the task's seeding pass).
"""

from __future__ import annotations

import re
from typing import Any

DATA_SOURCE = "tiny_calculator"

_INTEGER = re.compile(r"-?\d+")


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None
) -> float:
    """Return 1.0 when the response's answer equals the ground truth: the first integer of the
    last tool answer when the policy called a tool (after a failed call, of what it wrote next),
    else the first integer it wrote."""
    if "<tool_response>" in solution_str:
        solution_str = solution_str.rsplit("<tool_response>", 1)[1]
        if solution_str.startswith("Error:"):  # a failed call: the policy's own words count
            solution_str = solution_str.split("</tool_response>", 1)[-1]
    match = _INTEGER.search(solution_str)
    return 1.0 if match is not None and int(match.group(0)) == int(ground_truth) else 0.0
