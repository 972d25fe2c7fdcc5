"""Keyword reward: does the response mention the required words and avoid the forbidden ones?

Each keyword has a non-negative weight (a plain list means weight 1 each). The score is the
weight of required keywords present plus the weight of forbidden keywords absent, divided by the
total weight, so it lies in [0, 1]. Matching is case-insensitive and on whole words by default
(``"cat"`` does not match ``"concatenate"``). Required keywords come from the ``keywords``
argument or, when it is not given, from the ground truth (a list, a ``{word: weight}`` dict, or
a comma-separated string).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Keywords = Mapping[str, float] | Sequence[str] | str


def as_weights(keywords: Keywords | None) -> dict[str, float]:
    """Return ``{keyword: weight}`` from a dict, a list, or a comma-separated string."""
    if keywords is None:
        return {}
    if isinstance(keywords, str):
        keywords = [k for k in (part.strip() for part in keywords.split(",")) if k]
    if isinstance(keywords, Mapping):
        weights = {str(k): float(w) for k, w in keywords.items()}
    else:
        weights = {str(k): 1.0 for k in keywords}
    negative = [k for k, w in weights.items() if w < 0]
    if negative:
        raise ValueError(
            f"keyword weights must be >= 0; {negative} are negative. "
            "List a word you want avoided under 'forbidden' instead."
        )
    return weights


def mentions(
    text: str, keyword: str, *, case_sensitive: bool = False, whole_word: bool = True
) -> bool:
    """Return whether ``keyword`` occurs in ``text``."""
    pattern = re.escape(keyword)
    if whole_word:
        pattern = rf"(?<!\w){pattern}(?!\w)"
    return re.search(pattern, text, 0 if case_sensitive else re.IGNORECASE) is not None


def compute_score(
    solution_str: str,
    ground_truth: Any = None,
    *,
    keywords: Keywords | None = None,
    forbidden: Keywords | None = None,
    case_sensitive: bool = False,
    whole_word: bool = True,
) -> float:
    """Return the weighted fraction of required keywords present and forbidden ones absent."""
    required = as_weights(keywords if keywords is not None else ground_truth)
    avoided = as_weights(forbidden)
    total = sum(required.values()) + sum(avoided.values())
    if total <= 0:
        raise ValueError(
            "keyword reward has no keywords with positive weight; pass keywords=[...] "
            "(or a ground truth listing them) and/or forbidden=[...]"
        )

    def found(word: str) -> bool:
        return mentions(solution_str, word, case_sensitive=case_sensitive, whole_word=whole_word)

    earned = sum(w for word, w in required.items() if found(word))
    earned += sum(w for word, w in avoided.items() if not found(word))
    return earned / total
