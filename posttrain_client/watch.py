"""``posttrain watch``: stream a verl run's files into the studio as they are written.

verl writes a step's metrics to its file logger and its rollouts to ``trainer.rollout_data_dir``
(formats: ``posttrain_client.verl_files``). The watcher creates an external run, then polls the
files: each new complete line of the log is a step, each dump a step's samples (train from the
rollout folder, val from the validation folder), and sends them. With a command after ``--`` it
runs the command too, tees its output into the run's log, and finishes the run with the
command's outcome: succeeded (exit 0), failed (its last lines as the error) or cancelled.

A dump is complete once the log has recorded its step (verl dumps before it logs), once a later
dump exists in the same folder, once the command has exited, or once it has not changed for
``settle_s`` seconds; only then is it sent.

Resuming, with nothing lost or doubled: what has been sent is kept in a state file (the run's
key and id, the log's byte offset and identity, each sent dump's size and mtime), written
atomically after each batch the studio took. A watcher started again with the same state file
creates the run with the same key (the studio returns the same run) and goes on from there; what
it sends twice (a batch whose answer was lost) the studio stores once, since every append is
idempotent. A log that shrank or was replaced (verl opens it with ``"wb"``, so a relaunch
truncates it) is read again from its start: its steps replace the earlier ones. A dump that
changed after it was sent replaces the step's samples. While the studio is down or restarting,
the watcher waits and retries (the files are the buffer), so nothing is lost either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from posttrain_client.client import Studio
from posttrain_client.external import ExternalRun, new_key
from posttrain_client.verl_files import dump_samples, dump_steps, parse_logger_line, read_new_lines

logger = logging.getLogger("posttrain_client")

CLIENT = "posttrain watch"
ERROR_TAIL_LINES = 60
# verl overrides on the command line that give the watcher its defaults.
_OVERRIDE = re.compile(
    r"\+{0,2}trainer\.(rollout_data_dir|validation_data_dir|experiment_name|project_name|"
    r"total_training_steps)=(.*)"
)


def command_overrides(command: list[str]) -> dict[str, str]:
    """Return the ``trainer.*`` overrides of a verl command that the watcher reads."""
    found = {}
    for arg in command:
        match = _OVERRIDE.fullmatch(arg)
        if match and match.group(2) not in ("", "null", "None"):
            found[match.group(1)] = match.group(2).strip("'\"")
    return found


@dataclass
class WatchOptions:
    """What to watch and how (``posttrain watch --help`` documents each)."""

    log: Path | None = None
    rollout_dir: Path | None = None
    validation_dir: Path | None = None
    config: Path | None = None
    name: str | None = None
    state: Path | None = None
    total_steps: int | None = None
    command: list[str] = field(default_factory=list)
    allow_cancel: bool = False
    once: bool = False
    end: str | None = None
    tags: list[str] = field(default_factory=list)
    interval_s: float = 2.0
    heartbeat_s: float = 15.0
    settle_s: float = 10.0


@dataclass
class WatchState:
    """What has been sent, kept in a JSON file so a restarted watcher goes on from there."""

    path: Path
    key: str = ""
    run_id: int | None = None
    log_identity: list[int] | None = None  # [st_dev, st_ino] of the log when last read
    log_offset: int = 0
    logged_through: int = -1
    sent: dict[str, dict[str, list[int]]] = field(default_factory=lambda: {"train": {}, "val": {}})
    config_sent: str = ""

    @classmethod
    def load(cls, path: Path) -> WatchState:
        if not path.exists():
            return cls(path=path, key=new_key())
        data = json.loads(path.read_text())
        return cls(path=path, **{k: v for k, v in data.items() if k != "version"})

    def save(self) -> None:
        data = {k: v for k, v in self.__dict__.items() if k != "path"}
        tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"version": 1, **data}))
        os.replace(tmp, self.path)


class ChildProcess:
    """The watched command: its own session (so a signal reaches its whole tree), its output
    teed to ``out`` and kept for the run's log."""

    def __init__(self, command: list[str], env: dict[str, str], out: TextIO) -> None:
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.out = out
        self.lines: list[str] = []
        self.tail: deque[str] = deque(maxlen=ERROR_TAIL_LINES)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with contextlib.suppress(OSError, ValueError):
                self.out.write(line + "\n")
                self.out.flush()
            with self.lock:
                self.lines.append(line)
                self.tail.append(line)

    def take_lines(self) -> list[str]:
        with self.lock:
            lines, self.lines = self.lines, []
        return lines

    def exited(self) -> bool:
        """Return whether the command has exited and all its output has been read."""
        return self.process.poll() is not None and not self.reader.is_alive()

    def signal(self, number: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, number)

    def stop(self, grace_s: float = 30.0) -> None:
        """Ask the command's process group to stop (SIGTERM), then kill it after ``grace_s``."""
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)


class Watcher:
    """Create (or find again) the run, send what the files hold, finish when the job ends."""

    def __init__(self, studio: Studio, options: WatchOptions, out: TextIO = sys.stdout) -> None:
        self.studio = studio
        self.options = options
        self.out = out
        overrides = command_overrides(options.command)
        self.rollout_dir = options.rollout_dir or _path(overrides.get("rollout_data_dir"))
        self.validation_dir = options.validation_dir or _path(overrides.get("validation_data_dir"))
        self.total_steps = options.total_steps or _int(overrides.get("total_training_steps"))
        self.log = options.log or _path(os.environ.get("VERL_FILE_LOGGER_PATH"))
        if self.log is None and options.command:
            self.log = Path(".posttrain") / "metrics.jsonl"  # the command is told to write here
        if options.state is not None:
            state = options.state
        elif self.log is not None:
            state = self.log.with_name(self.log.name + ".posttrain.json")
        else:
            state = Path(".posttrain") / "watch.json"
        self.state = WatchState.load(state)
        self.name = (
            options.name
            or overrides.get("experiment_name")
            or (self.log.stem if self.log is not None else None)
            or "verl run"
        )
        self.child: ChildProcess | None = None
        self.run: ExternalRun | None = None
        self.started = time.time()
        self.last_beat = 0.0
        self.stopping_for_cancel = False
        self.interrupted = False
        self.told: set[str] = set()

    # -- output --------------------------------------------------------------------------------
    def say(self, text: str, once: str | None = None) -> None:
        if once is not None:
            if once in self.told:
                return
            self.told.add(once)
        with contextlib.suppress(OSError, ValueError):
            self.out.write(f"[posttrain] {text}\n")
            self.out.flush()

    # -- the run -------------------------------------------------------------------------------
    def location(self) -> str:
        where = f"{socket.gethostname()}:{Path.cwd()}"
        if self.options.command:
            where += " $ " + shlex.join(self.options.command)
        return where[:500]

    def open_run(self) -> ExternalRun:
        """Create the run (or find the one the state's key made); a fresh one if that one ended
        and there is a new command to report."""
        from posttrain_client import __version__

        fields: dict[str, Any] = {
            "location": self.location(),
            "client": f"{CLIENT} {__version__}",
            "cancel_honoured": bool(self.options.allow_cancel and self.options.command),
            "total_steps": self.total_steps,
            "tags": self.options.tags,
        }
        run = ExternalRun.create(
            self.studio, key=self.state.key, name=self.name, source="verl", **fields
        )
        if run.data["status"] not in ("running", "lost") and self.options.command:
            self.say(f"run {run.id} has ended ({run.data['status']}); reporting a new run")
            self.state = WatchState(path=self.state.path, key=new_key())
            run = ExternalRun.create(
                self.studio, key=self.state.key, name=self.name, source="verl", **fields
            )
        self.state.run_id = run.id
        self.state.save()
        self.say(f"reporting to {run.url}")
        return run

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.log is not None and "VERL_FILE_LOGGER_PATH" not in env:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            env["VERL_FILE_LOGGER_PATH"] = str(self.log.resolve())
        return env

    # -- sending -------------------------------------------------------------------------------
    def read_log(self) -> list[tuple[int, dict[str, Any]]]:
        """Return the steps of the log's new complete lines (from its start if it was replaced)."""
        if self.log is None or not self.log.exists():
            return []
        stat = self.log.stat()
        identity = [stat.st_dev, stat.st_ino]
        if self.state.log_identity != identity or stat.st_size < self.state.log_offset:
            if self.state.log_offset:
                self.say(f"{self.log} was replaced or truncated; reading it from its start")
            self.state.log_identity, self.state.log_offset = identity, 0
        lines, offset = read_new_lines(self.log, self.state.log_offset)
        steps = []
        for line in lines:
            try:
                logged = parse_logger_line(line)
            except ValueError as exc:
                self.say(f"{self.log}: a line is skipped ({exc})", once=f"bad line {exc}")
                continue
            if logged.skipped:
                names = ", ".join(logged.skipped)
                self.say(f"not numbers, not sent: {names}", once=f"skip {names}")
            steps.append((logged.step, logged.metrics))
            self.state.logged_through = max(self.state.logged_through, logged.step)
        self._pending_offset = offset
        return steps

    def dump_complete(self, step: int, path: Path, steps: dict[int, Path], final: bool) -> bool:
        if final or step <= self.state.logged_through or any(s > step for s in steps):
            return True
        return time.time() - path.stat().st_mtime >= self.options.settle_s

    def send_dumps(self, final: bool) -> None:
        for split, folder in (("train", self.rollout_dir), ("val", self.validation_dir)):
            if folder is None:
                continue
            steps = dump_steps(folder)
            for step in sorted(steps):
                path = steps[step]
                stat = path.stat()
                identity = [stat.st_size, stat.st_mtime_ns]
                sent = self.state.sent[split].get(str(step))
                if sent == identity or not self.dump_complete(step, path, steps, final):
                    continue
                assert self.run is not None
                if sent is not None:  # the dump changed since: its step is sent again whole
                    self.run.delete_samples(step, split)
                count = self.run.samples(dump_samples(path, step, split))
                self.state.sent[split][str(step)] = identity
                self.state.save()
                self.say(f"samples of step {step} ({split}): {count} sent")

    def send_config(self) -> None:
        if self.state.config_sent:
            return
        path = self.options.config or self.find_hydra_config()
        if path is None:
            return
        assert self.run is not None
        config = read_config(path)
        if isinstance(config, str):
            self.run.attach_config(yaml=config)
        else:
            self.run.attach_config(config)
        self.state.config_sent = str(path)
        self.state.save()
        self.say(f"config from {path}")

    def find_hydra_config(self) -> Path | None:
        """Return the ``.hydra/config.yaml`` the watched command's Hydra wrote, if there is one."""
        if not self.options.command:
            return None
        found = [
            p
            for p in Path("outputs").glob("*/*/.hydra/config.yaml")
            if p.stat().st_mtime >= self.started - 1
        ]
        return max(found, key=lambda p: p.stat().st_mtime) if found else None

    def drain(self, final: bool = False) -> None:
        """Send everything the files and the command's output hold now."""
        assert self.run is not None
        self._pending_offset = self.state.log_offset
        steps = self.read_log()
        self.send_dumps(final)
        if steps:
            self.run.steps(steps)
            numbers = sorted({s for s, _ in steps})
            shown = f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])
            self.say(f"metrics of step {shown} sent")
        self.state.log_offset = self._pending_offset
        self.state.save()
        if self.child is not None:
            lines = self.child.take_lines()
            if lines:
                self.run.log_lines(lines)
        self.send_config()

    def beat(self) -> None:
        assert self.run is not None
        if time.monotonic() - self.last_beat < self.options.heartbeat_s:
            return
        self.last_beat = time.monotonic()
        state = self.run.heartbeat()
        if not state["cancel_requested"]:
            return
        if self.child is not None and self.options.allow_cancel:
            if not self.stopping_for_cancel:
                self.say("the studio asks to cancel the run: stopping the command")
                self.stopping_for_cancel = True
                threading.Thread(target=self.child.stop, daemon=True).start()
        else:
            self.say(
                "the studio asks to cancel the run; not stopping it (start the watcher with "
                "--allow-cancel and the command after -- to let the studio stop it)",
                once="cancel",
            )

    def finished(self) -> bool:
        """Return whether every step of a run of known length has been sent."""
        if self.total_steps is None or self.state.logged_through < self.total_steps:
            return False
        return all(
            str(step) in self.state.sent[split]
            for split, folder in (("train", self.rollout_dir), ("val", self.validation_dir))
            if folder is not None
            for step in dump_steps(folder)
        )

    # -- the loop ------------------------------------------------------------------------------
    def watch(self, sleep: Callable[[float], None] = time.sleep) -> int:
        """Watch until the job ends; return the command's exit code (0 without a command)."""
        self.run = self.open_run()
        if self.options.once:
            self.drain(final=True)
            if self.options.end:
                self.run.finish(self.options.end)
                self.say(f"run {self.run.id} finished: {self.options.end}")
            return 0
        if self.options.command:
            self.child = ChildProcess(self.options.command, self.child_env(), self.out)
            self.say(f"started {shlex.join(self.options.command)} (pid {self.child.process.pid})")
        while True:
            exited = self.child is not None and self.child.exited()
            self.drain(final=exited)
            self.beat()
            if exited:
                return self.end_with_command()
            if self.child is None and self.finished():
                self.run.finish("succeeded")
                self.say(f"run {self.run.id} finished: all {self.total_steps} steps sent")
                return 0
            sleep(self.options.interval_s)

    def end_with_command(self) -> int:
        assert self.run is not None and self.child is not None
        code = self.child.process.returncode
        if code == 0:
            status, error = "succeeded", ""
        elif self.stopping_for_cancel or self.interrupted:
            status, error = "cancelled", ""
        else:
            status = "failed"
            error = f"the command exited with {code}; its last lines:\n" + "\n".join(
                self.child.tail
            )
        self.run.finish(status, error)
        self.say(f"run {self.run.id} finished: {status}")
        return code

    def forward(self, number: int, _frame: Any = None) -> None:
        """Pass a signal the watcher gets on to the command's process group."""
        self.interrupted = True
        if self.child is not None:
            self.child.signal(number)
        else:
            raise KeyboardInterrupt


def read_config(path: Path) -> dict[str, Any] | str:
    """Return a config file as a dict (JSON, or YAML resolved by OmegaConf when it is installed),
    else its YAML text for the studio to read."""
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return text
    try:
        return OmegaConf.to_container(OmegaConf.create(text), resolve=True)  # type: ignore[return-value]
    except Exception:  # an interpolation only Hydra's resolvers know: the text as it is
        return text


def _path(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None
