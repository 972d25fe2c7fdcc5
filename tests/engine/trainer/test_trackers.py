"""Experiment trackers, each through its own library, offline: what a run logs reads back equal.

Every tracker runs in a child process with its own HOME and no tracker variables but the test's
(offline modes, a ``file:`` MLflow store), as a run would: the libraries keep global state and
threads, and ClearML patches the process it runs in.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path

import pytest

from engine.config import ConfigValidationError, config_to_dict, load_config, validate_config
from engine.config.introspect import iter_field_specs
from engine.trainer.reporting import Recorder
from engine.trainer.trackers import (
    RECORDERS,
    TRACKER_ENV_PREFIXES,
    TRACKER_MODULES,
    TRACKERS,
    clearml_title_series,
    default_recorders,
    flat_params,
    mlflow_key,
    tracker_environment,
    tracker_install_problems,
)
from tests.engine.command_line import run_python_code

ROOT = Path(__file__).resolve().parents[3]
PROJECT, EXPERIMENT = "posttrain-tests", "tiny-run"
# Two steps of verl-named metrics, one with the '@' MLflow refuses.
STEPS = [
    {
        "critic/score/mean": 0.25,
        "actor/pg_loss": -0.125,
        "timing_s/gen": 1.5,
        "val-core/tiny_arithmetic/reward/mean@1": 0.5,
    },
    {
        "critic/score/mean": 0.75,
        "actor/pg_loss": 0.0625,
        "timing_s/gen": 1.25,
        "val-core/tiny_arithmetic/reward/mean@1": 0.625,
    },
]
CHILD = """
import contextlib, json, sys
from engine.trainer.trackers import RECORDERS, tracker_environment
name, status, folder = sys.argv[1:4]
with open("inputs.json") as f:
    config, steps, project, experiment = json.load(f)
with tracker_environment(folder) if folder else contextlib.nullcontext():
    recorder = RECORDERS[name](project, experiment)
    recorder.on_start(config=config, total_steps=len(steps), start_step=0)
    for step, metrics in enumerate(steps, start=1):
        recorder.on_step(step, metrics)
    recorder.on_finish(status=status)
    recorder.on_finish(status=status)  # a second call (run_training after fit) changes nothing
"""


def tiny_config_dict() -> dict:
    return config_to_dict(load_config("grpo_tiny.yaml"))


# The variables by which MLflow (mlflow.telemetry.utils) knows it runs under a test or in CI, where
# it writes nothing in the home; the tests that check where a tracker's home files go clear them.
TEST_OR_CI_MARKERS = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "CI",
        "GITHUB_ACTIONS",
        "CIRCLECI",
        "GITLAB_CI",
        "JENKINS_URL",
        "TRAVIS",
        "TF_BUILD",
        "BITBUCKET_BUILD_NUMBER",
        "CODEBUILD_BUILD_ARN",
        "BUILDKITE",
        "TEAMCITY_VERSION",
        "CLOUD_RUN_EXECUTION",
        "RUNBOT_HOST_URL",
        "RUNBOT_BUILD_NAME",
        "RUNBOT_WORKER_ID",
    }
)


def run_tracker(
    name: str, tmp_path: Path, status: str = "succeeded", folder: Path | None = None, **env: str
) -> None:
    """Run a tracker's recorder over ``STEPS`` in a child process with only ``env`` for it.

    Its HOME is ``tmp_path/home``; with ``folder`` the recorder runs in ``tracker_environment``.
    """
    # As a run's on a server: no XDG folders of this machine, and none of the markers that tell
    # MLflow it runs under a test or CI (it writes its telemetry file in the home only outside them).
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((*TRACKER_ENV_PREFIXES, "XDG_")) and k not in TEST_OR_CI_MARKERS
    }
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    child_env = {**clean, "HOME": str(home), "PYTHONPATH": str(ROOT), **env}
    (tmp_path / "inputs.json").write_text(
        json.dumps([tiny_config_dict(), STEPS, PROJECT, EXPERIMENT])
    )
    run_python_code(
        CHILD, name, status, str(folder or ""), cwd=tmp_path, env=child_env, timeout=180
    )


def log_records(path: Path) -> list[bytes]:
    """Return the records of a LevelDB-style log (wandb's ``.wandb``), checking each CRC."""
    data, records, chunk = path.read_bytes(), [], b""
    block, position = 32768, 7  # 32 KiB blocks; the file starts with a 7-byte header
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        crc, length, kind = (
            int.from_bytes(data[position : position + 4], "little"),
            int.from_bytes(data[position + 4 : position + 6], "little"),
            data[position + 6],
        )
        body = data[position + 7 : position + 7 + length]
        if kind == 0 and length == 0:
            break
        assert zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc
        chunk += body
        if kind in (1, 4):  # FULL or LAST ends a record
            records.append(chunk)
            chunk = b""
        position += 7 + length
    return records


# -- names, mapping and the missing-extra error ---------------------------------------------------


def test_trainer_logger_accepts_exactly_the_trackers():
    (spec,) = [s for s in iter_field_specs() if s.key == "trainer.logger"]
    assert spec.choices == list(TRACKERS)
    assert set(TRACKERS) == {"console", "jsonl", *RECORDERS}
    assert set(RECORDERS) == set(TRACKER_MODULES)
    assert {"wandb", "tensorboard", "mlflow", "swanlab", "clearml"} <= set(RECORDERS)


def test_a_tracker_whose_library_is_missing_is_refused_at_validation(monkeypatch):
    config = load_config("grpo_tiny.yaml", overrides=["trainer.logger=[console,wandb,mlflow]"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # as Python sees a package not installed
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(config, check_files=False)
    (error,) = caught.value.errors
    assert error.key == "trainer.logger"
    assert error.message == ("names 'wandb' but wandb is not installed: pip install -e .[trackers]")
    assert tracker_install_problems(["console", "jsonl", "mlflow"]) == []


def test_an_unknown_tracker_is_refused_with_the_list():
    config = load_config("grpo_tiny.yaml", overrides=["trainer.logger=[console,wandbb]"])
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(config, check_files=False)
    message = caught.value.errors[0].message
    assert "wandb, tensorboard, mlflow, swanlab, clearml" in message
    assert "did you mean wandb?" in message


def test_mlflow_keys_are_mapped_as_verl_maps_them():
    assert mlflow_key("val-core/gsm8k/reward/mean@1") == "val-core/gsm8k/reward/mean_at_1"
    assert mlflow_key("critic/score/mean") == "critic/score/mean"
    assert mlflow_key("a//b///c") == "a/b/c"
    assert mlflow_key("pass@k (n=4)") == "pass_at_k _n_4_"
    assert mlflow_key("time: s.1-x") == "time: s.1-x"


def test_params_flatten_like_verls_and_clearml_splits_at_the_first_slash():
    params = flat_params({"a": {"b": 1, "c": [5, {"d": "x"}], "e": [], "f": None}})
    assert params == {
        "a/b": 1,
        "a/c/list_len": 2,
        "a/c/0": 5,
        "a/c/1/d": "x",
        "a/e": [],
        "a/f": None,
    }
    assert clearml_title_series("critic/score/mean") == ("critic", "score/mean")
    assert clearml_title_series("loss") == ("loss", "loss")


def test_tracker_environment_points_the_output_into_one_folder_and_restores(monkeypatch, tmp_path):
    user = tmp_path / "user"
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user / "config"))
    monkeypatch.setenv("TENSORBOARD_DIR", "/elsewhere")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/srv/vllm-cache")
    for name in ("MLFLOW_TRACKING_URI", "XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "trackers"
    with tracker_environment(folder) as settings:
        assert os.environ["TENSORBOARD_DIR"] == str(folder / "tensorboard")
        assert os.environ["WANDB_DIR"] == str(folder)
        assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{folder / 'mlflow.db'}"
        assert settings["SWANLAB_LOG_DIR"] == str(folder / "swanlog")
        # The libraries' home is the folder's; the model and kernel caches stay the user's.
        assert Path("~").expanduser() == folder / "home" and (folder / "home").is_dir()
        assert os.environ["XDG_CONFIG_HOME"] == str(folder / "home" / ".config")
        assert os.environ["XDG_CACHE_HOME"] == str(folder / "home" / ".cache")
        assert os.environ["HF_HOME"] == str(user / ".cache" / "huggingface")
        assert os.environ["TRITON_CACHE_DIR"] == str(user / ".triton" / "cache")
        assert os.environ["VLLM_CACHE_ROOT"] == "/srv/vllm-cache"
    assert os.environ["TENSORBOARD_DIR"] == "/elsewhere"
    assert os.environ["HOME"] == str(user) and os.environ["XDG_CONFIG_HOME"] == str(user / "config")
    for name in ("MLFLOW_TRACKING_URI", "XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR"):
        assert name not in os.environ
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")  # the server's
    with tracker_environment(tmp_path):
        assert os.environ["MLFLOW_TRACKING_URI"] == "http://mlflow.internal:5000"


def test_default_recorders_build_one_recorder_per_named_tracker():
    config = load_config("grpo_tiny.yaml", overrides=["trainer.logger=[console,tensorboard]"])
    recorders = default_recorders(config)
    assert [type(r).__name__ for r in recorders] == ["ConsoleRecorder", "TensorboardRecorder"]
    assert (recorders[1].project, recorders[1].experiment) == ("posttrain", "grpo_tiny")
    recorders[1].on_finish(status="failed")  # never started: nothing to close, no error


# -- each library, offline ------------------------------------------------------------------------

# What each library keeps in its home, offline: seen in the user's HOME before it was the folder's.
KEPT_IN_HOME = {"mlflow": ".config/mlflow", "wandb": ".cache/wandb", "clearml": ".clearml"}


# posttrain writes only its run key, under trainer.default_local_dir, and reports over HTTP to a
# studio (tests/client/test_engine_logger.py runs it against a live one).
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.slow] * (n == "clearml"))
        for n in RECORDERS
        if n != "posttrain"
    ],
)
def test_a_tracker_in_its_environment_writes_nothing_in_the_users_home(name, tmp_path):
    folder = tmp_path / "trackers"
    offline = {"WANDB_MODE": "offline", "SWANLAB_MODE": "offline", "CLEARML_OFFLINE_MODE": "1"}
    run_tracker(name, tmp_path, folder=folder, **offline)
    assert sorted((tmp_path / "home").rglob("*")) == []
    if name in KEPT_IN_HOME:
        assert (folder / "home" / KEPT_IN_HOME[name]).is_dir()


def test_wandb_offline_writes_the_run_with_config_and_metrics(tmp_path):
    from wandb.proto import wandb_internal_pb2

    run_tracker("wandb", tmp_path, WANDB_MODE="offline", WANDB_DIR=str(tmp_path))
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    history, run, exit_code = {}, None, None
    for data in log_records(log):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "run":
            run = record.run
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert run is not None and (run.project, run.display_name) == (PROJECT, EXPERIMENT)
    assert history == {1: STEPS[0], 2: STEPS[1]}
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["trainer"]["project_name"] == "posttrain"
    assert config["algorithm"]["adv_estimator"] == "grpo"
    assert exit_code == 0


def test_tensorboard_event_files_read_back_with_the_same_names_and_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = tmp_path / "tb"
    run_tracker("tensorboard", tmp_path, TENSORBOARD_DIR=str(folder))
    events = EventAccumulator(str(folder))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(STEPS[0])
    for key in STEPS[0]:
        assert [(e.step, e.value) for e in events.Scalars(key)] == [
            (1, STEPS[0][key]),
            (2, STEPS[1][key]),
        ]
    (text,) = events.Tensors("config/text_summary")  # the resolved config, as text
    assert '"adv_estimator": "grpo"' in text.tensor_proto.string_val[0].decode()


def test_tensorboard_defaults_to_verls_folder(tmp_path):
    run_tracker("tensorboard", tmp_path)
    folder = tmp_path / "tensorboard_log" / PROJECT / EXPERIMENT
    assert list(folder.glob("events.out.tfevents.*"))


def test_mlflow_file_store_reads_back_equal_through_the_client(tmp_path):
    from mlflow import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()  # file:///...
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_ALLOW_FILE_STORE": "true"}
    run_tracker("mlflow", tmp_path, status="cancelled", **env)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the store
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert run.info.run_name == EXPERIMENT
    assert run.info.status == "KILLED"  # a cancelled run
    params = run.data.params
    assert params["trainer/project_name"] == "posttrain"
    assert params["algorithm/adv_estimator"] == "grpo"
    assert params["trainer/logger/list_len"] == "1" and params["trainer/logger/0"] == "console"
    assert set(run.data.metrics) == {mlflow_key(k) for k in STEPS[0]}
    assert "val-core/tiny_arithmetic/reward/mean_at_1" in run.data.metrics
    for key in STEPS[0]:
        history = client.get_metric_history(run.info.run_id, mlflow_key(key))
        assert sorted((m.step, m.value) for m in history) == [
            (1, STEPS[0][key]),
            (2, STEPS[1][key]),
        ]


def test_swanlab_offline_keeps_the_run_in_its_log_folder(tmp_path):
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    folder = tmp_path / "swanlog"
    run_tracker("swanlab", tmp_path, SWANLAB_MODE="offline", SWANLAB_LOG_DIR=str(folder))
    (log,) = folder.glob("run-*/run-*.swanlab")
    reader, scalars, start, finish = DataStoreReader(), {}, None, None
    reader.open(log)
    for data in reader:
        record = record_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "scalar":
            scalars.setdefault(record.scalar.step, {})[record.scalar.key] = (
                record.scalar.value.number
            )
        elif kind == "start":
            start = record.start
        elif kind == "finish":
            finish = record.finish
    reader.close()
    assert start is not None and (start.project, start.name) == (PROJECT, EXPERIMENT)
    assert scalars == {1: STEPS[0], 2: STEPS[1]}
    assert finish is not None
    states = finish.DESCRIPTOR.fields_by_name["state"].enum_type.values_by_number
    assert states[finish.state].name == "RUN_STATE_FINISHED"
    (config,) = folder.glob("run-*/files/config.yaml")
    assert "adv_estimator" in config.read_text()


@pytest.mark.slow  # ClearML's close waits ~10 s for its reporting threads
def test_clearml_offline_session_holds_the_scalars_and_the_config(tmp_path):
    cache = tmp_path / "clearml"
    run_tracker("clearml", tmp_path, CLEARML_OFFLINE_MODE="1", CLEARML_CACHE_DIR=str(cache))
    (session,) = (p for p in (cache / "offline").iterdir() if p.is_dir())
    events = [
        event
        for line in (session / "metrics.jsonl").read_text().splitlines()
        for event in json.loads(line)
        if event["type"] == "training_stats_scalar"
    ]
    got = {(e["iter"], f"{e['metric']}/{e['variant']}"): e["value"] for e in events}
    assert got == {(step, k): v for step, m in enumerate(STEPS, 1) for k, v in m.items()}
    task = json.loads((session / "task.json").read_text())
    assert task["name"] == EXPERIMENT
    assert "adv_estimator" in json.dumps(task["configuration"])


# -- a real tiny run -----------------------------------------------------------------------------


def test_a_tiny_run_logs_to_tensorboard_the_metric_names_the_studio_records(
    make_config, monkeypatch, tmp_path
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from engine.trainer import PPOTrainer

    class Steps(Recorder):  # what the studio's recorder is handed
        def __init__(self):
            self.metrics: dict[int, dict[str, float]] = {}

        def on_step(self, step, metrics):
            self.metrics[step] = dict(metrics)

    folder = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_DIR", str(folder))
    config = make_config("grpo_tiny", "trainer.logger=[console,tensorboard]")
    steps = Steps()
    assert PPOTrainer(config, steps).fit() == "succeeded"
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(steps.metrics[1]) | set(steps.metrics[2])
    assert {"critic/score/mean", "actor/pg_loss", "timing_s/gen"} <= set(steps.metrics[2])
    for key, value in steps.metrics[2].items():
        (last,) = [e for e in events.Scalars(key) if e.step == 2]
        assert last.value == pytest.approx(value, rel=1e-6, abs=1e-6)
