"""The health checks on synthetic metric streams: each fires at the step it should, once, and a
healthy stream (shaped like a real grpo_tiny run's metrics) fires none."""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Iterator

import pytest

from webapp.health.checks import (
    CHECK_FUNCTIONS,
    CHECKS,
    Finding,
    HealthState,
    RunContext,
    Thresholds,
    evaluate_step,
)
from webapp.health.services import health_thresholds

CONTEXT = RunContext(target_kl=None, samples_per_step=64)
VAL = "val-core/tiny_arithmetic/reward/mean@1"
TEST_FREQ = 5


@pytest.fixture
def thresholds() -> Thresholds:
    return health_thresholds()


def healthy(steps: int = 60, seed: int = 0) -> Iterator[tuple[int, dict[str, float]]]:
    """Yield (step, metrics) of a run that learns slowly and stays well: a validation at step 0
    and every TEST_FREQ steps, metric names and magnitudes as a real grpo_tiny run's."""
    rng = random.Random(seed)
    yield 0, {VAL: 0.31}
    for step in range(1, steps + 1):
        metrics = {
            "actor/entropy": 0.68 - 0.002 * step + rng.uniform(-0.02, 0.02),
            "actor/kl_loss": 0.001 * step,
            "actor/pg_loss": rng.uniform(-0.01, 0.01),
            "actor/pg_clipfrac": rng.uniform(0.0, 0.05),
            "actor/grad_norm": 1.3 + rng.uniform(-0.4, 0.4),
            "critic/score/mean": 0.2 + 0.005 * step + rng.uniform(-0.02, 0.02),
            "response_length/mean": 3.5 + rng.uniform(-0.3, 0.3),
            "response_length/clip_ratio": 0.0,
        }
        if step % TEST_FREQ == 0:
            metrics[VAL] = 0.31 + 0.004 * step
        yield step, metrics


def run_stream(stream, thresholds: Thresholds, context: RunContext = CONTEXT) -> list[Finding]:
    state = HealthState()
    findings: list[Finding] = []
    for step, metrics in stream:
        findings += evaluate_step(state, step, metrics, context=context, thresholds=thresholds)
        # The state goes through JSON between steps, as it does in the database.
        state = HealthState.from_dict(dataclasses.asdict(state))
    return findings


def changed(stream, from_step: int, **updates):
    """Yield ``stream`` with ``updates`` (name -> function of step and value) from ``from_step``."""
    for step, metrics in stream:
        if step >= from_step:
            metrics = dict(metrics)
            for name, update in updates.items():
                key = name.replace("__", "/")
                if key in metrics or key.startswith(("reward/", "actor/reward")):
                    metrics[key] = update(step, metrics.get(key))
        yield step, metrics


def test_every_check_has_a_label_and_a_function():
    assert len(CHECK_FUNCTIONS) == len(CHECKS)


def test_a_healthy_stream_fires_nothing(thresholds):
    for seed in range(5):
        assert run_stream(healthy(seed=seed), thresholds) == []


def test_entropy_collapse_fires_when_entropy_falls_under_a_tenth_of_its_early_value(thresholds):
    # early value ~0.676 (steps 1-3): 0.06 is under 10% of it, 0.08 is not.
    stream = changed(healthy(), 20, actor__entropy=lambda s, v: 0.08 if s < 30 else 0.06)
    [finding] = run_stream(stream, thresholds)
    assert finding.check == "entropy_collapse" and finding.step == 30
    early = [m["actor/entropy"] for s, m in healthy() if 1 <= s <= 3]
    assert finding.message == (
        f"actor/entropy fell to 0.06, under 10% of its early value {sum(early) / 3:.4g}"
    )


def test_entropy_collapse_fires_under_the_absolute_floor_even_in_the_first_steps(thresholds):
    stream = changed(healthy(), 2, actor__entropy=lambda s, v: 0.005)
    [finding] = run_stream(stream, thresholds)
    assert (finding.check, finding.step) == ("entropy_collapse", 2)
    assert finding.message == "actor/entropy 0.005 is under the floor 0.01"


def test_kl_fires_over_the_absolute_limit_without_a_target(thresholds):
    stream = changed(healthy(), 40, actor__kl_loss=lambda s, v: 1.0 + (s - 40) * 0.1)
    [finding] = run_stream(stream, thresholds)
    assert (finding.check, finding.step) == ("kl_over_target", 41)
    assert finding.message == "actor/kl_loss 1.1 is over the limit 1"


def test_kl_in_the_reward_is_compared_with_the_controllers_target(thresholds):
    context = RunContext(target_kl=0.02, samples_per_step=64)
    stream = changed(healthy(), 1, actor__reward_kl_penalty=lambda s, v: 0.002 * s)
    [finding] = run_stream(stream, thresholds, context)
    # 3 x 0.02 = 0.06 is first passed at step 31 (0.062); the KL loss (0.031) is under it.
    assert (finding.check, finding.step) == ("kl_over_target", 31)
    assert finding.message == "actor/reward_kl_penalty 0.062 is over 3 x target_kl 0.02"


def test_run_context_reads_the_target_only_of_a_controller_that_has_one():
    config = {
        "algorithm": {"kl_ctrl": {"type": "adaptive", "target_kl": 0.05}},
        "data": {"train_batch_size": 16},
        "actor_rollout_ref": {"rollout": {"n": 4}},
    }
    assert RunContext.from_config(config) == RunContext(target_kl=0.05, samples_per_step=64)
    config["algorithm"]["kl_ctrl"]["type"] = "fixed"
    assert RunContext.from_config(config).target_kl is None


def test_clip_fraction_fires_over_its_threshold(thresholds):
    stream = changed(healthy(), 12, actor__pg_clipfrac=lambda s, v: 0.25 if s < 15 else 0.45)
    [finding] = run_stream(stream, thresholds)
    assert (finding.check, finding.step) == ("clip_fraction_high", 15)
    assert finding.message.startswith("actor/pg_clipfrac 45% of tokens is over 30%")


def test_reward_hacking_fires_when_validation_falls_while_the_reward_rises(thresholds):
    # From step 30 the train reward climbs fast and validation falls 0.03 per validation.
    stream = changed(
        healthy(),
        30,
        critic__score__mean=lambda s, v: 0.35 + 0.02 * (s - 30),
        **{VAL.replace("/", "__"): lambda s, v: 0.43 - 0.006 * (s - 25)},
    )
    [finding] = run_stream(stream, thresholds)
    # Validations at 25 (0.41, before the change), 30, 35, 40 fall 0.03 each: the line through
    # them falls 0.072 over 25-40 and the mean train reward between validations climbs.
    assert (finding.check, finding.step) == ("reward_hacking", 40)
    assert finding.message.startswith(f"{VAL} fell 0.072 over steps 25-40 ")
    assert "while critic/score/mean rose" in finding.message


def test_validation_falling_with_the_reward_is_not_reward_hacking(thresholds):
    stream = changed(
        healthy(),
        30,
        critic__score__mean=lambda s, v: 0.35 - 0.01 * (s - 30),
        **{VAL.replace("/", "__"): lambda s, v: 0.43 - 0.006 * (s - 25)},
    )
    assert run_stream(stream, thresholds) == []


def test_length_collapse_fires_under_a_fifth_of_the_early_length(thresholds):
    stream = changed(healthy(), 25, response_length__mean=lambda s, v: 3.5 / (s - 23))
    [finding] = run_stream(stream, thresholds)
    # 3.5 / 4 = 0.875 at step 27 is over 20% of the early mean (3.578); 0.7 at step 28 is under.
    early = sum(m["response_length/mean"] for s, m in healthy() if 1 <= s <= 3) / 3
    assert f"{early:.4g}" == "3.578"
    assert (finding.check, finding.step) == ("length_collapse", 28)
    assert finding.message == (
        "response_length/mean fell to 0.7 tokens, under 20% of its early value 3.578"
    )


def test_length_at_limit_fires_when_most_responses_are_clipped(thresholds):
    stream = changed(healthy(), 33, response_length__clip_ratio=lambda s, v: 0.75)
    [finding] = run_stream(stream, thresholds)
    assert (finding.check, finding.step) == ("length_at_limit", 33)
    assert finding.message.startswith("75% of responses reach data.max_response_length")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_fires(thresholds, bad):
    stream = changed(healthy(), 17, actor__pg_loss=lambda s, v: bad)
    [finding] = run_stream(stream, thresholds)
    assert (finding.check, finding.step) == ("non_finite_loss", 17)
    assert finding.message == f"actor/pg_loss is {bad}"


def test_a_grad_norm_spike_fires_over_ten_times_the_running_median(thresholds):
    stream = changed(healthy(), 50, actor__grad_norm=lambda s, v: 9.0 if s == 50 else 20.0)
    [finding] = run_stream(stream, thresholds)
    # 9 is under 10 x ~1.3; 20 is over it (the median of the last 20 barely moves).
    assert (finding.check, finding.step) == ("grad_norm_spike", 51)
    assert finding.message.startswith("actor/grad_norm 20 is 1")


def test_reward_errors_fire_over_their_share_of_the_steps_samples(thresholds):
    # 6 of 64 (9%) is under 10%; 7 (11%) is over.
    stream = changed(healthy(), 8, reward__failed=lambda s, v: 6.0 if s < 10 else 7.0)
    [finding] = run_stream(stream, thresholds)
    assert (finding.check, finding.step) == ("reward_errors", 10)
    assert "raised on 7 of 64 samples (11%, over 10%)" in finding.message


def test_a_check_fires_once_and_a_retried_step_changes_nothing(thresholds):
    state = HealthState()
    bad = {"actor/pg_loss": math.nan}
    first = evaluate_step(state, 5, bad, context=CONTEXT, thresholds=thresholds)
    assert [f.check for f in first] == ["non_finite_loss"]
    assert evaluate_step(state, 6, bad, context=CONTEXT, thresholds=thresholds) == []
    before = dataclasses.asdict(state)
    assert (
        evaluate_step(state, 6, {"actor/grad_norm": 1e9}, context=CONTEXT, thresholds=thresholds)
        == []
    )
    assert dataclasses.asdict(state) == before


def test_the_state_stays_small_over_a_long_run(thresholds):
    state = HealthState()
    for step, metrics in healthy(steps=2000):
        evaluate_step(state, step, metrics, context=CONTEXT, thresholds=thresholds)
    assert len(state.grad_norms) == thresholds.grad_norm_window
    assert len(state.validations[VAL]) == thresholds.hacking_window
    assert len(state.entropy_early) == len(state.length_early) == thresholds.baseline_steps
    assert state.memory == {}  # no perf/ metrics in this stream


def test_the_memory_window_stays_small_over_a_long_run(thresholds):
    state = HealthState()
    context = RunContext(target_kl=None, samples_per_step=64, total_steps=5000)
    for step, metrics in memory_stream(0.0, steps=500):
        evaluate_step(state, step, metrics, context=context, thresholds=thresholds)
    assert {k: len(v) for k, v in state.memory.items()} == {
        "perf/driver/rss_gb": thresholds.memory_window,
        "perf/max_rss_gb": thresholds.memory_window,
    }


def memory_stream(per_step_gib: float, steps: int = 40, available: float = 8.0):
    """Yield steps whose driver RSS starts at 1.2 GiB and grows ``per_step_gib`` a step (with a
    little noise), and whose machine has ``available`` GiB left."""
    rng = random.Random(1)
    for step, metrics in healthy(steps):
        if step:
            rss = 1.2 + per_step_gib * step + rng.uniform(-0.005, 0.005)
            metrics = {
                **metrics,
                "perf/driver/rss_gb": rss,
                "perf/max_rss_gb": 0.6 + rng.uniform(-0.005, 0.005),
                "perf/min_memory_available_gb": available - per_step_gib * step,
            }
        yield step, metrics


def test_memory_growth_fires_when_the_steps_left_would_exhaust_the_memory(thresholds):
    # 0.1 GiB a step with 1000 steps to go is ~100 GiB against 8 available.
    context = RunContext(target_kl=None, samples_per_step=64, total_steps=1000)
    (finding,) = run_stream(memory_stream(0.1), thresholds, context)
    first = thresholds.baseline_steps + 1
    assert finding.check == "memory_growth"
    assert finding.step == first + thresholds.memory_window - 1  # once the window is full
    match = re.match(
        r"perf/driver/rss_gb grows ([\d.]+) GiB per step \(steps 4-13\): the 987 steps left "
        r"would add ([\d.]+) GiB, more than the 6.7 GiB available, so memory runs out near "
        r"step (\d+) of 1000$",
        finding.message,
    )
    assert match, finding.message
    per_step, growth, out_at = float(match[1]), float(match[2]), int(match[3])
    assert per_step == pytest.approx(0.1, abs=0.002) and growth == pytest.approx(
        987 * per_step, rel=1e-3
    )
    assert out_at == 13 + int(6.7 / per_step)


def test_flat_or_affordable_memory_does_not_fire(thresholds):
    context = RunContext(target_kl=None, samples_per_step=64, total_steps=1000)
    assert run_stream(memory_stream(0.0), thresholds, context) == []
    # 1 MiB a step: under 1 GiB over the steps left, with 8 GiB available.
    assert run_stream(memory_stream(0.001), thresholds, context) == []
    # Growing fast, but the run ends first (45 steps, 0.1 GiB a step, 8 GiB available).
    short = RunContext(target_kl=None, samples_per_step=64, total_steps=45)
    assert run_stream(memory_stream(0.1), thresholds, short) == []
    # Without the run's length there is nothing to extrapolate to.
    assert run_stream(memory_stream(0.1), thresholds) == []


def async_stream(waits: list[float], dropped: float = 0.0):
    """Yield (step, metrics) of an asynchronous run's healthy stream with the trainer's wait
    ``timing_s/gen`` of each step (of a 10 s step) and ``dropped`` stale samples per step."""
    for (step, metrics), wait in zip(healthy(steps=len(waits)), [0.0, *waits], strict=False):
        if step:
            metrics = {
                **metrics,
                "timing_s/gen": wait,
                "timing_s/step": 10.0,
                "timing_s/rollout_worker_gen": 9.0,
                "async/dropped_stale_samples": dropped,
            }
        yield step, metrics


def test_stale_drops_fire_when_most_of_the_steps_samples_are_dropped(thresholds):
    assert run_stream(async_stream([1.0] * 10, dropped=32.0), thresholds) == []  # 50%: not over
    [finding] = run_stream(async_stream([1.0] * 10, dropped=40.0), thresholds)
    assert (finding.check, finding.step) == ("stale_drops", 1)
    assert "40 samples were dropped as stale beside the step's 64 (62%, over 50%)" in (
        finding.message
    )
    assert "async_training.trigger_parameter_sync_step" in finding.message


def test_a_starved_trainer_fires_after_enough_steps_in_a_row(thresholds):
    # Over half of each step waiting: steps 1-4 are not enough, a short wait at step 5 breaks
    # the streak, and steps 6-10 make five in a row.
    waits = [6.0, 7.0, 8.0, 6.0, 2.0, 6.0, 6.0, 6.0, 6.0, 9.0, 9.0]
    [finding] = run_stream(async_stream(waits), thresholds)
    assert (finding.check, finding.step) == ("trainer_starved", 10)
    assert finding.message.startswith(
        "the trainer waited for rollouts 90% of step 10 (timing_s/gen 9 s of timing_s/step 10 s), "
        "over 50% in each of the last 5 steps"
    )


def test_a_synchronous_runs_generation_time_is_no_starved_trainer(thresholds):
    # Without the rollout worker's timing, timing_s/gen is the generation itself.
    stream = (
        (step, {**m, "timing_s/gen": 9.0, "timing_s/step": 10.0} if step else m)
        for step, m in healthy(steps=20)
    )
    assert run_stream(stream, thresholds) == []
