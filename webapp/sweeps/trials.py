"""What the search and the pruner know of a sweep's members, without Optuna (which is imported
only where a decision is made: ``webapp.sweeps.search``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMPLETE, PRUNED, RUNNING, FAILED = "complete", "pruned", "running", "failed"


@dataclass(frozen=True)
class MemberHistory:
    """What a decision needs of one member: its values, state and objective value by step."""

    index: int  # 1, 2, ...
    values: dict[str, Any]
    state: str  # COMPLETE, PRUNED, RUNNING or FAILED
    scores: dict[int, float] = field(default_factory=dict)  # step -> objective value
    pruned_rung: int | None = None  # successive halving: the rung a pruned member failed

    @property
    def final(self) -> float | None:
        """Return the value at the member's last recorded step, or None."""
        return self.scores[max(self.scores)] if self.scores else None


@dataclass(frozen=True)
class PruneDecision:
    """Why a member stops: its ``value`` at ``step`` is worse than ``threshold``."""

    metric: str
    step: int
    value: float  # the median pruner compares the member's best value so far
    threshold: float
    pruner: str
    rung: int | None = None  # successive halving only
    compared: int = 0  # how many members' values the threshold comes from

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "step": self.step,
            "value": self.value,
            "threshold": self.threshold,
            "pruner": self.pruner,
            "rung": self.rung,
            "compared": self.compared,
            "text": self.text(),
        }

    def text(self) -> str:
        """Return ``val-core/x/reward/mean@1 = 0.2 at step 10, below the median 0.35 of ...``."""
        worse = "below" if self.threshold > self.value else "above"
        if self.pruner == "median":
            what = f"the median {self.threshold:.4g} of {self.compared} finished member(s)"
            shown = f"best {self.metric} so far = {self.value:.4g} at step {self.step}"
        else:
            what = (
                f"the cutoff {self.threshold:.4g} of rung {self.rung} "
                f"({self.compared} member(s) reached it)"
            )
            shown = f"{self.metric} = {self.value:.4g} at step {self.step}"
        return f"{shown}, {worse} {what}"
