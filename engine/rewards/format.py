"""Format reward: a fixed score when the whole response matches a regular expression.

The default pattern is the reasoning format popularised by DeepSeek-R1 (Guo et al. 2025):
``<think>...</think>`` followed by ``<answer>...</answer>`` and nothing else. The match is a
``fullmatch`` on the stripped response with ``re.DOTALL``, so text outside the expected frame
fails; pass ``pattern`` for any other format. The ground truth is not used.
"""

from __future__ import annotations

import re
from typing import Any

DEFAULT_PATTERN = r"<think>.*?</think>\s*<answer>.*?</answer>"


def compute_score(
    solution_str: str,
    ground_truth: Any = None,
    *,
    pattern: str = DEFAULT_PATTERN,
    score: float = 1.0,
    flags: int = re.DOTALL,
) -> float:
    """Return ``score`` when the stripped response fully matches ``pattern``, else 0.0."""
    try:
        compiled = re.compile(pattern, flags)
    except re.error as exc:
        raise ValueError(f"format reward pattern {pattern!r} is not a valid regex: {exc}") from exc
    return float(score) if compiled.fullmatch(solution_str.strip()) else 0.0
