"""RL health checks on a run's metric stream: pure functions of one step and a small state.

Each recorded step, :func:`evaluate_step` reads that step's metrics (verl's names, as
``engine.trainer.metrics`` and the actor write them), the run's :class:`RunContext` (from its
config) and a :class:`HealthState` that keeps only what the checks need of earlier steps: the
first few entropy and length values, the last grad norms, the validation points of one window
and the train reward since the last validation. So a check never re-reads a run's history, and
the state (a few hundred bytes of JSON) is stored beside the run between steps.

The checks, each firing at most once per run (``CHECKS``; thresholds in :class:`Thresholds`,
set by the ``POSTTRAIN_HEALTH_*`` settings, see docs/health.md):

- ``entropy_collapse``: ``actor/entropy`` under ``entropy_fraction`` of its early value (the
  mean of the first ``baseline_steps`` steps) or under the absolute ``entropy_floor``.
- ``kl_over_target``: ``actor/kl_loss`` (KL loss) or ``actor/reward_kl_penalty`` (KL in the
  reward) over ``kl_target_factor`` x ``algorithm.kl_ctrl.target_kl`` when an adaptive or PID
  controller aims at that target, else over ``kl_max``.
- ``clip_fraction_high``: ``actor/pg_clipfrac`` over ``clipfrac_max``.
- ``reward_hacking``: over the last ``hacking_window`` validations, a ``val-core/*/mean@*``
  metric trends down while the train reward (``critic/score/mean``, averaged between
  validations) trends up, each by at least ``hacking_min_change`` (least-squares lines).
- ``length_collapse``: ``response_length/mean`` under ``length_fraction`` of its early value.
- ``length_at_limit``: ``response_length/clip_ratio`` (share of responses at
  ``data.max_response_length``) over ``length_clip_max``.
- ``non_finite_loss``: a loss or grad norm of the actor or critic is NaN or infinite.
- ``grad_norm_spike``: ``actor/grad_norm`` over ``grad_norm_factor`` x the median of the last
  ``grad_norm_window`` finite values (once ``baseline_steps`` are known).
- ``reward_errors``: ``reward/failed`` (samples whose reward function raised, recorded by the
  trainer) over ``reward_error_rate`` of the step's samples (train_batch_size x rollout.n).
- ``memory_growth``: a process's resident memory (``perf/driver/rss_gb`` or the largest rank's
  ``perf/max_rss_gb``, ``engine.perf``) grows so that, extrapolated over the steps left (its
  least-squares slope over the last ``memory_window`` steps after the first ``baseline_steps``,
  times the run's remaining steps), it would add more than the memory still available on the
  machine (``perf/min_memory_available_gb``): the run would die of memory before it ends.
- ``stale_drops`` (asynchronous training): ``async/dropped_stale_samples`` (samples the trainer
  threw away as too old for ``async/max_allowed_staleness``) over ``stale_drop_rate`` of the
  step's samples (train_batch_size x rollout.n): most of the rollout's work is wasted.
- ``trainer_starved`` (asynchronous training, the steps that record the rollout worker's
  ``timing_s/rollout_worker_gen``): the trainer's wait for rollouts ``timing_s/gen`` over
  ``wait_share`` of ``timing_s/step`` in each of the last ``wait_steps`` steps: generation is
  the bottleneck and the overlap does not hide it (in a synchronous run ``timing_s/gen`` is the
  generation itself, a large share by nature, and is not judged).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

# Every check's name and the badge text the pages show for it.
CHECKS: dict[str, str] = {
    "entropy_collapse": "entropy collapse",
    "kl_over_target": "KL over target",
    "clip_fraction_high": "clip fraction high",
    "reward_hacking": "reward up, validation down",
    "length_collapse": "length collapse",
    "length_at_limit": "length at limit",
    "non_finite_loss": "NaN/inf loss",
    "grad_norm_spike": "grad-norm spike",
    "reward_errors": "reward errors",
    "memory_growth": "memory runs out",
    "stale_drops": "stale samples dropped",
    "trainer_starved": "trainer waits for rollouts",
}

ENTROPY = "actor/entropy"
KL_METRICS = ("actor/kl_loss", "actor/reward_kl_penalty")
CLIPFRAC = "actor/pg_clipfrac"
TRAIN_REWARD = "critic/score/mean"
VALIDATION = re.compile(r"^val-core/.+/mean@\d+$")
LENGTH = "response_length/mean"
LENGTH_CLIP = "response_length/clip_ratio"
GRAD_NORM = "actor/grad_norm"
REWARD_FAILED = "reward/failed"
RSS_METRICS = ("perf/driver/rss_gb", "perf/max_rss_gb")
MEMORY_AVAILABLE = "perf/min_memory_available_gb"
STALE_DROPPED = "async/dropped_stale_samples"
TRAINER_WAIT = "timing_s/gen"
STEP_TIME = "timing_s/step"
ROLLOUT_WORKER_GEN = "timing_s/rollout_worker_gen"  # recorded by the asynchronous trainers only
# A metric whose non-finite value means the update itself broke.
NON_FINITE = re.compile(r"^(actor|critic)/(.*loss|grad_norm)$")

Metrics = Mapping[str, Any]


@dataclass(frozen=True)
class Thresholds:
    """When each check fires (``health_thresholds()`` reads them from the settings)."""

    baseline_steps: int  # the first steps whose mean is a metric's early value
    entropy_fraction: float
    entropy_floor: float
    kl_target_factor: float
    kl_max: float
    clipfrac_max: float
    hacking_window: int  # validation points whose trends are compared
    hacking_min_change: float
    length_fraction: float
    length_clip_max: float
    grad_norm_factor: float
    grad_norm_window: int
    reward_error_rate: float
    memory_window: int  # the last steps whose resident memory gives its growth per step
    stale_drop_rate: float
    wait_share: float
    wait_steps: int  # steps in a row the trainer's wait must exceed wait_share


@dataclass(frozen=True)
class RunContext:
    """What the checks need of a run's config."""

    target_kl: float | None  # the KL controller's target, when it has one
    samples_per_step: int | None  # train_batch_size x rollout.n
    total_steps: int | None = None  # the run's last step, as the trainer reported it

    @classmethod
    def from_config(cls, config: Mapping[str, Any], total_steps: int | None = None) -> RunContext:
        """Return the context of a run's resolved engine config (and its step count, known
        once the trainer started)."""
        kl_ctrl = config.get("algorithm", {}).get("kl_ctrl", {})
        target = kl_ctrl.get("target_kl") if kl_ctrl.get("type") in ("adaptive", "pid") else None
        batch = config.get("data", {}).get("train_batch_size")
        n = config.get("actor_rollout_ref", {}).get("rollout", {}).get("n", 1)
        return cls(
            target_kl=float(target) if target else None,
            samples_per_step=int(batch) * int(n) if batch else None,
            total_steps=total_steps,
        )


@dataclass
class HealthState:
    """What the checks keep of earlier steps; stored as JSON between steps."""

    last_step: int = -1
    fired: list[str] = field(default_factory=list)
    entropy_early: list[float] = field(default_factory=list)
    length_early: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)  # the last grad_norm_window values
    reward_sum: float = 0.0  # train reward since the last validation
    reward_count: int = 0
    # validation metric -> [[step, value, mean train reward since the validation before]]
    validations: dict[str, list[list[float]]] = field(default_factory=dict)
    # resident-memory metric -> [[step, GiB]] of its last memory_window steps after warm-up
    memory: dict[str, list[list[float]]] = field(default_factory=dict)
    wait_streak: int = 0  # asynchronous steps in a row the trainer waited over wait_share

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HealthState:
        return cls(**data)


class Finding(NamedTuple):
    """A check that fired: its name, the step and one line saying why."""

    check: str
    step: int
    message: str


def _number(value: Any) -> float | None:
    """Return ``value`` as a float (NaN and inf kept), None when it is not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _finite(metrics: Mapping[str, Any], name: str) -> float | None:
    value = _number(metrics.get(name))
    return value if value is not None and math.isfinite(value) else None


def _share_of_step(
    metrics: Mapping[str, Any], name: str, context: RunContext
) -> tuple[float, float] | None:
    """Return a per-step sample count and its share of the step's samples; None when it is
    zero, missing, or the step's sample count is unknown."""
    count = _finite(metrics, name)
    if not count or not context.samples_per_step:
        return None
    return count, count / context.samples_per_step


def _g(value: float) -> str:
    return f"{value:.4g}"


def _early(values: list[float], value: float | None, steps: int) -> float | None:
    """Add ``value`` to a metric's first ``steps`` values; return their mean once all are in
    and ``value`` was not one of them, else None."""
    if value is None:
        return None
    if len(values) < steps:
        values.append(value)
        return None
    return statistics.fmean(values)


def check_entropy(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    value = _finite(metrics, ENTROPY)
    early = _early(state.entropy_early, value, t.baseline_steps)
    if value is None:
        return None
    if value < t.entropy_floor:
        return Finding(
            "entropy_collapse",
            step,
            f"{ENTROPY} {_g(value)} is under the floor {t.entropy_floor:g}",
        )
    if early is not None and value < t.entropy_fraction * early:
        return Finding(
            "entropy_collapse",
            step,
            f"{ENTROPY} fell to {_g(value)}, under {t.entropy_fraction:.0%} of its early value "
            f"{_g(early)}",
        )
    return None


def check_kl(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    if context.target_kl:
        limit = t.kl_target_factor * context.target_kl
        what = f"{t.kl_target_factor:g} x target_kl {context.target_kl:g}"
    else:
        limit, what = t.kl_max, f"the limit {t.kl_max:g}"
    for name in KL_METRICS:
        value = _finite(metrics, name)
        if value is not None and value > limit:
            return Finding("kl_over_target", step, f"{name} {_g(value)} is over {what}")
    return None


def check_clip_fraction(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    value = _finite(metrics, CLIPFRAC)
    if value is not None and value > t.clipfrac_max:
        return Finding(
            "clip_fraction_high",
            step,
            f"{CLIPFRAC} {value:.0%} of tokens is over {t.clipfrac_max:.0%}: updates move the "
            "policy too far (lower the learning rate or the PPO epochs)",
        )
    return None


def _slope(xs: list[float], ys: list[float]) -> float:
    """Return the least-squares slope of ``ys`` over ``xs``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def check_reward_hacking(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    reward = _finite(metrics, TRAIN_REWARD)
    if reward is not None:
        state.reward_sum += reward
        state.reward_count += 1
    names = sorted(name for name in metrics if VALIDATION.match(name))
    if not names:
        return None
    interval = state.reward_sum / state.reward_count if state.reward_count else None
    state.reward_sum, state.reward_count = 0.0, 0
    finding = None
    for name in names:
        value = _finite(metrics, name)
        if value is None or interval is None:
            continue
        points = state.validations.setdefault(name, [])
        points.append([step, value, interval])
        del points[: -t.hacking_window]
        if len(points) < t.hacking_window or finding is not None:
            continue
        steps = [p[0] for p in points]
        span = steps[-1] - steps[0]
        val_change = _slope(steps, [p[1] for p in points]) * span
        reward_change = _slope(steps, [p[2] for p in points]) * span
        if val_change <= -t.hacking_min_change and reward_change >= t.hacking_min_change:
            finding = Finding(
                "reward_hacking",
                step,
                f"{name} fell {_g(-val_change)} over steps {steps[0]}-{steps[-1]} while "
                f"{TRAIN_REWARD} rose {_g(reward_change)}: the policy may be gaming the reward",
            )
    return finding


def check_length_collapse(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    value = _finite(metrics, LENGTH)
    early = _early(state.length_early, value, t.baseline_steps)
    if value is not None and early is not None and value < t.length_fraction * early:
        return Finding(
            "length_collapse",
            step,
            f"{LENGTH} fell to {_g(value)} tokens, under {t.length_fraction:.0%} of its early "
            f"value {_g(early)}",
        )
    return None


def check_length_at_limit(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    value = _finite(metrics, LENGTH_CLIP)
    if value is not None and value > t.length_clip_max:
        return Finding(
            "length_at_limit",
            step,
            f"{value:.0%} of responses reach data.max_response_length ({LENGTH_CLIP} over "
            f"{t.length_clip_max:.0%})",
        )
    return None


def check_non_finite(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    for name in sorted(metrics):
        value = _number(metrics[name])
        if NON_FINITE.match(name) and value is not None and not math.isfinite(value):
            return Finding("non_finite_loss", step, f"{name} is {value}")
    return None


def check_grad_norm(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    value = _finite(metrics, GRAD_NORM)
    if value is None:
        return None
    history = state.grad_norms
    finding = None
    if len(history) >= t.baseline_steps:
        median = statistics.median(history)
        if median > 0 and value > t.grad_norm_factor * median:
            finding = Finding(
                "grad_norm_spike",
                step,
                f"{GRAD_NORM} {_g(value)} is {value / median:.0f} x the median {_g(median)} of "
                f"the last {len(history)} steps",
            )
    history.append(value)
    del history[: -t.grad_norm_window]
    return finding


def check_reward_errors(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    share = _share_of_step(metrics, REWARD_FAILED, context)
    if share is None:
        return None
    failed, rate = share
    if rate > t.reward_error_rate:
        return Finding(
            "reward_errors",
            step,
            f"the reward function raised on {failed:.0f} of {context.samples_per_step} samples "
            f"({rate:.0%}, over {t.reward_error_rate:.0%}); the samples show the errors",
        )
    return None


def check_memory_growth(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    if step <= t.baseline_steps:  # the first steps fill caches and allocator pools
        return None
    for name in RSS_METRICS:
        value = _finite(metrics, name)
        if value is not None:
            points = state.memory.setdefault(name, [])
            points.append([step, value])
            del points[: -t.memory_window]
    available = _finite(metrics, MEMORY_AVAILABLE)
    remaining = (context.total_steps or 0) - step
    if available is None or remaining <= 0:
        return None
    for name, points in sorted(state.memory.items()):
        if len(points) < max(t.memory_window, 2) or points[-1][0] != step:
            continue
        steps = [p[0] for p in points]
        per_step = _slope(steps, [p[1] for p in points])  # GiB per step
        growth = per_step * remaining
        if per_step > 0 and growth > available:
            return Finding(
                "memory_growth",
                step,
                f"{name} grows {_g(per_step)} GiB per step (steps {steps[0]}-{steps[-1]}): the "
                f"{remaining} steps left would add {_g(growth)} GiB, more than the "
                f"{_g(available)} GiB available, so memory runs out near step "
                f"{step + int(available / per_step)} of {context.total_steps}",
            )
    return None


def check_stale_drops(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    share = _share_of_step(metrics, STALE_DROPPED, context)
    if share is None:
        return None
    dropped, rate = share
    if rate > t.stale_drop_rate:
        return Finding(
            "stale_drops",
            step,
            f"{dropped:.0f} samples were dropped as stale beside the step's "
            f"{context.samples_per_step} ({rate:.0%}, over {t.stale_drop_rate:.0%}): the "
            "rollout's work is wasted; sync the weights more often "
            "(async_training.trigger_parameter_sync_step) or let the rollout run less far "
            "ahead (async_training.staleness_threshold)",
        )
    return None


def check_trainer_starved(
    state: HealthState, step: int, metrics: Metrics, context: RunContext, t: Thresholds
) -> Finding | None:
    wait, total = _finite(metrics, TRAINER_WAIT), _finite(metrics, STEP_TIME)
    if ROLLOUT_WORKER_GEN not in metrics or wait is None or not total:
        return None
    share = wait / total
    state.wait_streak = state.wait_streak + 1 if share > t.wait_share else 0
    if state.wait_streak < t.wait_steps:
        return None
    return Finding(
        "trainer_starved",
        step,
        f"the trainer waited for rollouts {share:.0%} of step {step} ({TRAINER_WAIT} "
        f"{_g(wait)} s of {STEP_TIME} {_g(total)} s), over {t.wait_share:.0%} in each of the "
        f"last {t.wait_steps} steps: generation is the bottleneck the overlap cannot hide; "
        "shorten the responses, give the rollout more resources, or let it run further ahead "
        "(async_training.staleness_threshold)",
    )


# In the order of CHECKS; each updates the state it keeps and returns a finding or None.
CHECK_FUNCTIONS: tuple[Callable[..., Finding | None], ...] = (
    check_entropy,
    check_kl,
    check_clip_fraction,
    check_reward_hacking,
    check_length_collapse,
    check_length_at_limit,
    check_non_finite,
    check_grad_norm,
    check_reward_errors,
    check_memory_growth,
    check_stale_drops,
    check_trainer_starved,
)


def evaluate_step(
    state: HealthState,
    step: int,
    metrics: Mapping[str, Any],
    *,
    context: RunContext,
    thresholds: Thresholds,
) -> list[Finding]:
    """Update ``state`` with one step's metrics; return the checks that fire for the first time.

    A step at or before ``state.last_step`` (a retried write) changes nothing and fires nothing.
    """
    if step <= state.last_step:
        return []
    state.last_step = step
    findings = []
    for check in CHECK_FUNCTIONS:
        finding = check(state, step, metrics, context, thresholds)
        if finding is not None and finding.check not in state.fired:
            state.fired.append(finding.check)
            findings.append(finding)
    return findings
