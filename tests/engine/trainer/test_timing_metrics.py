"""Timing metrics of a step: an asynchronous trainer's busy share of the step on each side."""

from __future__ import annotations

import pytest

from engine.trainer.metrics import compute_timing_metrics, compute_utilisation_metrics


def test_each_side_of_an_asynchronous_step_is_busy_for_its_share_of_the_step():
    timing = {"step": 4.0, "gen": 1.0, "rollout_worker_gen": 3.0, "update_actor": 2.0}
    assert compute_utilisation_metrics(timing) == {
        "async/rollout_utilisation": 0.75,  # 3 s generating of a 4 s step
        "async/trainer_utilisation": 0.75,  # 1 s of it waiting for the rollouts
    }
    metrics = compute_timing_metrics(timing, num_tokens=100)
    assert metrics["timing_s/gen"] == 1.0 and metrics["timing_per_token_ms/step"] == 40.0
    assert metrics["async/rollout_utilisation"] == pytest.approx(0.75)


def test_a_synchronous_step_has_no_utilisation():
    # Its gen is the generation itself, not a wait: no rollout worker, no busy shares.
    assert compute_utilisation_metrics({"step": 4.0, "gen": 3.0}) == {}
    assert not [n for n in compute_timing_metrics({"step": 4.0, "gen": 3.0}, 10) if "async" in n]
