"""``posttrain watch`` against a live studio, on files written as verl writes them: everything
arrives once, a restart of the watcher or of the studio loses and doubles nothing, a wrapped
command's outcome and output become the run's, and Cancel stops a command that allowed it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from posttrain_client import Studio
from posttrain_client.external import ExternalRun
from posttrain_client.watch import Watcher, WatchOptions
from tests.client.fake_verl import PROMPTS, FileLogger, N, dump_generations, fit, rollouts
from webapp.external.services import LOG_FILE
from webapp.health.models import HealthAlert
from webapp.runs.models import MetricPoint, Run, RunStatus, Sample
from webapp.runs.services import run_cancel, run_dir

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]
GROUP = len(PROMPTS) * N


def posttrain(
    studio, token, *args: str, cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``python -m posttrain_client`` as a user would, in ``cwd``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "POSTTRAIN_URL": studio.url,
        "POSTTRAIN_TOKEN": token,
    }
    return subprocess.run(
        [sys.executable, "-m", "posttrain_client", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def counts(run_id: int) -> dict[str, object]:
    samples = Sample.objects.filter(run_id=run_id)
    return {
        "steps": sorted(MetricPoint.objects.filter(run_id=run_id).values_list("step", flat=True)),
        "train": samples.filter(split="train").count(),
        "val": samples.filter(split="val").count(),
    }


def test_watch_once_sends_every_file_once_and_a_later_pass_only_what_is_new(
    studio, token, tmp_path
):
    log, rollout_dir, val_dir = tmp_path / "m.jsonl", tmp_path / "rollouts", tmp_path / "val"
    fit(str(log), str(rollout_dir), str(val_dir), total=3, test_freq=2)
    args = ["watch", "--log", str(log), "--rollout-dir", str(rollout_dir),
            "--validation-dir", str(val_dir), "--name", "qwen-grpo", "--once"]  # fmt: skip
    done = posttrain(studio, token, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run = Run.objects.get()
    assert run.status == RunStatus.RUNNING and run.experiment.name == "qwen-grpo"
    assert counts(run.pk) == {"steps": [0, 1, 2, 3], "train": 3 * GROUP, "val": 3 * GROUP}
    assert run.latest_step == 3
    point = MetricPoint.objects.get(run=run, step=2)
    assert point.metrics["actor/kl_loss"] is None and point.metrics["critic/score/mean"] == (
        pytest.approx(0.27)
    )
    # verl's NaN loss (null in its file log) is a non-finite loss to the health checks too.
    alert = HealthAlert.objects.get(run=run)
    assert (alert.check_name, alert.step) == ("non_finite_loss", 2)
    assert alert.message == "actor/kl_loss is nan"
    group = Sample.objects.filter(run=run, step=1, split="train", prompt_text=PROMPTS[1])
    assert sorted(group.values_list("sample_index", flat=True)) == list(range(N))
    assert len(set(group.values_list("prompt_index", flat=True))) == 1
    assert group.first().ground_truth == "42" and set(group.first().reward_parts) == {"acc", "pred"}
    # Again: nothing new, nothing doubled.
    assert posttrain(studio, token, *args, cwd=tmp_path).returncode == 0
    assert counts(run.pk) == {"steps": [0, 1, 2, 3], "train": 3 * GROUP, "val": 3 * GROUP}
    # verl goes on: step 4's dump and line are sent, then the run is finished.
    dump_generations(4, *rollouts(4), str(rollout_dir))
    with open(log, "ab") as f:
        f.write(b'{"step":4,"data":{"critic/score/mean":0.9}}\n')
    ended = posttrain(studio, token, *args, "--end", "succeeded", cwd=tmp_path)
    assert ended.returncode == 0, ended.stderr
    assert counts(run.pk) == {"steps": [0, 1, 2, 3, 4], "train": 4 * GROUP, "val": 3 * GROUP}
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and Run.objects.count() == 1


def test_a_watcher_killed_after_the_studio_took_a_batch_sends_it_again_without_doubling(
    studio, token, tmp_path, monkeypatch
):
    log, rollout_dir = tmp_path / "m.jsonl", tmp_path / "rollouts"
    fit(str(log), str(rollout_dir), None, total=3, test_freq=9)
    options = WatchOptions(log=log, rollout_dir=rollout_dir, name="crash", once=True)
    sent = ExternalRun.samples

    def then_die(self, samples):
        sent(self, samples)  # the studio stored it; the watcher dies before it notes so
        raise KeyboardInterrupt

    monkeypatch.setattr(ExternalRun, "samples", then_die)
    with Studio(studio.url, token) as client, pytest.raises(KeyboardInterrupt):
        Watcher(client, options).watch()
    monkeypatch.setattr(ExternalRun, "samples", sent)
    run = Run.objects.get()
    assert counts(run.pk) == {"steps": [], "train": GROUP, "val": 0}
    with Studio(studio.url, token) as client:
        Watcher(client, options).watch()
    assert counts(run.pk) == {"steps": [1, 2, 3], "train": 3 * GROUP, "val": 0}
    # verl relaunched with the same log path truncates it ("wb"): its steps replace the old.
    logger = FileLogger(str(log))
    logger.log({"critic/score/mean": 0.75}, step=2)
    logger.finish()
    dump_generations(2, *rollouts(2, shuffle=False), str(rollout_dir))  # a new dump of step 2
    with Studio(studio.url, token) as client:
        Watcher(client, options).watch()
    assert counts(run.pk) == {"steps": [1, 2, 3], "train": 3 * GROUP, "val": 0}
    assert MetricPoint.objects.get(run=run, step=2).metrics["critic/score/mean"] == 0.75
    assert Run.objects.count() == 1


def test_the_watcher_waits_out_a_studio_restart(studio, token, tmp_path):
    log, rollout_dir = tmp_path / "m.jsonl", tmp_path / "rollouts"
    fit(str(log), str(rollout_dir), None, total=2, test_freq=9)
    studio.stop()
    options = WatchOptions(log=log, rollout_dir=rollout_dir, name="restart", once=True)
    errors: list[BaseException] = []

    def watch() -> None:
        try:
            with Studio(studio.url, token) as client:
                Watcher(client, options).watch()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=watch)
    thread.start()
    time.sleep(3)  # the watcher is retrying against a closed port
    assert thread.is_alive()
    studio.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and not errors
    run = Run.objects.get()
    assert counts(run.pk) == {"steps": [1, 2], "train": 2 * GROUP, "val": 0}


def verl_command(*overrides: str) -> list[str]:
    return ["--", sys.executable, "-m", "tests.client.fake_verl",
            "trainer.logger=[console,file]", "trainer.rollout_data_dir=rollouts",
            "trainer.validation_data_dir=val", *overrides]  # fmt: skip


def test_a_wrapped_command_is_reported_with_its_output_and_outcome(studio, token, tmp_path):
    done = posttrain(studio, token, "watch", *verl_command("trainer.total_training_steps=3"),
                     cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Training Progress: step 3/3" in done.stdout  # teed to the terminal
    run = Run.objects.get()
    assert run.status == RunStatus.SUCCEEDED and run.total_steps == 3
    assert counts(run.pk) == {"steps": [0, 1, 2, 3], "train": 3 * GROUP, "val": 3 * GROUP}
    location = run.external.location
    assert location.startswith(f"{os.uname().nodename}:{tmp_path} $ ")
    assert location.endswith("-m tests.client.fake_verl 'trainer.logger=[console,file]' "
                             "trainer.rollout_data_dir=rollouts trainer.validation_data_dir=val "
                             "trainer.total_training_steps=3")  # fmt: skip
    log = (run_dir(run.pk) / LOG_FILE).read_text()
    assert "Training Progress: step 1/3\n" in log and "Training Progress: step 3/3\n" in log
    failed = posttrain(studio, token, "watch", *verl_command("fail=1"), cwd=tmp_path)
    assert failed.returncode == 1
    second = Run.objects.exclude(pk=run.pk).get()  # the first had ended: a new run
    assert second.status == RunStatus.FAILED and "CUDA out of memory" in second.error
    assert "the command exited with 1" in second.error


def test_cancel_in_the_studio_stops_a_command_that_allowed_it(studio, token, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POSTTRAIN_URL": studio.url,
           "POSTTRAIN_TOKEN": token}  # fmt: skip
    args = ["watch", "--allow-cancel", "--heartbeat", "0.5", "--interval", "0.5",
            *verl_command("trainer.total_training_steps=60", "pause_s=0.5")]  # fmt: skip
    watcher = subprocess.Popen(
        [sys.executable, "-m", "posttrain_client", *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not MetricPoint.objects.filter(step__gte=1).exists():
            assert time.monotonic() < deadline and watcher.poll() is None
            time.sleep(0.2)
        run = Run.objects.get()
        assert run.can_cancel
        run_cancel(run=run)
        output, _ = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED, output
    assert "the studio asks to cancel the run: stopping the command" in output
    assert run.latest_step < 60
