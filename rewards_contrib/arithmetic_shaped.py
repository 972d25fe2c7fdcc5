"""Shaped rewards for the embedded arithmetic task: examples of installed reward modules."""

from __future__ import annotations

from engine.rewards.arithmetic import compute_score as exact_answer


def correct_and_concise(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    max_chars: int = 4,
    length_penalty: float = 0.1,
) -> dict:
    """Score 1 for the right sum, minus a penalty per character beyond ``max_chars``."""
    correct = exact_answer(solution_str, ground_truth)
    overflow = max(0, len(solution_str.strip()) - max_chars)
    penalty = length_penalty * overflow
    return {"score": correct - penalty, "correct": correct, "length_penalty": -penalty}


def partial_digits(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """Score the share of answer digits in the right place (a denser signal than exact match)."""
    answer = solution_str.strip().split()[0] if solution_str.strip() else ""
    target = str(ground_truth)
    if not answer:
        return 0.0
    matches = sum(a == b for a, b in zip(answer[::-1], target[::-1], strict=False))
    return matches / max(len(target), len(answer))
