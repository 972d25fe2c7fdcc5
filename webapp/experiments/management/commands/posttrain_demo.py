"""``manage.py posttrain_demo``: the demo user, a demo experiment on the tiny model, and a run.

Idempotent: the user ``demo`` (password ``demo``) and the experiment are created only when
missing. ``--no-launch`` creates without starting a run; ``--wait`` waits for the run to end and
exits non-zero unless it succeeded.
"""

from __future__ import annotations

import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from engine.config import set_value
from webapp.experiments.configs import preset_load
from webapp.experiments.models import Experiment
from webapp.experiments.services import experiment_create
from webapp.runs.models import ACTIVE_STATUSES, Run, RunStatus
from webapp.runs.services import run_create

DEMO_USER = "demo"
DEMO_PASSWORD = "demo"
DEMO_EXPERIMENT = "Demo: GRPO on the tiny model"


class Command(BaseCommand):
    help = "Create the demo user and a demo GRPO experiment on the tiny model, and launch a run."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="Base URL to print.")
        parser.add_argument("--no-launch", action="store_true", help="Do not start a run.")
        parser.add_argument("--steps", type=int, default=20, help="Training steps of the run.")
        parser.add_argument("--wait", action="store_true", help="Wait for the run to end.")
        parser.add_argument("--timeout", type=float, default=1800, help="Seconds --wait waits.")

    def handle(self, *args, **options) -> None:
        user_model = get_user_model()
        user = user_model.objects.filter(username=DEMO_USER).first()
        if user is None:
            user = user_model.objects.create_user(DEMO_USER, password=DEMO_PASSWORD)
            self.stdout.write(f"created user {DEMO_USER} (password {DEMO_PASSWORD})")
        experiment = Experiment.objects.filter(owner=user, name=DEMO_EXPERIMENT).first()
        if experiment is None:
            config = preset_load("grpo_tiny")
            set_value(config, "trainer.total_training_steps", options["steps"])
            set_value(config, "trainer.test_freq", max(1, options["steps"] // 4))
            set_value(config, "trainer.save_freq", max(1, options["steps"] // 2))
            experiment = experiment_create(
                owner=user,
                name=DEMO_EXPERIMENT,
                config=config,
                description="GRPO on the embedded tiny model and its two-digit addition task.",
                tags=["demo", "grpo", "tiny"],
                preset="grpo_tiny",
            )
            self.stdout.write(f"created experiment {experiment.name}")
        base = options["url"].rstrip("/")
        self.stdout.write(f"experiment: {base}{experiment.get_absolute_url()}")
        if options["no_launch"]:
            return
        run = run_create(experiment=experiment)
        self.stdout.write(f"run #{run.pk} queued: {base}{run.get_absolute_url()}")
        self.stdout.write(f"log in at {base}/accounts/login/ as {DEMO_USER} / {DEMO_PASSWORD}")
        if options["wait"]:
            self._wait(run, options["timeout"])

    def _wait(self, run: Run, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.status != seen:
                self.stdout.write(f"run #{run.pk}: {run.status} (step {run.latest_step})")
                seen = run.status
            if run.status not in ACTIVE_STATUSES:
                break
            time.sleep(1.0)
        else:
            raise CommandError(f"run #{run.pk} still {run.status} after {timeout:.0f} s")
        if run.status != RunStatus.SUCCEEDED:
            raise CommandError(f"run #{run.pk} ended {run.status}:\n{run.error}")
