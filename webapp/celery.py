"""The Celery app, configured from Django's ``CELERY_*`` settings; the studio sends tasks with it.

The tasks are the workers' (``workers.tasks``, which a worker imports at start through the
``CELERY_INCLUDE`` setting). The studio sends them by name and imports nothing of the workers,
which stand above it: they run the studio's services and the engine.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("posttrain")
app.config_from_object("django.conf:settings", namespace="CELERY")

# The name ``workers.tasks.start_run`` is registered under.
START_RUN = "workers.tasks.start_run"


def send_start_run(run_id: int) -> None:
    """Queue the start of run ``run_id`` on the broker; kombu's OperationalError when it is down.

    A signature sends by name where the task is not registered (the web process), and runs the
    registered task where it is, so a process that imported the tasks and set Celery's
    ``task_always_eager`` (``bench/web/soak.py``) starts the run in place, as ``delay`` did.
    """
    app.signature(START_RUN, args=(run_id,), options={"ignore_result": True}).apply_async()


# The name ``workers.tasks.deliver_alert`` is registered under.
DELIVER_ALERT = "workers.tasks.deliver_alert"


def send_deliver_alert(delivery_id: int) -> None:
    """Queue the delivery of one alert message (``webapp.alerts.services.delivery_attempt``)."""
    app.signature(DELIVER_ALERT, args=(delivery_id,), options={"ignore_result": True}).apply_async()
