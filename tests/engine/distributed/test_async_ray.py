"""The one-step-off and fully-async trainers on the Ray controller over two CPU ranks: the rollout
worker samples what it samples under the local controller and the sharded update moves the
weights as the local one does; the fully-async staleness schedule holds, and a run resumes from
the ranks' shards with the checkpoint's weights in the rollout worker."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.trainer.fully_async import FullyAsyncPPOTrainer
from engine.trainer.one_step_off import OneStepOffPPOTrainer
from engine.trainer.ray_async import RayFullyAsyncPPOTrainer, RayOneStepOffPPOTrainer
from engine.trainer.run import run_training
from tests.engine.distributed.helpers import max_diff, ray_config
from tests.engine.distributed.test_ray import ListRecorder

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ONE_STEP_OFF = "actor_rollout_ref.hybrid_engine=False"
# The random policy earns no reward: an entropy bonus at a large learning rate moves it anyway,
# so each batch is sampled from weights the previous updates changed.
MOVING = ("actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.entropy_coeff=0.1")
FULLY_ASYNC = (
    ONE_STEP_OFF,
    "async_training.staleness_threshold=0",
    "async_training.trigger_parameter_sync_step=2",
    "async_training.require_batches=1",
)


class Recording:
    """Keep each step's sampled responses, the weights the worker was sent, and the policy's
    weights when the run ends (before the ranks are released)."""

    def __init__(self, *args, **kwargs):
        self.responses: list[torch.Tensor] = []
        self.is_weights: list[torch.Tensor | None] = []
        self.metrics: list[dict[str, float]] = []
        self.synced: list[dict[str, torch.Tensor]] = []
        self.final: dict[str, torch.Tensor] = {}
        super().__init__(*args, **kwargs)

    def train_step(self, prompts, more_prompts=None):
        metrics, batch, reward_info = super().train_step(prompts, more_prompts)
        self.responses.append(batch.batch["responses"].clone())
        self.is_weights.append(batch.batch.get("rollout_is_weights"))
        self.metrics.append(metrics)
        return metrics, batch, reward_info

    def close(self):
        if getattr(self, "arr", None) is not None:
            self.final = self.arr.full_state_dict()
        super().close()


class RayOneStepOff(Recording, RayOneStepOffPPOTrainer):
    pass


class LocalOneStepOff(Recording, OneStepOffPPOTrainer):
    pass


class RayFullyAsync(Recording, RayFullyAsyncPPOTrainer):
    def sync_weights(self, version):
        super().sync_weights(version)
        self.synced.append(self.arr.full_state_dict())


class LocalFullyAsync(Recording, FullyAsyncPPOTrainer):
    pass


def test_one_step_off_on_two_ranks_samples_and_updates_as_the_local_controller(
    ray_session, assets, tmp_path
):
    overrides = (
        ONE_STEP_OFF,
        *MOVING,
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        # Token IS from the update's own pi_old: the ranks hand their weights back, no pass.
        "algorithm.rollout_correction.rollout_is=token",
    )
    # Without the overlap both sample each batch from the weights after every update so far:
    # the same tokens (one worker process, one seed), updates equal up to float order: the
    # sharded reduction's, and the ranks' one forward call a micro-batch where one process
    # runs length buckets (1.2e-5 apart after two updates, measured).
    ray_run = RayOneStepOff(ray_config(assets, tmp_path, "grpo_tiny", *overrides), overlap=False)
    assert ray_run.fit() == "succeeded"
    local_config = ray_config(assets, tmp_path, "grpo_tiny", *overrides, "trainer.controller=local")
    local_run = LocalOneStepOff(local_config, overlap=False)
    assert local_run.fit() == "succeeded"
    assert len(ray_run.responses) == len(local_run.responses) == 2
    for ray_tokens, local_tokens in zip(ray_run.responses, local_run.responses, strict=True):
        assert torch.equal(ray_tokens, local_tokens)
    for ray_weights, local_weights in zip(ray_run.is_weights, local_run.is_weights, strict=True):
        assert ray_weights is not None and local_weights is not None
        torch.testing.assert_close(ray_weights, local_weights, atol=1e-4, rtol=0)
    for run in (ray_run, local_run):
        assert all("timing_s/old_log_prob" not in m for m in run.metrics)
        assert all("rollout_corr/rollout_is_mean" in m for m in run.metrics)
    assert ray_run.final.keys() == local_run.final.keys()
    assert max_diff(ray_run.final, local_run.final) < 5e-5
    initial = AutoModelForCausalLM.from_pretrained(assets / "model").state_dict()
    assert max_diff(ray_run.final, initial) > 1e-3  # two updates moved the weights
    assert ray_run.rollout_worker is None and ray_run.worker_groups == {}  # all released


def fully_async_config(assets, tmp_path, *overrides: str):
    """Return three fully-async steps on two ranks, a sync every second step, moving weights."""
    return ray_config(
        assets,
        tmp_path,
        "grpo_tiny",
        *FULLY_ASYNC,
        *MOVING,
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=3",
        "trainer.test_freq=-1",
        *overrides,
    )


def test_fully_async_on_two_ranks_keeps_the_schedule_and_resumes_from_its_shards(
    ray_session, assets, tmp_path
):
    recorder = ListRecorder()
    trainer = RayFullyAsync(fully_async_config(assets, tmp_path, "trainer.save_freq=2"), recorder)
    assert trainer.fit() == "succeeded"
    # Two chunks go out at each sync (every second step): the second is one update stale.
    lags = [recorder.steps[step]["async/staleness_max"] for step in (1, 2, 3)]
    assert lags == [0.0, 1.0, 0.0]
    assert recorder.steps[2]["async/max_allowed_staleness"] == 1.0
    assert recorder.steps[3]["async/rollout_policy_version"] == 2.0
    assert len(trainer.synced) == 2  # before steps 1 and 3

    # Resumed from step 2's shards, the run syncs the checkpoint's weights to the worker first.
    resumed = RayFullyAsync(
        fully_async_config(
            assets,
            tmp_path,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={tmp_path / 'ckpt' / 'global_step_2'}",
        ),
        ListRecorder(),
    )
    assert resumed.fit() == "succeeded"
    assert resumed.global_step == 3 and len(resumed.responses) == 1
    assert max_diff(trainer.synced[0], trainer.synced[1]) > 1e-3  # two updates apart
    assert max_diff(resumed.synced[0], trainer.synced[1]) < 1e-6  # both after 2 updates


def test_run_training_picks_the_ray_loop_and_reports_the_queue(ray_session, assets, tmp_path):
    recorder = ListRecorder()
    config = ray_config(
        assets,
        tmp_path,
        "grpo_tiny",
        ONE_STEP_OFF,
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
    )
    assert run_training(config, recorder) == "succeeded"
    step = recorder.steps[2]
    assert step["async/staleness_max"] == 1.0  # the second batch came from the first weights
    assert "val-core/tiny_arithmetic/reward/mean@1" in step  # the ranks' rollout validates
    assert step["timing_s/sync_rollout_weights"] > 0
