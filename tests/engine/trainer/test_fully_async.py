"""The fully-async trainer (hybrid_engine=False with async_training.*) on the embedded tiny model:
a rollout worker process streaming mini-batch chunks into a bounded queue, syncs every
trigger_parameter_sync_step steps, staleness within the budget's bound, drops counted, and the
synchronous updates when the budget is one step."""

from __future__ import annotations

import pytest
import torch

from engine.trainer.fully_async import FullyAsyncPPOTrainer
from engine.trainer.run import run_training
from engine.trainer.samples import POLICY_VERSION
from tests.engine.trainer.stale import (
    SAME_WEIGHTS_ATOL,
    RecordsSteps,
    assert_trains_as_the_synchronous_trainer,
    log_probs_under,
)
from tests.engine.trainer.test_trainer import ListRecorder

FULLY_ASYNC = "actor_rollout_ref.hybrid_engine=False"


def fully_async(threshold: float, sync_step: int, require_batches: int = 1) -> tuple[str, ...]:
    """Return the overrides of a fully-async run over ``make_config``'s four prompts a step, in
    ``require_batches`` chunks."""
    return (
        FULLY_ASYNC,
        f"async_training.staleness_threshold={threshold}",
        f"async_training.trigger_parameter_sync_step={sync_step}",
        f"async_training.require_batches={require_batches}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={4 // require_batches}",
    )


class RecordingTrainer(RecordsSteps, FullyAsyncPPOTrainer):
    """Keep each step's batch and the actor's weights it was trained from."""


def test_a_one_step_budget_gives_the_synchronous_trainers_updates(make_config):
    _, steps = assert_trains_as_the_synchronous_trainer(
        make_config,
        lambda: FullyAsyncPPOTrainer(make_config("grpo_tiny", *fully_async(0, 1)), ListRecorder()),
    )
    for metrics in steps:
        assert metrics["async/max_allowed_staleness"] == 0.0
        assert metrics["async/dropped_stale_samples"] == 0.0
        assert "timing_s/rollout_worker_gen" in metrics and "timing_s/gen" in metrics


def test_a_stale_samples_importance_weight_is_pi_old_over_pi_rollout(make_config):
    threshold = 1.5
    trainer = RecordingTrainer(
        make_config(
            "grpo_tiny",
            *fully_async(0, 2),  # one sync per two steps: the second step's chunk is one behind
            "trainer.total_training_steps=3",
            "algorithm.rollout_correction.rollout_is=token",
            f"algorithm.rollout_correction.rollout_is_threshold={threshold}",
            "actor_rollout_ref.actor.optim.lr=1e-2",  # a large step: the ratios move off 1
            # Reads pi_old before the update: the pass runs, and the batch keeps pi_old.
            "actor_rollout_ref.rollout.calculate_log_probs=True",
        ),
        ListRecorder(),
    )
    assert trainer.fit() == "succeeded"
    steps = [m for _, m in trainer.recorder.steps]
    assert [m["async/staleness_max"] for m in steps] == [0.0, 1.0, 0.0]
    assert [m["async/rollout_policy_version"] for m in steps] == [0.0, 0.0, 2.0]
    assert steps[0]["timing_s/sync_rollout_weights"] > 0
    assert steps[1]["timing_s/sync_rollout_weights"] == 0.0  # no sync before step 2
    batch = trainer.batches[1]
    assert (batch.non_tensor_batch[POLICY_VERSION] == 0).all()
    mask = batch.batch["response_mask"].bool()
    model = trainer.arr.model
    rollout = log_probs_under(model, trainer.weights_before[0], batch)  # version 0
    torch.testing.assert_close(
        batch.batch["rollout_log_probs"][mask], rollout[mask], atol=SAME_WEIGHTS_ATOL, rtol=0
    )
    old = log_probs_under(model, trainer.weights_before[1], batch)  # the actor at step 2
    torch.testing.assert_close(
        batch.batch["old_log_probs"][mask], old[mask], atol=SAME_WEIGHTS_ATOL, rtol=0
    )
    # Truncated token IS: w_t = min(pi_old(y_t) / pi_rollout(y_t), C), 0 on padding.
    expected = torch.exp(old - rollout).clamp(max=threshold) * mask
    weights = batch.batch["rollout_is_weights"]
    torch.testing.assert_close(weights, expected, atol=1e-4, rtol=1e-4)
    assert (weights[mask] - 1).abs().max() > 1e-2, "the update did not move the policy"


def test_staleness_stays_within_the_budgets_bound(make_config):
    # Two chunks of 2 prompts a step, a sync every two steps, 50% more than a window: a queue
    # of floor(2 x 2 x 1.5) = 6 chunks, so at most ceil(6 / 2) - 1 = 2 updates behind.
    recorder = ListRecorder()
    config = make_config(
        "grpo_tiny",
        *fully_async(0.5, 2, require_batches=2),
        "trainer.total_training_steps=5",
        "actor_rollout_ref.rollout.n=2",
        "async_training.use_rollout_log_probs=True",
    )
    assert run_training(config, recorder) == "succeeded"
    steps = [m for _, m in recorder.steps]
    assert all(m["async/max_allowed_staleness"] == 2.0 for m in steps)
    staleness = [m["async/staleness_max"] for m in steps]
    assert max(staleness) <= 2.0
    assert max(staleness) >= 1.0  # the rollouter did run ahead
    assert all(m["async/dropped_stale_samples_total"] == 0.0 for m in steps)
    assert all(0 <= m["async/queue_size"] <= 6 * 2 * 2 for m in steps)
    # pi_old from the rollout (async_training's key sets the actor's): never recomputed.
    assert not [m for m in steps if "timing_s/old_log_prob" in m]
    assert len(recorder.samples) == 5 * 4 * 2


class MissedSync(FullyAsyncPPOTrainer):
    """A rollouter that misses the sync after the first update (the first time it is sent)."""

    missed = False

    def sync_weights(self, version):
        if version == 1 and not self.missed:
            self.missed = True
            self.synced_version = version
            return
        super().sync_weights(version)


def test_a_chunk_older_than_the_bound_is_dropped_counted_and_replaced(make_config):
    recorder = ListRecorder()
    trainer = MissedSync(make_config("grpo_tiny", *fully_async(0, 1)), recorder)
    assert trainer.fit() == "succeeded"
    first, second = (m for _, m in recorder.steps)
    assert first["async/dropped_stale_samples"] == 0.0
    # Step 2's chunk came from the first weights, one update behind a bound of 0: dropped, and
    # its replacement generated with the weights after update 1.
    assert second["async/dropped_stale_samples"] == 4 * 8
    assert second["async/dropped_stale_samples_total"] == 4 * 8
    assert second["async/staleness_max"] == 0.0
    assert second["async/rollout_policy_version"] == 1.0


class DyingRollouter(FullyAsyncPPOTrainer):
    """Kill the rollout worker process after the first update (nothing is in flight then)."""

    def train_step(self, prompts, more_prompts=None):
        result = super().train_step(prompts, more_prompts)
        if self.global_step == 1:
            self.rollout_worker.process.kill()
            self.rollout_worker.process.join()
        return result


def test_a_rollouter_that_dies_stops_the_run_with_its_exit_code(make_config):
    recorder = ListRecorder()
    trainer = DyingRollouter(make_config("grpo_tiny", *fully_async(0, 1)), recorder)
    with pytest.raises(RuntimeError, match=r"rollout worker process exited \(code -9\)"):
        trainer.fit()
    assert len(recorder.steps) == 1
    assert trainer.rollout_worker is None  # fit closed what was left


def test_a_cancel_stops_the_rollouter_with_chunks_in_flight(make_config):
    recorder = ListRecorder(stop_after=1)
    trainer = FullyAsyncPPOTrainer(
        make_config(
            "grpo_tiny",
            *fully_async(1, 2),
            "trainer.total_training_steps=4",
            "trainer.save_freq=-1",
        ),
        recorder,
    )
    process = trainer.rollout_worker.process
    assert trainer.fit() == "cancelled"
    assert len(recorder.steps) == 1
    assert trainer.rollout_worker is None
    assert not process.is_alive()


def test_verls_rollout_keys_set_the_runs_length_and_its_validation(make_config):
    recorder = ListRecorder()
    config = make_config(
        "grpo_tiny",
        *fully_async(0, 1),
        "rollout.total_rollout_steps=13",  # 13 prompts // 4 a step: three steps
        "rollout.test_freq=2",  # every two syncs, one a step: step 2, and the last
        "data.val_max_samples=8",
    )
    assert run_training(config, recorder) == "succeeded"
    assert [step for step, _ in recorder.steps] == [1, 2, 3]
    validated = [any(k.startswith("val-core/") for k in m) for _, m in recorder.steps]
    assert validated == [False, True, True]


def test_a_cancelled_run_resumes_with_the_checkpoints_weights_in_the_rollouter(
    make_config, tmp_path
):
    common = (
        *fully_async(1, 2),  # a queue of four chunks: the whole run is in flight at the start
        "trainer.total_training_steps=3",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "algorithm.rollout_correction.rollout_is=token",
        "actor_rollout_ref.actor.optim.lr=1e-2",  # a worker left on other weights would show
    )
    first = RecordingTrainer(make_config("grpo_tiny", *common), ListRecorder(stop_after=2))
    assert first.fit() == "cancelled"
    assert first.recorder.checkpoints[-1][0] == 2
    second = RecordingTrainer(make_config("grpo_tiny", *common), ListRecorder())
    assert second.fit() == "succeeded"
    ((step, metrics),) = second.recorder.steps
    assert step == 3
    # The resumed rollouter got the checkpoint's weights (version 2) before its first chunk.
    assert metrics["async/rollout_policy_version"] == 2.0
    assert metrics["async/staleness_max"] == 0.0
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    # Step 3's chunk was in flight at the checkpoint: drawn again, its prompts are those the
    # uninterrupted run trains on at step 3, and its samples are counted as generated again.
    elsewhere = f"trainer.default_local_dir={tmp_path / 'whole'}"
    whole = RecordingTrainer(make_config("grpo_tiny", *common, elsewhere), ListRecorder())
    assert whole.fit() == "succeeded"
    assert torch.equal(second.batches[0].batch["prompts"], whole.batches[2].batch["prompts"])
    assert not torch.equal(whole.batches[1].batch["prompts"], whole.batches[2].batch["prompts"])
    assert metrics["async/regenerated_after_resume"] == len(whole.batches[2])


def test_the_fully_async_preset_trains_on_the_tiny_task(make_config):
    config = make_config(
        "grpo_tiny_fully_async", "trainer.total_training_steps=4", "data.train_batch_size=8"
    )
    config.actor_rollout_ref.actor.ppo_mini_batch_size = 8  # one chunk a step, as the preset's
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    steps = [metrics for _, metrics in recorder.steps]
    assert len(steps) == 4
    # The preset's budget: a 3-chunk queue, so at most two updates stale, and nothing dropped.
    assert all(m["async/max_allowed_staleness"] == 2.0 for m in steps)
    assert max(m["async/staleness_max"] for m in steps) == 2.0
    assert sum(m["async/dropped_stale_samples"] for m in steps) == 0
    for metrics in steps:
        assert "timing_s/old_log_prob" not in metrics  # pi_old is the rollout's (bypass)
