"""Experiment trackers: ``trainer.logger`` names as verl spells them, each one a ``Recorder``.

``TRACKERS`` is the one list of names ``trainer.logger`` accepts (the config schema imports it).
``default_recorders`` builds the recorders a run's ``trainer.logger`` names: ``console`` and
``jsonl`` are the built-in recorders of ``engine.trainer.reporting`` (which knows nothing of this
module); the others report through their own library, installed with the optional extra (``pip
install -e .[trackers]``) and imported only when a run names them. The validator refuses a name whose
library is missing (``tracker_install_problems``) before anything runs.

Each tracker follows verl's ``verl/utils/tracking.py``: the project is ``trainer.project_name``,
the run ``trainer.experiment_name``, the resolved config is the run's config (or params), every
step's metrics go out under verl's names, and the run is finished in ``on_finish``. Where a run
writes comes from the same environment variables verl reads:

- wandb: the library's own (``WANDB_MODE``, ``WANDB_DIR``, ``WANDB_API_KEY``...), ``WANDB_ENTITY``;
- tensorboard: ``$TENSORBOARD_DIR``, else ``tensorboard_log/<project>/<experiment>``;
- mlflow: ``$MLFLOW_TRACKING_URI``, else verl's ``sqlite:////tmp/mlruns.db``; ``MLFLOW_RUN_ID``
  attaches to an existing run. MLflow refuses some characters in a key, so keys are mapped as
  verl maps them (``mlflow_key``): ``@`` becomes ``_at_``, repeated slashes one slash, and any
  other character outside letters, digits, ``_ - . / :`` and space an underscore
  (``val-core/gsm8k/reward/mean@1`` is logged as ``val-core/gsm8k/reward/mean_at_1``);
- swanlab: ``SWANLAB_API_KEY`` (log in), ``SWANLAB_LOG_DIR`` (``swanlog``), ``SWANLAB_MODE``
  (``cloud``; ``offline`` and ``local`` need no network);
- clearml: the library's own (``CLEARML_OFFLINE_MODE``, ``CLEARML_CACHE_DIR``, its config file).
  ClearML files a scalar under a title and a series: ``critic/score/mean`` is title ``critic``,
  series ``score/mean`` (verl's split at the first slash; a name without one is both).

``tracker_environment`` points every tracker's local output into one folder, the libraries'
home included: the studio's driver uses it so a run's tracker files stay in the run's own folder
on the server and nothing lands in the worker's ``HOME``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config.trackers import (  # noqa: F401 - re-exported for the trainer's callers
    TRACKER_MODULES,
    TRACKERS,
    tracker_install_problems,
)
from engine.trainer.reporting import ConsoleRecorder, JsonlRecorder, Recorder

if TYPE_CHECKING:
    from engine.config import PPOConfig

# Variables a tracker reads (keys, hosts, modes): the studio's driver keeps them.
TRACKER_ENV_PREFIXES = ("WANDB_", "MLFLOW_", "SWANLAB_", "CLEARML_", "TENSORBOARD_")
MLFLOW_DEFAULT_URI = "sqlite:////tmp/mlruns.db"  # verl's default
_MLFLOW_INVALID = re.compile(r"[^/\w.\- :]")  # MLflow allows these in a metric or param key
_SLASHES = re.compile(r"/+")
# How fit ended, as each tracker names it.
_MLFLOW_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
_SWANLAB_STATE = {"succeeded": "success", "failed": "crashed", "cancelled": "aborted"}


def mlflow_key(key: str) -> str:
    """Return ``key`` as MLflow accepts it, mapped as verl maps it (``@`` becomes ``_at_``)."""
    return _MLFLOW_INVALID.sub("_", _SLASHES.sub("/", key.replace("@", "_at_")))


def flat_params(config: dict[str, Any] | list[Any], prefix: str = "") -> dict[str, Any]:
    """Return the config as ``section/key`` params; a list is ``key/list_len`` and ``key/<i>``."""
    items: dict[str, Any] = {}
    pairs = (
        [("list_len", len(config)), *((str(i), v) for i, v in enumerate(config))]
        if isinstance(config, list)
        else config.items()
    )
    for name, value in pairs:
        key = f"{prefix}{name}"
        if isinstance(value, dict | list) and value:
            items.update(flat_params(value, f"{key}/"))
        else:
            items[key] = value
    return items


def clearml_title_series(key: str) -> tuple[str, str]:
    """Return ClearML's (title, series) for a metric: verl's split at the first slash."""
    title, _, series = key.partition("/")
    return (title, series) if series else (key, key)


def _shared_caches() -> dict[str, str]:
    """Return the cache folders a run keeps sharing with this process, whatever its ``HOME``.

    Downloaded models (``HF_HOME``) and compiled kernels (``VLLM_CACHE_ROOT``,
    ``TRITON_CACHE_DIR``): each library's variable, else its default under this home.
    """
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    defaults = {
        "HF_HOME": os.path.join(cache, "huggingface"),
        "VLLM_CACHE_ROOT": os.path.join(cache, "vllm"),
        "TRITON_CACHE_DIR": os.path.expanduser("~/.triton/cache"),
    }
    return {name: os.environ.get(name) or default for name, default in defaults.items()}


@contextmanager
def tracker_environment(folder: str | Path) -> Iterator[dict[str, str]]:
    """Point every tracker's local output into ``folder`` while the block runs; yield the settings.

    Tensorboard, wandb, swanlab and clearml write under ``folder`` whatever the environment said.
    MLflow logs to ``folder/mlflow.db`` unless ``MLFLOW_TRACKING_URI`` is set (a server's MLflow).
    ``HOME`` and the XDG folders are ``folder/home``, so what the libraries keep in a home
    (ClearML's ``.clearml/``, MLflow's ``.config/mlflow/``, wandb's debug logs) stays in the
    folder too, and nothing of the user's home (``~/.netrc``, ``~/clearml.conf``) is read: keys
    come from the variables. The model and kernel caches stay where they were
    (:func:`_shared_caches`). Inside the block ``~`` is ``folder/home``: expand it in paths before.
    The variables are restored afterwards.
    """
    folder = Path(folder).resolve()
    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    settings = {
        **_shared_caches(),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "TENSORBOARD_DIR": str(folder / "tensorboard"),
        "WANDB_DIR": str(folder),
        "SWANLAB_LOG_DIR": str(folder / "swanlog"),
        "CLEARML_CACHE_DIR": str(folder / "clearml"),
    }
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        settings["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield settings
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _TrackerRecorder(Recorder):
    """A tracker's run: started in ``on_start``, finished once in ``on_finish``."""

    def __init__(self, project: str, experiment: str) -> None:
        self.project, self.experiment = project, experiment
        self.started = False

    def on_start(self, *, config: dict[str, Any], total_steps: int, start_step: int) -> None:
        self.start(config)
        self.started = True

    def on_finish(self, *, status: str, error: str | None = None) -> None:
        if self.started:  # a run that failed before its first step has nothing to close
            self.started = False
            self.finish(str(status), error)

    def start(self, config: dict[str, Any]) -> None:
        raise NotImplementedError

    def finish(self, status: str, error: str | None) -> None:
        raise NotImplementedError


class WandbRecorder(_TrackerRecorder):
    """Log to Weights & Biases; ``WANDB_MODE=offline`` writes the run under ``WANDB_DIR`` only."""

    def start(self, config: dict[str, Any]) -> None:
        import wandb  # optional: the [trackers] extra

        self.run = wandb.init(
            project=self.project,
            name=self.experiment,
            entity=os.environ.get("WANDB_ENTITY"),
            config=config,
        )

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def finish(self, status: str, error: str | None) -> None:
        self.run.finish(exit_code=0 if status != "failed" else 1)


class TensorboardRecorder(_TrackerRecorder):
    """Write event files to ``$TENSORBOARD_DIR`` or ``tensorboard_log/<project>/<experiment>``."""

    def start(self, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter  # optional: the [trackers] extra

        default = Path("tensorboard_log") / self.project / self.experiment
        self.directory = Path(os.environ.get("TENSORBOARD_DIR") or default)
        self.directory.mkdir(parents=True, exist_ok=True)
        print(f"tensorboard: writing to {self.directory}", flush=True)
        self.writer = SummaryWriter(str(self.directory))
        # Markdown: indented four spaces, the JSON shows as code in tensorboard's text tab.
        text = json.dumps(config, indent=2, default=str).replace("\n", "\n    ")
        self.writer.add_text("config", "    " + text, 0)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def finish(self, status: str, error: str | None) -> None:
        self.writer.close()


class MlflowRecorder(_TrackerRecorder):
    """Log to MLflow at ``$MLFLOW_TRACKING_URI``; keys mapped by ``mlflow_key``."""

    def start(self, config: dict[str, Any]) -> None:
        from mlflow import MlflowClient  # optional: the [trackers] extra
        from mlflow.entities import Param

        self.client = MlflowClient(os.environ.get("MLFLOW_TRACKING_URI") or MLFLOW_DEFAULT_URI)
        run_id = os.environ.get("MLFLOW_RUN_ID")  # set by platforms that start the run
        if not run_id:
            # MLflow's experiment is verl's project; its run is verl's experiment.
            found = self.client.get_experiment_by_name(self.project)
            experiment_id = (
                found.experiment_id if found else self.client.create_experiment(self.project)
            )
            run_id = self.client.create_run(experiment_id, run_name=self.experiment).info.run_id
        self.run_id = run_id
        params = [Param(mlflow_key(k), str(v)) for k, v in flat_params(config).items()]
        self.client.log_batch(run_id, params=params)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric  # optional: the [trackers] extra

        now = int(time.time() * 1000)
        rows = [Metric(mlflow_key(k), float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=rows)

    def finish(self, status: str, error: str | None) -> None:
        self.client.set_terminated(self.run_id, _MLFLOW_STATUS.get(status, "FINISHED"))


class SwanlabRecorder(_TrackerRecorder):
    """Log to SwanLab; ``SWANLAB_MODE=offline`` keeps the run under ``SWANLAB_LOG_DIR``."""

    def start(self, config: dict[str, Any]) -> None:
        import swanlab  # optional: the [trackers] extra

        self.swanlab = swanlab
        if os.environ.get("SWANLAB_API_KEY"):
            swanlab.login(os.environ["SWANLAB_API_KEY"])
        swanlab.init(
            project=self.project,
            name=self.experiment,
            config=config,
            log_dir=os.environ.get("SWANLAB_LOG_DIR") or "swanlog",
            mode=os.environ.get("SWANLAB_MODE") or "cloud",
        )

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.swanlab.log(dict(metrics), step=step)

    def finish(self, status: str, error: str | None) -> None:
        self.swanlab.finish(state=_SWANLAB_STATE.get(status, "success"), error=error)


class ClearmlRecorder(_TrackerRecorder):
    """Log to ClearML as a task; ``CLEARML_OFFLINE_MODE=1`` stores it under its cache folder."""

    def start(self, config: dict[str, Any]) -> None:
        from clearml import Task  # optional: the [trackers] extra

        self.task: Any = Task.init(
            project_name=self.project,
            task_name=self.experiment,
            continue_last_task=True,
            output_uri=False,
            # Its repository scan runs git in a thread of a process that is forking workers and
            # has been seen to hang there (and hold close() with it); a run's config is logged.
            auto_connect_frameworks={"detect_repository": False},
        )
        self.task.connect_configuration(config, name="Hyperparameters")
        self.logger: Any = self.task.get_logger()

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            title, series = clearml_title_series(key)
            self.logger.report_scalar(title=title, series=series, value=value, iteration=step)

    def finish(self, status: str, error: str | None) -> None:
        if status == "failed":
            self.task.mark_failed(status_message=(error or "")[-1000:])
        self.task.close()


class PosttrainRecorder(_TrackerRecorder):
    """Report the run to a PostTrain Studio as an external run (``posttrain_client``).

    The studio is ``$POSTTRAIN_URL`` with the token ``$POSTTRAIN_TOKEN`` (made at
    ``/accounts/tokens/``); both are checked when the recorder is made, before training starts.
    The run joins the studio experiment ``trainer.experiment_name``; its config, every step's
    metrics and samples (with their per-token log-probs) and its end state go there, so a run
    started by hand shows up like a studio run. The run's key is kept in
    ``trainer.default_local_dir``, so a run resumed there reports into the same studio run while
    that is open. With ``POSTTRAIN_ALLOW_CANCEL=1``, Cancel on the run's page stops training after
    the step (``should_stop``, polled at most every ``POSTTRAIN_HEARTBEAT_S`` seconds, 15).
    Reports go out on a thread of their own: training never waits on the studio.
    """

    def __init__(self, project: str, experiment: str) -> None:
        super().__init__(project, experiment)
        missing = [
            name for name in ("POSTTRAIN_URL", "POSTTRAIN_TOKEN") if not os.environ.get(name)
        ]
        if missing:
            raise ValueError(
                f"trainer.logger names posttrain but {' and '.join(missing)} is not set: export "
                "POSTTRAIN_URL=http://<studio>:8000 and POSTTRAIN_TOKEN=<a token made at "
                "/accounts/tokens/>, or drop posttrain from trainer.logger"
            )
        self.allow_cancel = os.environ.get("POSTTRAIN_ALLOW_CANCEL") == "1"
        self.heartbeat_s = float(os.environ.get("POSTTRAIN_HEARTBEAT_S", "15"))
        self.last_beat = 0.0
        self.cancel = False

    def start(self, config: dict[str, Any]) -> None:
        import socket
        import sys

        from posttrain_client import Studio, __version__  # optional: httpx
        from posttrain_client.external import BackgroundSender, ExternalRun, new_key

        folder = Path(config["trainer"]["default_local_dir"]).expanduser()
        key_file = folder / "posttrain-run.json"
        if key_file.exists():
            key = json.loads(key_file.read_text())["key"]
        else:
            key = new_key()
            folder.mkdir(parents=True, exist_ok=True)
            key_file.write_text(json.dumps({"key": key}))
        self.studio = Studio(os.environ["POSTTRAIN_URL"], os.environ["POSTTRAIN_TOKEN"])
        fields = {
            "location": f"{socket.gethostname()}:{Path.cwd()} $ {' '.join(sys.argv)}"[:500],
            "client": f"engine {__version__}",
            "cancel_honoured": self.allow_cancel,
            "config": config,
            "total_steps": config["trainer"].get("total_training_steps"),
        }
        options = {"name": self.experiment, "source": "engine", "retry_for_s": 120.0, **fields}
        self.run = ExternalRun.create(self.studio, key=key, **options)
        if self.run.data["status"] not in ("running", "lost"):  # that run ended: a new one
            key = new_key()
            key_file.write_text(json.dumps({"key": key}))
            self.run = ExternalRun.create(self.studio, key=key, **options)
        print(f"posttrain: reporting to {self.run.url}", flush=True)
        self.sender = BackgroundSender()

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        run, values = self.run, dict(metrics)
        self.sender.put(lambda: run.steps([(step, values)]))

    def on_samples(self, step: int, samples: list[Any]) -> None:
        rows = [posttrain_sample(s) for s in samples]
        run = self.run
        self.sender.put(lambda: run.samples(rows))

    def should_stop(self) -> bool:
        if not self.started or not self.allow_cancel or self.cancel:
            return self.cancel
        if time.monotonic() - self.last_beat >= self.heartbeat_s:
            self.last_beat = time.monotonic()
            try:
                self.cancel = bool(self.run.heartbeat()["cancel_requested"])
            except Exception as exc:  # the studio's answer never stops training
                print(f"posttrain: heartbeat failed ({exc})", flush=True)
        return self.cancel

    def finish(self, status: str, error: str | None) -> None:
        run = self.run
        self.sender.put(lambda: run.finish(status, error or ""))
        self.sender.close(timeout_s=120.0)
        self.studio.close()


def posttrain_sample(sample: Any) -> dict[str, Any]:
    """Return an engine ``SampleRecord`` as the studio's external-run API takes it."""
    return {
        "step": sample.step,
        "split": sample.split,
        "prompt": sample.prompt_text,
        "response": sample.response_text,
        "reward": sample.reward,
        "sample_index": sample.sample_index,
        "prompt_index": sample.prompt_index,  # the dataset's index: the same prompt every step
        "reward_parts": sample.reward_parts,
        "ground_truth": sample.ground_truth,
        "data_source": sample.data_source,
        "group_id": sample.group_id,
        "advantage": sample.advantage,
        "response_length": sample.response_length,
        "truncated": sample.truncated,
        "tokens": sample.tokens or None,
        "token_logprobs": sample.token_logprobs or None,
        "token_ref_logprobs": sample.token_ref_logprobs,
        "token_advantages": sample.token_advantages,
    }


RECORDERS: dict[str, type[_TrackerRecorder]] = {
    "wandb": WandbRecorder,
    "tensorboard": TensorboardRecorder,
    "mlflow": MlflowRecorder,
    "swanlab": SwanlabRecorder,
    "clearml": ClearmlRecorder,
    "posttrain": PosttrainRecorder,
}


def tracker_recorders(config: PPOConfig) -> list[Recorder]:
    """Return a recorder for each tracker ``trainer.logger`` names (console and jsonl excepted)."""
    loggers = config.trainer.logger
    names = [loggers] if isinstance(loggers, str) else list(loggers or [])
    trainer = config.trainer
    return [
        RECORDERS[name](trainer.project_name, trainer.experiment_name)
        for name in dict.fromkeys(names)
        if name in RECORDERS
    ]


def default_recorders(config: PPOConfig) -> list[Recorder]:
    """Return the recorders that ``trainer.logger`` names: console, jsonl and the trackers."""
    loggers = config.trainer.logger
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    recorders: list[Recorder] = []
    if "console" in loggers:
        recorders.append(ConsoleRecorder(every=config.trainer.log_freq))
    if "jsonl" in loggers:
        folder = Path(config.trainer.default_local_dir).expanduser()
        recorders.append(JsonlRecorder(folder / "logs"))
    return recorders + tracker_recorders(config)
