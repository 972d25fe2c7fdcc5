"""Exact-match reward (``data_source == "exact_match"``): the whole response is the answer.

Both sides are stripped of surrounding whitespace by default; ``case_sensitive=False`` compares
case-folded strings. A list of ground truths accepts any of them (several correct spellings).
"""

from __future__ import annotations

from collections.abc import Sequence


def normalize(text: str, *, strip: bool = True, case_sensitive: bool = True) -> str:
    """Return the text as compared: stripped and, when not case-sensitive, case-folded."""
    text = str(text)
    if strip:
        text = text.strip()
    return text if case_sensitive else text.casefold()


def compute_score(
    solution_str: str,
    ground_truth: str | Sequence[str],
    *,
    case_sensitive: bool = True,
    strip: bool = True,
) -> float:
    """Return 1.0 when the response equals the ground truth (or one of them), else 0.0."""
    truths = [ground_truth] if isinstance(ground_truth, str) else list(ground_truth)
    answer = normalize(solution_str, strip=strip, case_sensitive=case_sensitive)
    matches = (answer == normalize(t, strip=strip, case_sensitive=case_sensitive) for t in truths)
    return 1.0 if any(matches) else 0.0
