"""The Celery worker's app: the studio's (``webapp.celery``), whose settings name ``workers.tasks``.

Start a worker with ``celery -A workers.celery_app worker`` and the lost-run sweep with
``celery -A workers.celery_app beat``. Stdout is not redirected (``worker_redirect_stdouts =
False`` in the settings): Ray and torch need a real file descriptor there.
"""

from __future__ import annotations

import sys

from celery.signals import worker_process_shutdown

from webapp.celery import app

__all__ = ["app"]


@worker_process_shutdown.connect
def shutdown_ray(**_: object) -> None:
    """Stop this process's Ray client, if it started one, so no Ray helper outlives the worker."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
