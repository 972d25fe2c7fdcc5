"""The run driver: ``python -m workers.driver <run_id>`` trains one run and records it.

Started by ``workers.tasks.start_run`` as a detached local process or a Ray Job. It marks the run
running, rebuilds the engine config from the run's resolved snapshot (checkpoints go to the run's
own folder), and calls ``engine.trainer.run_training`` with a ``RunRecorder``. Besides the beat
after each step, a background thread beats the heartbeat every ~10 s while a long step runs, so
only a driver that died goes stale; during a database outage it keeps trying, as the recorder
does. SIGTERM asks the trainer to stop after the current step, like a cancel. Its stdout and stderr
go to the run's ``driver.log`` (``webapp.runs.logs``), which the run page tails: a local driver's
from its start, a Ray Job's from the moment it reads its run (and still to Ray's job log). The
exit status is 0 when the run's end state (succeeded or cancelled) was recorded, 1 otherwise: a
failed run, or an end state the database never took (the reason is in the log).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("workers.driver")

DB_CONNECT_TIMEOUT_S = 5


def capture_output(path: Path) -> None:
    """Send this process's stdout and stderr (descriptors 1 and 2) to ``path`` too, appending.

    A local driver's descriptors write to ``path`` already, from its start: they are left
    alone. Any other (a Ray Job's, which Ray keeps as the job's log) goes through ``tee -a``, a
    process of its own, so both get every line, a crash's last words included (``tee`` reads
    until the driver's end closes the pipe). Without ``tee`` the output goes to ``path`` only.
    Python's stdout becomes line-buffered, so the run page sees each line as it is printed; the
    processes the driver starts inherit the descriptors.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    target = os.stat(path) if path.exists() else None
    same = []
    for number in (1, 2):
        try:
            current = os.fstat(number)
        except OSError:
            current = None
        same.append(
            target is not None
            and current is not None
            and (current.st_dev, current.st_ino) == (target.st_dev, target.st_ino)
        )
    if all(same):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        return
    sys.stdout.flush()
    sys.stderr.flush()
    tee = shutil.which("tee")
    if tee is not None:
        process = subprocess.Popen(
            [tee, "-a", str(path)], stdin=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert process.stdin is not None
        sink = os.dup(process.stdin.fileno())
        process.stdin.close()  # descriptors 1 and 2 hold the pipe open until the driver ends
    else:
        print(f"the driver's output goes to {path} (no tee on PATH)", flush=True)
        sink = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for number in (1, 2):
        os.dup2(sink, number)
    os.close(sink)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def stop_this_driver() -> None:
    """Kill this driver with ``SIGKILL``: its process group where it leads one (a local driver
    runs in a session of its own), so the processes it started go with it."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class BeatThread(threading.Thread):
    """Call :meth:`beat` every ``interval_s`` seconds until stopped, through database outages.

    A beat that fails is logged once per outage (as ``what`` failed), and the next tries on a
    fresh connection. :meth:`close` runs as the thread ends.
    """

    def __init__(self, name: str, interval_s: float, what: str) -> None:
        super().__init__(name=name, daemon=True)
        self.interval_s = interval_s
        self.what = what
        self.stopped = threading.Event()

    def beat(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the beats opened (the thread's own)."""

    def run(self) -> None:
        from django.db import connection

        failing = False
        try:
            while not self.stopped.wait(self.interval_s):
                try:
                    self.beat()
                    failing = False
                except Exception as exc:
                    if not failing:
                        logger.warning("%s failed: %s", self.what, exc)
                    failing = True
                    connection.close()
        finally:
            self.close()
            connection.close()

    def stop(self) -> None:
        self.stopped.set()


def beat_interval_s() -> float:
    """Return how often a driver or a job beats: a quarter of the sweep's heartbeat timeout,
    between 1 and 10 s."""
    from django.conf import settings

    return max(1.0, min(10.0, settings.POSTTRAIN_HEARTBEAT_TIMEOUT_S / 4))


class HeartbeatThread(BeatThread):
    """Beat a running run's heartbeat every ``interval_s`` seconds until stopped.

    With ``publish`` each beat is also a ``heartbeat`` event (on a publisher of the thread's
    own: a publisher's loop serves one thread), so an open run page shows it during long steps.

    Each beat also looks for a cancel the driver has not heeded within the run's limit
    (``cancel_overdue``: ``stall_after`` seconds, or 10 median steps and at least 600 s). A
    driver hung in a step (a collective that never returns) keeps beating from this thread, and
    the sweep can stop only the drivers on its own host and Ray Jobs; so the thread ends the run
    cancelled, saying why, and calls ``stop`` (:func:`stop_this_driver`).
    """

    def __init__(
        self,
        run_id: int,
        interval_s: float,
        *,
        publish: bool = False,
        stall_after: float | None = None,
        stop: Callable[[], object] = stop_this_driver,
    ) -> None:
        super().__init__(f"heartbeat-{run_id}", interval_s, f"heartbeat of run {run_id}")
        self.run_id = run_id
        self.publish = publish
        self.stall_after = stall_after
        self.stop_driver = stop
        self.publisher: Any = None

    def beat(self) -> None:
        from webapp.runs.driver_writes import run_heartbeat
        from webapp.runs.events import run_event

        running = run_heartbeat(run_id=self.run_id)
        self.stop_if_cancel_unheeded()  # before publishing, which a Redis outage may stop
        if running and self.publish:
            if self.publisher is None:
                from channels.layers import channel_layers

                from workers.publish import RunEventPublisher

                # A layer of its own: closing it must not close the recorder's pools.
                self.publisher = RunEventPublisher(channel_layers.make_backend("default"))
            self.publisher.publish(run_event(self.run_id, "heartbeat"))

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()

    def stop_if_cancel_unheeded(self) -> None:
        """End the run cancelled and stop this driver when its cancel is overdue."""
        from webapp.runs.driver_writes import run_cancel_overdue, run_end_unheeded_cancel

        overdue = run_cancel_overdue(run_id=self.run_id, stall_after=self.stall_after)
        if overdue is None:
            return
        waited, limit = overdue
        logger.error(
            "run %s: the cancel went unheeded for %.0f s (the limit is %.0f s); the driver "
            "stops itself",
            self.run_id,
            waited,
            limit,
        )
        how = "it stopped itself (SIGKILL to its process group)"
        run_end_unheeded_cancel(run_id=self.run_id, waited=waited, limit=limit, how=how)
        sys.stdout.flush()
        sys.stderr.flush()
        self.stop_driver()


def expand_home(config: Any) -> None:
    """Resolve ``config`` and expand ``~`` in its path and code values, in place, against ``HOME``.

    The studio checked them so (``webapp.experiments.configs``); inside ``tracker_environment`` the
    run has a home of its own, where ``~`` would name another folder than the one checked.
    """
    from engine.config import get_value, resolve_config, set_value
    from webapp.experiments.configs import resource_keys

    resolve_config(config)  # references first: a path taken from another key is expanded too
    for key in (*resource_keys("path"), *resource_keys("code")):
        value = get_value(config, key)
        if isinstance(value, str):
            set_value(config, key, os.path.expanduser(value))
        elif isinstance(value, list):
            set_value(config, key, [os.path.expanduser(v) for v in value])


def drive(run_id: int, publish: bool = True) -> str:
    """Train run ``run_id`` to its end; return its final status (or ``skipped``)."""
    from django.conf import settings

    from engine.config import config_from_dict, set_value
    from engine.trainer import run_training
    from engine.trainer.trackers import tracker_environment
    from webapp.runs.driver_writes import run_mark_running
    from webapp.runs.models import Run, run_dir
    from workers.database_recorder import RecordingGaveUp, RunRecorder
    from workers.publish import RunEventPublisher

    run = run_mark_running(run_id=run_id)
    if run is None:
        logger.info("run %s is not starting; nothing to do", run_id)
        return "skipped"
    publisher = RunEventPublisher() if publish else None
    recorder = RunRecorder(run_id, publisher)
    heartbeat = HeartbeatThread(
        run_id, beat_interval_s(), publish=publish, stall_after=settings.POSTTRAIN_STALL_AFTER_S
    )
    heartbeat.start()

    def request_stop(signum: int, frame: object) -> None:
        recorder.stop_requested = True

    previous = signal.signal(signal.SIGTERM, request_stop)
    try:
        if run.cancel_requested:
            recorder.on_finish(status="cancelled")
            return "cancelled"
        config = config_from_dict(run.config)
        set_value(config, "trainer.default_local_dir", run.checkpoint_dir)
        expand_home(config)
        # Trackers write into the run's own folder (their HOME too), never where an experiment
        # could point them.
        with tracker_environment(run_dir(run_id) / "trackers"):
            status = run_training(config, recorder)
        recorder.on_finish(status=status)
        # The status the run ended with: a run the studio stopped (its rewards kept failing)
        # stops as a cancel does, and ends failed.
        return Run.objects.filter(pk=run_id).values_list("status", flat=True).first() or status
    except RecordingGaveUp as exc:
        logger.error("%s", exc)
        return "unrecorded"
    except BaseException:
        # run_training reports its own failures; this covers the ones before it starts.
        logger.exception("run %s failed", run_id)
        try:
            recorder.on_finish(status="failed", error=traceback.format_exc())
        except RecordingGaveUp as exc:
            logger.error("%s", exc)
        return "failed"
    finally:
        signal.signal(signal.SIGTERM, previous)
        heartbeat.stop()
        heartbeat.join(timeout=10)
        if publisher is not None:
            publisher.close()


def setup_studio_process() -> None:
    """Set up a process the studio started (a driver, a checkpoint job): the engine's CPU thread
    settings before torch loads, then Django with the studio's settings."""
    from engine.env import apply_cpu_process_env

    apply_cpu_process_env()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()


def main(argv: list[str] | None = None) -> int:
    """Set up the process (threads, Django) and drive the run named on the command line."""
    parser = argparse.ArgumentParser(prog="python -m workers.driver", description=__doc__)
    parser.add_argument("run_id", type=int, help="primary key of a run in the starting state")
    args = parser.parse_args(argv)
    setup_studio_process()
    from django.db import connections

    # An unreachable (not refusing) server must not hold a step for minutes on each try.
    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    options.setdefault("connect_timeout", DB_CONNECT_TIMEOUT_S)
    from webapp.runs.logs import run_log_path
    from webapp.runs.models import Run

    run = Run.objects.filter(pk=args.run_id).only("checkpoint_dir").first()
    log = run_log_path(run) if run is not None else None
    if log is not None:
        capture_output(log)
    status = drive(args.run_id)
    print(f"run {args.run_id}: {status}", flush=True)
    return 0 if status in ("succeeded", "cancelled", "skipped") else 1


if __name__ == "__main__":
    sys.exit(main())
