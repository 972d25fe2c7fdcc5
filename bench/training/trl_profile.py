"""TRL's own per-phase timings (``trl.extras.profiling``), summed into a dict the arms read."""

from __future__ import annotations

from typing import Any


def capture_trl_profile() -> dict[str, float]:
    """Return a dict that from now on sums the seconds of each of TRL's profiled phases.

    TRL times ``generate``, ``_prepare_inputs``, ``compute_loss`` and the rest with its
    ``ProfilingContext``; each duration is added under the phase's name and still logged as TRL
    logs it. The caller reads the dict after a step and clears it.
    """
    import trl.extras.profiling as trl_profiling

    profile: dict[str, float] = {}
    original = trl_profiling.ProfilingContext._log_metrics

    def capture(self: Any, duration: float) -> None:
        profile[self.name] = profile.get(self.name, 0.0) + duration
        original(self, duration)

    trl_profiling.ProfilingContext._log_metrics = capture
    return profile
