"""A real Celery worker of the studio for the tests, in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from workers.tasks import database_url


def start_celery_worker(queue: str, log_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a solo worker (this interpreter's ``celery``) on ``queue`` against the test
    database, ``env`` added to this environment, logging to ``log_dir/worker.log``; the caller
    stops it."""
    command = [
        str(Path(sys.executable).with_name("celery")),
        "-A", "workers.celery_app", "worker", "--pool=solo", "--concurrency=1",
        "-Q", queue, "-n", f"{queue}@%h", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "--loglevel=INFO",
    ]  # fmt: skip
    env = {**os.environ, "DATABASE_URL": database_url(), "OMP_NUM_THREADS": "1", **env}
    log = open(log_dir / "worker.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(command, cwd=settings.BASE_DIR, env=env, stdout=log, stderr=log)
