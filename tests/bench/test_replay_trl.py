"""``bench.training.replay_trl``: TRL's GRPOTrainer, fed the engine's completions, makes the engine's updates.

This is the check that the engine's GRPO update (advantages, k3 KL loss, token-mean
aggregation, clipping, AdamW) is the update of the framework it is compared against, so that the
benchmark's learning comparison differs only by sampling luck. The engine runs with TRL's k3
(``kl_loss_type=k3_unclamped``): verl's ``low_var_kl`` differs from it only on a token whose k3
passes 10 (tested in ``tests/engine/algorithms/test_kl.py``), and when that first happens depends
on the build of the tiny model. Its power is shown in the same run: TRL with its default
importance-weighted KL gradient, a change of a few percent of the KL term, must end outside the
bound the engine is held to.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "trl", reason="TRL is not installed; install the bench extra: pip install -e '.[bench]'"
)

STEPS = 8
GAP_BOUND = 8e-4  # weight gap / distance travelled; rounding alone reads about 3e-4 here


@pytest.mark.slow
def test_trl_replaying_the_engines_rollouts_lands_on_the_engines_weights(tmp_path):
    from bench.training import replay_trl

    args = replay_trl.parse_args(
        ["--steps", str(STEPS), "--threads", "1", "--engine-kl", "k3_unclamped"]
        + ["--root", str(tmp_path / "root")]
    )
    comparisons = replay_trl.replay(args)

    engine, control, default_kl = (comparisons[k] for k in ("engine", "control", "trl_default_kl"))
    assert [r["step"] for r in engine] == list(range(1, STEPS + 1))
    for row in engine:
        assert row["update_cosine"] > 0.99999, row
        assert abs(row["update_norm_ratio"] - 1) < 1e-3, row
        assert row["gap_over_drift"] < GAP_BOUND, row
        assert row["reward"][0] == row["reward"][1], row
        assert row["kl"][0] == pytest.approx(row["kl"][1], rel=1e-3, abs=1e-6), row
    assert all(row["gap_over_drift"] < GAP_BOUND for row in control)
    # The KL term is zero at step 1, so the two KL gradients part from step 2 on, and the gap
    # grows as the policy leaves the reference (on one build of the tiny model it passed the
    # bound at step 2, on another at step 5).
    assert default_kl[0]["gap_over_drift"] < GAP_BOUND
    assert default_kl[-1]["gap_over_drift"] > 2 * GAP_BOUND, default_kl
