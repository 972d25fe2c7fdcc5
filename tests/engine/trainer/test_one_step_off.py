"""The one-step-off trainer (actor_rollout_ref.hybrid_engine=False) on the embedded tiny model:
a rollout worker process generating one batch ahead, every sample stamped with its policy
version, stale samples corrected by the math, and the synchronous updates without the overlap."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.data import DataProto
from engine.roles.model_loading import policy_skeleton
from engine.roles.rollout_worker import RolloutWorkerProcess
from engine.tools.tiny_task import calculator_overrides, ensure_calculator_task
from engine.trainer.one_step_off import OneStepOffPPOTrainer
from engine.trainer.run import run_training
from engine.trainer.samples import POLICY_VERSION
from tests.engine.rollout.test_vllm_engine import LOGP_ATOL
from tests.engine.trainer.stale import (
    SAME_WEIGHTS_ATOL,
    RecordsSteps,
    assert_trains_as_the_synchronous_trainer,
    log_probs_under,
    parameter_diff,
)
from tests.engine.trainer.test_trainer import ListRecorder
from tests.engine.trainer.test_vllm_training import VLLM
from tests.vllm_tests import requires_vllm

ONE_STEP_OFF = "actor_rollout_ref.hybrid_engine=False"


class RecordingTrainer(RecordsSteps, OneStepOffPPOTrainer):
    """Keep each step's batch and the actor's weights it was trained from."""


def test_without_the_overlap_the_updates_equal_the_synchronous_trainers(make_config):
    trainer, _ = assert_trains_as_the_synchronous_trainer(
        make_config,
        lambda: OneStepOffPPOTrainer(
            make_config("grpo_tiny", ONE_STEP_OFF), ListRecorder(), overlap=False
        ),
    )
    assert trainer.rollout_worker is None  # fit stopped the worker process


STALE_IS = [
    "trainer.total_training_steps=3",
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_is_threshold=1.5",
    "actor_rollout_ref.actor.optim.lr=1e-2",  # a large step: the ratios move off 1
]


class PassTrainer(RecordingTrainer):
    """Compute pi_old and the IS weights in a pass of their own before every update."""

    def rollout_is_in_update(self, batch):
        return False


def test_a_one_step_stale_samples_importance_weight_is_pi_old_over_pi_rollout(make_config):
    threshold = 1.5
    # calculate_log_probs reads pi_old before the update, so the pass runs and the batch
    # keeps pi_old and the weights for the test to read.
    trainer = RecordingTrainer(
        make_config(
            "grpo_tiny",
            ONE_STEP_OFF,
            *STALE_IS,
            "actor_rollout_ref.rollout.calculate_log_probs=True",
        ),
        ListRecorder(),
    )
    recorder = trainer.recorder
    assert trainer.fit() == "succeeded"
    staleness = [m["async/staleness_max"] for _, m in recorder.steps]
    assert staleness == [0.0, 1.0, 1.0]  # batch 1 from the first weights, then one update behind
    assert all("timing_s/old_log_prob" in m for _, m in recorder.steps)
    moved = False
    for step in (2, 3):
        batch = trainer.batches[step - 1]
        versions = batch.non_tensor_batch[POLICY_VERSION]
        assert (versions == step - 2).all()  # every sample carries the policy that made it
        mask = batch.batch["response_mask"].bool()
        model = trainer.arr.model
        # pi_rollout: the weights after step-2 updates, which the worker generated with.
        rollout = log_probs_under(model, trainer.weights_before[step - 2], batch)
        torch.testing.assert_close(
            batch.batch["rollout_log_probs"][mask], rollout[mask], atol=SAME_WEIGHTS_ATOL, rtol=0
        )
        # pi_old: the actor when the step began, one update later.
        old = log_probs_under(model, trainer.weights_before[step - 1], batch)
        torch.testing.assert_close(
            batch.batch["old_log_probs"][mask], old[mask], atol=SAME_WEIGHTS_ATOL, rtol=0
        )
        # Truncated token IS: w_t = min(pi_old(y_t) / pi_rollout(y_t), C), 0 on padding.
        expected = torch.exp(old - rollout).clamp(max=threshold) * mask
        weights = batch.batch["rollout_is_weights"]
        torch.testing.assert_close(weights, expected, atol=1e-4, rtol=1e-4)
        moved |= bool((weights[mask] - 1).abs().max() > 1e-2)
    assert moved, "the update did not move the policy: the test would not see staleness"
    # The first batch is on-policy: its weights are 1 up to float rounding.
    first = trainer.batches[0]
    first_mask = first.batch["response_mask"].bool()
    torch.testing.assert_close(
        first.batch["rollout_is_weights"][first_mask],
        torch.ones(int(first_mask.sum())),
        atol=1e-4,
        rtol=0,
    )


def test_token_is_weighed_inside_the_update_trains_as_the_pi_old_pass_does(make_config):
    # One epoch, one mini-batch: before its optimizer step the update's forward is pi_old, so
    # the IS weights it takes from it are the pass's, and the pass is skipped.
    fused = RecordingTrainer(make_config("grpo_tiny", ONE_STEP_OFF, *STALE_IS), ListRecorder())
    assert fused.fit() == "succeeded"
    passed = PassTrainer(make_config("grpo_tiny", ONE_STEP_OFF, *STALE_IS), ListRecorder())
    assert passed.fit() == "succeeded"
    fused_steps, pass_steps = (dict(t.recorder.steps) for t in (fused, passed))
    assert [m["async/staleness_max"] for m in fused_steps.values()] == [0.0, 1.0, 1.0]
    assert not any("timing_s/old_log_prob" in m for m in fused_steps.values())
    assert all("timing_s/old_log_prob" in m for m in pass_steps.values())
    for step in (1, 2, 3):  # the same samples, weighed alike
        fused_batch, pass_batch = fused.batches[step - 1].batch, passed.batches[step - 1].batch
        assert torch.equal(fused_batch["responses"], pass_batch["responses"])
        # The update hands its weights back for the samples' records: the pass's, token by token.
        torch.testing.assert_close(
            fused_batch["rollout_is_weights"], pass_batch["rollout_is_weights"], atol=1e-5, rtol=0
        )
        for key in ("rollout_corr/rollout_is_mean", "actor/pg_loss"):
            assert fused_steps[step][key] == pytest.approx(pass_steps[step][key], abs=1e-5), key
    assert fused_steps[3]["rollout_corr/rollout_is_mean"] != pytest.approx(1.0, abs=1e-3)
    moved = parameter_diff(passed.weights_before[0], passed.arr.model.state_dict())
    assert moved > 1e-3
    assert parameter_diff(passed.arr.model.state_dict(), fused.arr.model.state_dict()) <= 1e-6


def test_use_rollout_log_probs_takes_pi_old_from_the_rollout(make_config):
    recorder = ListRecorder()
    config = make_config(
        "grpo_tiny", ONE_STEP_OFF, "actor_rollout_ref.actor.use_rollout_log_probs=True"
    )
    assert run_training(config, recorder) == "succeeded"
    assert [m["async/staleness_max"] for _, m in recorder.steps] == [0.0, 1.0]
    # No recomputation: the stale step's ratio is taken against pi_rollout itself.
    assert not [m for _, m in recorder.steps if "timing_s/old_log_prob" in m]


def test_a_rollout_worker_that_dies_is_an_error_naming_its_exit_code(tiny_assets):
    from engine.config import load_config
    from engine.roles.model_loading import load_policy, load_tokenizer

    config = load_config("grpo_tiny.yaml")
    arr = config.actor_rollout_ref
    model = load_policy(arr.model, torch.device("cpu"))
    worker = RolloutWorkerProcess(
        policy_skeleton(model), load_tokenizer(arr.model), arr.rollout, max_new_tokens=4, seed=1
    )
    try:
        worker.process.kill()
        worker.process.join()
        prompts = DataProto.from_dict(
            {"input_ids": torch.ones(1, 2, dtype=torch.long)},
            {"uid": np.array(["a"], dtype=object)},
        )
        worker.submit(prompts)
        with pytest.raises(RuntimeError, match=r"rollout worker process exited \(code -9\)"):
            worker.result()
    finally:
        worker.close()


def test_verls_one_step_off_preset_trains_on_the_tiny_task(make_config):
    # verl's preset keys over the tiny task: bypass mode, the rollout's log-probs as pi_old.
    config = make_config(
        "grpo_tiny_one_step_off",
        "actor_rollout_ref.rollout.n=4",
        "algorithm.rollout_correction.rollout_is=token",
    )
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    steps = [metrics for _, metrics in recorder.steps]
    assert [m["async/staleness_max"] for m in steps] == [0.0, 1.0]
    for metrics in steps:
        assert "timing_s/old_log_prob" not in metrics  # bypass: never recomputed
        assert "rollout_corr/rollout_is_mean" in metrics


def test_a_cancelled_run_resumes_with_the_checkpoints_weights_in_the_worker(make_config, tmp_path):
    common = (
        ONE_STEP_OFF,
        "trainer.total_training_steps=3",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "algorithm.rollout_correction.rollout_is=token",
        "actor_rollout_ref.actor.optim.lr=1e-2",  # a worker left on other weights would show
    )
    first = OneStepOffPPOTrainer(make_config("grpo_tiny", *common), ListRecorder(stop_after=2))
    assert first.fit() == "cancelled"
    assert first.recorder.checkpoints[-1][0] == 2
    assert first.rollout_worker is None  # the cancel stopped the worker with batch 3 in flight
    second = OneStepOffPPOTrainer(make_config("grpo_tiny", *common), ListRecorder())
    assert second.fit() == "succeeded"
    ((step, metrics),) = second.recorder.steps
    assert step == 3
    # The resumed worker generated step 3's batch with the checkpoint's weights (version 2): it
    # is on-policy, and pi_old / pi_rollout is 1 wherever the two computations agree.
    assert metrics["async/rollout_policy_version"] == 2.0
    assert metrics["async/staleness_max"] == 0.0
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-4)


@pytest.mark.slow
@requires_vllm
def test_the_worker_generates_with_vllm_on_the_weights_last_synced(make_config):
    # Without the overlap every batch is generated on the weights of the step before it; a
    # large step moves them far, so a vLLM engine left on older weights would show in the
    # rollout's log-probs against the actor's recomputation.
    recorder = ListRecorder()
    trainer = OneStepOffPPOTrainer(
        make_config(
            "grpo_tiny",
            ONE_STEP_OFF,
            *VLLM,
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "trainer.total_training_steps=3",
            "actor_rollout_ref.actor.optim.lr=1e-2",
        ),
        recorder,
        overlap=False,
    )
    assert trainer.fit() == "succeeded"
    assert [step for step, _ in recorder.steps] == [1, 2, 3]
    for step, metrics in recorder.steps:
        assert metrics["async/rollout_policy_version"] == step - 1
        assert metrics["training/rollout_probs_diff_max"] <= LOGP_ATOL


@pytest.mark.slow
def test_multi_turn_tool_calls_run_in_the_worker(make_config):
    task = ensure_calculator_task()  # built once per recipe, then cached (the calculator tests')
    recorder = ListRecorder()
    config = make_config(
        "grpo_tiny",
        ONE_STEP_OFF,
        *calculator_overrides(task),
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    )
    assert run_training(config, recorder) == "succeeded"
    steps = [metrics for _, metrics in recorder.steps]
    assert [m["async/staleness_max"] for m in steps] == [0.0, 1.0]
    # The seeded model calls the calculator in about a third of its answers; the worker ran
    # those calls and went on to a second turn.
    assert all(m["tool_call_counts/mean"] > 0 for m in steps)
    assert all(m["num_turns/max"] == 2.0 for m in steps)
