"""The Celery app: configured from Django's ``CELERY_*`` settings, tasks in ``workers.tasks``.

Start a worker with ``celery -A workers.celery_app worker`` and the lost-run sweep with
``celery -A workers.celery_app beat``. Stdout is not redirected (``worker_redirect_stdouts =
False`` in the settings): Ray and torch need a real file descriptor there.
"""

from __future__ import annotations

import os
import sys

from celery import Celery
from celery.signals import worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("posttrain", include=["workers.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")


@worker_process_shutdown.connect
def shutdown_ray(**_: object) -> None:
    """Stop this process's Ray client, if it started one, so no Ray helper outlives the worker."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
