"""DAPO's overlong reward shaping (arXiv 2503.14476, section 3.4), as verl's DAPO reward manager.

A response longer than ``max_resp_len - len`` tokens (``len``: the buffer) loses reward linearly,
up to ``penalty_factor`` at ``max_resp_len``:

    expected = max_resp_len - len
    exceed = L - expected
    penalty = min(-exceed / len * penalty_factor, 0)

so a response that ends before the buffer keeps its score and one cut off at the limit loses
``penalty_factor``. The settings arrive as verl's ``+reward_model.reward_kwargs.max_resp_len``
and ``+reward_model.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor,log}``, checked
with the other managers' ``reward_kwargs`` by ``engine.config.reward_kwargs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OverlongBuffer:
    """verl's ``overlong_buffer_cfg`` with ``max_resp_len``: the penalty's settings."""

    max_resp_len: int
    len: int
    penalty_factor: float
    log: bool = False

    def penalty(self, length: int) -> float:
        """Return the (non-positive) reward added to a response of ``length`` tokens."""
        expected = self.max_resp_len - self.len
        exceed = length - expected
        return min(-exceed / self.len * self.penalty_factor, 0.0)


def overlong_buffer(kwargs: dict[str, Any]) -> OverlongBuffer | None:
    """Return the penalty's settings from checked ``reward_kwargs``; None when it is off."""
    cfg = kwargs.get("overlong_buffer_cfg") or {}
    if not cfg.get("enable"):
        return None
    return OverlongBuffer(
        max_resp_len=int(kwargs["max_resp_len"]),
        len=int(cfg["len"]),
        penalty_factor=float(cfg.get("penalty_factor", 0.0)),
        log=bool(cfg.get("log", False)),
    )
