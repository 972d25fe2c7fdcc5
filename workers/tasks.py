"""Celery tasks: start a run's driver, and sweep runs whose driver stopped beating.

``start_run`` takes a run id, claims the run (queued -> starting, so a second delivery of the
same message does nothing), starts the driver process and returns at once: training never lives
inside a Celery message, which a Redis broker would redeliver after its visibility timeout. The
driver is a local detached subprocess, or a Ray Job when ``RAY_ADDRESS`` names a cluster (the
Ray dashboard address, e.g. ``http://ray-head:8265``).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import traceback
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import connections

from engine.env import CPU_PROCESS_ENV
from engine.trainer.trackers import TRACKER_ENV_PREFIXES
from webapp.alerts.services import deliveries_overdue, delivery_attempt
from webapp.celery import DELIVER_ALERT, START_RUN, send_deliver_alert
from webapp.runs.driver_writes import (
    driver_process_alive,
    driver_slots_taken,
    local_driver_pid,
    queued_run_ids,
    ray_job_id,
    run_claim_for_start,
    run_finish,
    run_set_driver,
    runs_mark_lost,
    runs_mark_stalled,
    runs_stop_unheeded_cancels,
)
from webapp.runs.models import RAY_DRIVER_PREFIX, run_dir
from webapp.sweeps.services import sweeps_advance
from workers.celery_app import app
from workers.ray_jobs import RayJobServer

logger = logging.getLogger(__name__)


def database_url() -> str:
    """Return a ``postgresql://`` URL for the database this process uses (the test one in tests)."""
    db = connections["default"].settings_dict
    auth = quote(db["USER"] or "postgres", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or "5432"
    return f"postgresql://{auth}@{host}:{port}/{quote(db['NAME'], safe='')}"


# What a local driver keeps of the worker's environment: system basics, the studio's and Ray's
# settings, thread counts, the GPU runtime's variables, the model caches and the keys and hosts of
# the trackers trainer.logger names. Anything else (cloud keys, tokens, the web app's secret key)
# stays with the worker.
DRIVER_ENV_NAMES = frozenset(
    {
        "PATH", "HOME", "LANG", "TZ", "TMPDIR",
        "DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "DJANGO_DEBUG",
        "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM",
        "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
        "PYTHONPATH", "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",  # where a GPU host keeps its CUDA libraries
    }
)  # fmt: skip
DRIVER_ENV_PREFIXES = ("LC_", "POSTTRAIN_", "RAY_", "CUDA_", "NVIDIA_", *TRACKER_ENV_PREFIXES)


def driver_settings_env() -> dict[str, str]:
    """Return the variables a driver needs set: settings, database, Redis, data, threads.

    The driver loads the studio's settings but signs nothing (no sessions, no links), so it gets
    a fresh random ``DJANGO_SECRET_KEY`` of its own instead of the web app's: the real key never
    reaches a driver, a Ray Job's recorded environment or the code a run executes.
    """
    env = {
        **CPU_PROCESS_ENV,
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "POSTTRAIN_DATA_DIR": str(settings.POSTTRAIN_DATA_DIR),
        # The driver beats at a quarter of the sweep's timeout; a Ray node must not guess it.
        "POSTTRAIN_HEARTBEAT_TIMEOUT_S": str(settings.POSTTRAIN_HEARTBEAT_TIMEOUT_S),
        # A tools YAML's module.ClassName names a tool in the installed modules folder, the
        # one reward modules come from (engine.tools.loader), and nothing else.
        "POSTTRAIN_TOOL_MODULES_DIR": str(settings.POSTTRAIN_REWARD_MODULES_DIR),
    }
    # A thread count the operator set for the worker carries over to the driver.
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[key] = os.environ.get(key) or env[key]
    # Its events go where the web processes listen, and its reward services are the ones the
    # studio checked the config against, on a Ray node too.
    for key in ("POSTTRAIN_CHANNEL_PREFIX", "POSTTRAIN_REWARD_ENDPOINTS"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    # A driver that does not heed a cancel stops itself by the sweep's limit (HeartbeatThread).
    if settings.POSTTRAIN_STALL_AFTER_S is not None:
        env["POSTTRAIN_STALL_AFTER_S"] = str(settings.POSTTRAIN_STALL_AFTER_S)
    # The alerts it queues (a metric threshold, a health check) link to the studio's address.
    if settings.POSTTRAIN_PUBLIC_URL:
        env["POSTTRAIN_PUBLIC_URL"] = settings.POSTTRAIN_PUBLIC_URL
    return env


def driver_env() -> dict[str, str]:
    """Return a local driver's whole environment: the worker's allowed variables, then
    :func:`driver_settings_env` (``DRIVER_ENV_NAMES`` and ``DRIVER_ENV_PREFIXES`` say which)."""
    kept = {
        key: value
        for key, value in os.environ.items()
        if key in DRIVER_ENV_NAMES or key.startswith(DRIVER_ENV_PREFIXES)
    }
    return {**kept, **driver_settings_env()}


def _spawn_module(module: str, object_id: int, log_path: Path, reaper: str) -> str:
    """Start ``python -m <module> <object_id>`` in its own session with a driver's environment,
    its output appended to ``log_path``; return ``pid:<n>``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, str(object_id)],
            cwd=settings.BASE_DIR,
            env=driver_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # Reap the child when it exits so a long-lived worker collects no zombies.
    threading.Thread(target=process.wait, name=reaper, daemon=True).start()
    return f"pid:{process.pid}"


def spawn_local_driver(run_id: int) -> str:
    """Start ``python -m workers.driver <run_id>`` in its own session; return ``pid:<n>``."""
    log_path = run_dir(run_id) / "driver.log"
    return _spawn_module("workers.driver", run_id, log_path, f"reap-driver-{run_id}")


def submit_ray_job(run_id: int, address: str) -> str:
    """Submit the driver as a Ray Job on the cluster at ``address``; return ``ray:<job id>``.

    The submission id is fixed per run, so Ray itself refuses a second submission. The entrypoint
    runs the ``python`` on the head node's PATH in the folder ``ray start`` ran in: start the head
    from the studio's folder with its environment activated, as the image does (``/app``);
    elsewhere the job fails at import and the next sweep marks the run lost with the job's log
    (``workers.ray_jobs``).
    """
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    job_id = client.submit_job(
        entrypoint=f"python -m workers.driver {run_id}",
        submission_id=f"posttrain-run-{run_id}",
        # The job starts from the Ray node's own environment (its PATH, its GPUs): set only what
        # the driver needs on top, not the worker's variables.
        runtime_env={"env_vars": driver_settings_env()},
    )
    return f"{RAY_DRIVER_PREFIX}{job_id}"


def stop_driver(run: Any, jobs: RayJobServer) -> str | None:
    """Stop the run's driver where it runs; return how, or None where this process cannot.

    A driver process on this host is killed with its session (``SIGKILL``: it already ignored
    the cancel, and ``SIGTERM`` only asks it again); a Ray Job is stopped through ``jobs``. A
    driver process on another host, or a job server that does not answer, is left (None).
    """
    pid = local_driver_pid(run)
    if pid is not None:
        if not driver_process_alive(pid, run.pk):
            return "its process had already exited"
        try:
            os.killpg(pid, signal.SIGKILL)  # its own session: start_new_session=True
        except ProcessLookupError:
            return "its process had already exited"
        return f"SIGKILL to its process group {pid}"
    job = ray_job_id(run)
    if job is not None and jobs.stop(job):
        return f"ray job stop {job}"
    logger.info("run %s: its driver %r cannot be stopped from here", run.pk, run.driver)
    return None


@app.task(name=START_RUN, ignore_result=True)
def start_run(run_id: int) -> str:
    """Start the driver of a queued run; do nothing for a run another delivery already started.

    While ``POSTTRAIN_MAX_RUNNING_RUNS`` runs have a driver, or its sweep is at its concurrency,
    the run stays queued, and :func:`dispatch_queued_runs` starts it when a slot frees.
    """
    run = run_claim_for_start(run_id=run_id, max_running=settings.POSTTRAIN_MAX_RUNNING_RUNS)
    if run is None:
        logger.info("run %s is not queued, or no slot is free for it; not started", run_id)
        return "skipped"
    try:
        address = settings.RAY_ADDRESS
        driver = submit_ray_job(run_id, address) if address else spawn_local_driver(run_id)
    except Exception:
        run_finish(
            run_id=run_id,
            status="failed",
            error="the driver could not be started:\n" + traceback.format_exc(),
        )
        raise
    run_set_driver(run_id=run_id, driver=driver)
    logger.info("run %s started: %s", run_id, driver)
    return driver


@app.task(name=DELIVER_ALERT, bind=True, ignore_result=True, max_retries=None)
def deliver_alert(self: Any, delivery_id: int) -> str:
    """Send one alert message; retry after the wait the delivery's record asks for.

    The attempts and their limit are counted on the record (``delivery_attempt``), so a
    redelivered message neither sends twice nor retries past ``POSTTRAIN_ALERTS_MAX_ATTEMPTS``.
    """
    attempt = delivery_attempt(delivery_id=delivery_id)
    if attempt.outcome == "retry":
        raise self.retry(countdown=attempt.wait_s)
    return attempt.outcome


@app.task(name="workers.tasks.resend_overdue_alerts", ignore_result=True)
def resend_overdue_alerts() -> list[int]:
    """Queue again the pending alert messages whose task was lost; return their ids."""
    ids = deliveries_overdue()
    for delivery_id in ids:
        send_deliver_alert(delivery_id)
    return ids


@app.task(name="workers.tasks.dispatch_queued_runs", ignore_result=True)
def dispatch_queued_runs() -> list[int]:
    """Start queued runs, oldest first, while driver slots are free; return the ids started.

    This is how a run waits its turn on a full server, and how a run whose start message the
    broker lost (a Redis restart between the launch and the worker) still starts. A run whose
    message arrives later is already started, so that delivery does nothing.
    """
    sweeps_advance()  # a tpe sweep's next members, into the slots its ended members freed
    started = []
    for run_id in queued_run_ids():
        try:
            outcome = start_run(run_id)
        except Exception:
            logger.exception("run %s could not be started by the sweep", run_id)
            continue
        if outcome == "skipped":
            if driver_slots_full():
                break
            continue
        started.append(run_id)
    return started


def driver_slots_full() -> bool:
    """Return whether ``POSTTRAIN_MAX_RUNNING_RUNS`` runs have a driver (never, when it is 0)."""
    limit = settings.POSTTRAIN_MAX_RUNNING_RUNS
    return limit > 0 and driver_slots_taken() >= limit


@app.task(name="workers.tasks.mark_lost_runs", ignore_result=True)
def mark_lost_runs() -> list[int]:
    """Mark runs whose driver is gone as lost, flag live ones that stopped stepping; return lost.

    First the drivers that have not heeded a cancel for the run's stall time are stopped
    (:func:`stop_driver`) and their runs end cancelled. Gone: a driver process on this host that
    exited, a Ray Job that Ray says ended (``RayJobServer.job_end``), or a heartbeat older than
    ``POSTTRAIN_HEARTBEAT_TIMEOUT_S``. Stalled: no step for ``POSTTRAIN_STALL_AFTER_S`` (None: 10
    times the run's median step time, at least 600 s).
    """
    stall_after = settings.POSTTRAIN_STALL_AFTER_S
    jobs = RayJobServer(settings.RAY_ADDRESS)  # this sweep's: a silent server is asked once
    stop = partial(stop_driver, jobs=jobs)
    runs_stop_unheeded_cancels(stall_after=stall_after, stop_driver=stop)
    lost = runs_mark_lost(
        timeout_s=settings.POSTTRAIN_HEARTBEAT_TIMEOUT_S, ray_job_end=jobs.job_end
    )
    runs_mark_stalled(stall_after=stall_after)
    return lost


def spawn_checkpoint_job(job: Any) -> str:
    """Start ``python -m workers.checkpoint_job <id>`` in its own session; return ``pid:<n>``.

    It runs where a local driver would, with a driver's environment; its output goes to the
    job's log in the run's folder (``webapp.runs.checkpoints.job_log_path``).
    """
    from webapp.runs.checkpoints import job_log_path

    return _spawn_module("workers.checkpoint_job", job.pk, job_log_path(job), f"reap-job-{job.pk}")


@app.task(name="workers.tasks.dispatch_checkpoint_jobs", ignore_result=True)
def dispatch_checkpoint_jobs() -> list[int]:
    """Fail checkpoint jobs whose process died (on this host) or fell silent for
    ``POSTTRAIN_HEARTBEAT_TIMEOUT_S`` (anywhere); start queued ones, oldest first, while fewer
    than ``POSTTRAIN_MAX_CHECKPOINT_JOBS`` run; return the ids started.

    A job (export or evaluate one of a run's checkpoints, ``webapp.runs.checkpoints``) runs in a
    process of its own, never in this task or the web process.
    """
    from webapp.runs.checkpoints import (
        checkpoint_job_claim,
        checkpoint_job_finish,
        checkpoint_job_set_worker,
        checkpoint_jobs_mark_lost,
        checkpoint_jobs_queued,
    )

    checkpoint_jobs_mark_lost(timeout_s=settings.POSTTRAIN_HEARTBEAT_TIMEOUT_S)
    started = []
    for job_id in checkpoint_jobs_queued():
        job = checkpoint_job_claim(
            job_id=job_id, max_running=settings.POSTTRAIN_MAX_CHECKPOINT_JOBS
        )
        if job is None:
            break
        try:
            worker = spawn_checkpoint_job(job)
        except Exception:
            checkpoint_job_finish(
                job_id=job_id,
                status="failed",
                error="the job's process could not be started:\n" + traceback.format_exc(),
            )
            logger.exception("checkpoint job %s could not be started", job_id)
            continue
        checkpoint_job_set_worker(job_id=job_id, worker=worker)
        started.append(job_id)
    return started
