"""GSM8K reward (``data_source == "openai/gsm8k"``), with verl's extraction and scoring.

The answer is read from the last 300 characters of the response only (``_SOLUTION_CLIP_CHARS``):
the final answer comes last, and clipping keeps the regex cheap on long responses. ``strict``
needs the dataset's ``#### <number>`` format (and so also rewards following it); ``flexible``
takes the last number anywhere in that window. Commas and ``$`` are removed from a strict
answer, which is then compared to the ground truth as a string.

Reference: Trung, Luong et al. "ReFT: Reasoning with Reinforced Fine-Tuning." ACL 2024.
"""

from __future__ import annotations

import re

_SOLUTION_CLIP_CHARS = 300

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")
_NOT_A_NUMBER = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the final answer in the response, or None when there is none."""
    if method not in ("strict", "flexible"):
        raise ValueError(
            f"method={method!r} is not a GSM8K extraction method; use 'strict' or 'flexible'"
        )
    if len(solution_str) > _SOLUTION_CLIP_CHARS:
        solution_str = solution_str[-_SOLUTION_CLIP_CHARS:]

    if method == "strict":
        # verl takes the last "#### <number>" in the clipped window.
        solutions = _STRICT.findall(solution_str)
        if not solutions:
            return None
        return solutions[-1].replace(",", "").replace("$", "")

    final_answer = None
    for final_answer in reversed(_NUMBER.findall(solution_str)):
        if final_answer not in _NOT_A_NUMBER:
            break
    return final_answer


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Return ``score`` for the right answer, ``format_score`` for a wrong one, 0 for none."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score
