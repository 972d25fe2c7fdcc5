"""The engine's CLI with ``trainer.logger=[console,posttrain]`` reports a run started by hand to a
live studio: config, metrics, samples with their token log-probs, the outcome."""

from __future__ import annotations

import pytest

from engine.main_ppo import main
from engine.trainer.trackers import PosttrainRecorder
from tests.webapp.fixtures import make_experiment
from webapp.external.services import external_unknown_keys
from webapp.runs.models import MetricPoint, Run, RunStatus, Sample


def test_the_logger_needs_the_studio_and_a_token_before_training(monkeypatch):
    monkeypatch.delenv("POSTTRAIN_URL", raising=False)
    monkeypatch.setenv("POSTTRAIN_TOKEN", "pts_x")
    with pytest.raises(ValueError, match="names posttrain but POSTTRAIN_URL is not set: export"):
        PosttrainRecorder("project", "run")


@pytest.mark.django_db
def test_a_run_the_studio_launches_may_not_name_posttrain(owner):
    from engine.config import ConfigValidationError

    with pytest.raises(ConfigValidationError) as refused:
        make_experiment(owner, trainer__logger=["console", "posttrain"])
    messages = {e.key: e.message for e in refused.value.errors}
    assert "a run the studio launches records itself" in messages["trainer.logger"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_started_by_hand_shows_up_like_a_studio_run(studio, token, tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_URL", studio.url)
    monkeypatch.setenv("POSTTRAIN_TOKEN", token)
    code = main(
        [
            "--config-name", "grpo_tiny", "trainer.logger=[console,posttrain]",
            "trainer.experiment_name=by hand", "trainer.total_training_steps=2",
            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.rollout.n=4", "trainer.save_freq=-1", "trainer.test_freq=-1",
            "trainer.val_before_train=False", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ]
    )  # fmt: skip
    assert code == 0
    run = Run.objects.get()
    assert run.status == RunStatus.SUCCEEDED and run.experiment.name == "by hand"
    assert run.external.source == "engine" and run.total_steps == 2
    assert run.config["algorithm"]["adv_estimator"] == "grpo"
    assert external_unknown_keys(run.config) == []  # the engine's own config: every key known
    points = dict(MetricPoint.objects.filter(run=run).values_list("step", "metrics"))
    assert sorted(points) == [1, 2] and "critic/score/mean" in points[1]
    samples = Sample.objects.filter(run=run, step=1, split="train")
    assert samples.count() == 32
    sample = samples.first()
    assert len(sample.tokens) == len(sample.token_logprobs) == sample.response_length > 0
    assert (tmp_path / "ckpt" / "posttrain-run.json").exists()
