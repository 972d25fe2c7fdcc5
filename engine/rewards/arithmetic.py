"""Reward for the embedded tiny arithmetic task (``data_source == "tiny_arithmetic"``)."""

from __future__ import annotations

import re

DATA_SOURCE = "tiny_arithmetic"

_INTEGER = re.compile(r"-?\d+")


def extract_answer(solution_str: str) -> str | None:
    """Return the first integer in the response, or None when there is none."""
    match = _INTEGER.search(solution_str)
    return match.group(0) if match else None


def compute_score(solution_str: str, ground_truth: str, **_: object) -> float:
    """Return 1.0 when the first integer in the response equals the ground truth, else 0.0."""
    answer = extract_answer(solution_str)
    return 1.0 if answer is not None and int(answer) == int(ground_truth) else 0.0
