"""Shared by the live-chart benchmarks: a scratch database, a Daphne server and Debian's Chromium.

Call ``setup_django(database)`` before importing anything from Django. The benchmarks use Redis
database 7 for their channel layer so their ``run.<id>`` groups never meet a deployment's.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/7"
# Debian's Chromium and its launch flags (no sandbox in a container, no GPU, nothing fetched in
# the background), for these benchmarks and the real-browser tests (tests/e2e/browser.py).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def setup_django(database: str) -> None:
    """Point Django at a scratch database named ``database`` and set it up."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    # DEBUG off, as deployed (Daphne below too), needs a secret key: a throwaway one.
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["POSTTRAIN_TEST_DATABASE"] = database
    os.environ["REDIS_URL"] = REDIS_URL
    # The ORM is called between Playwright's (sync) calls, in the thread that owns its loop.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    import django

    django.setup()


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    """Create the scratch database (migrated like a test database); drop it afterwards."""
    from django.db import connection

    old_name = connection.settings_dict["NAME"]
    name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        yield name
    finally:
        connection.close()
        with connection._nodb_cursor() as cursor:  # end sessions a stopped server left behind
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                [name],
            )
        connection.creation.destroy_test_db(old_name, verbosity=0)


def fresh_channel_layer() -> None:
    """Empty the benchmarks' Redis database: run ids restart at 1 in every scratch database."""
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def daphne(database: str) -> Iterator[str]:
    """Run the studio's ASGI app under Daphne on a free port; yield its base URL."""
    port = _free_port()
    env = dict(
        os.environ,
        DATABASE_URL=f"postgresql://postgres@127.0.0.1:5432/{database}",
        REDIS_URL=REDIS_URL,
        DJANGO_DEBUG="0",
        POSTTRAIN_LOG_LEVEL="WARNING",
        OMP_NUM_THREADS="1",
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    # A viewer's socket still open at the end is cancelled within 2 s, not daphne's default 10 s
    # (the bound the shutdown below waits for).
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    command += ["--application-close-timeout", "2"]
    server = subprocess.Popen(
        [*command, "webapp.asgi:application"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/accounts/login/", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("daphne did not start; see its output above") from None
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            # The measurement is taken; a server that will not stop is killed, not reported.
            server.kill()
            server.wait(10)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Launch Debian's Chromium through Playwright (never a downloaded browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def logged_in_context(browser: Any, base_url: str, user: Any) -> Any:
    """Return a browser context that carries ``user``'s session cookie."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    cookie = {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base_url}
    context.add_cookies([cookie])
    return context


def bench_run(total_steps: int) -> Any:
    """Create a user, an experiment and a running run (no task queued)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from webapp.experiments.configs import preset_load
    from webapp.experiments.services import experiment_create
    from webapp.runs.models import Run, RunStatus

    owner = get_user_model().objects.create_user("bench", password="bench-pass")
    experiment = experiment_create(owner=owner, name="bench", config=preset_load("grpo_tiny"))
    now = timezone.now()
    return Run.objects.create(
        experiment=experiment,
        owner=owner,
        number=1,
        status=RunStatus.RUNNING,
        config={},
        started_at=now,
        heartbeat_at=now,
        total_steps=total_steps,
    )


def verl_metrics(step: int) -> dict[str, float]:
    """Return the 45-odd metrics a verl GRPO step records, varying smoothly with the step."""
    x = step / 1000.0
    wave = math.sin(step / 37.0)
    metrics = {}
    for family, base in (("score", 0.2 + 0.6 * (1 - math.exp(-x))), ("rewards", 0.1 + 0.5 * x)):
        metrics |= {
            f"critic/{family}/mean": base + 0.05 * wave,
            f"critic/{family}/max": base + 0.4,
            f"critic/{family}/min": base - 0.4 + 0.01 * wave,
        }
    for family in ("advantages", "returns"):
        metrics |= {
            f"critic/{family}/{s}": v * (1 + 0.1 * wave)
            for s, v in (("mean", 0.0), ("max", 1.5), ("min", -1.5))
        }
    metrics |= {
        "actor/pg_loss": -0.01 * wave,
        "actor/kl_loss": 0.001 * x + 0.0005 * abs(wave),
        "actor/kl_coef": 0.001,
        "actor/ppo_kl": 0.0002 * abs(wave),
        "actor/entropy": 2.0 - 0.5 * x,
        "actor/pg_clipfrac": 0.02 + 0.01 * wave,
        "actor/pg_clipfrac_lower": 0.001,
        "actor/grad_norm": 0.8 + 0.3 * wave,
        "actor/lr": 1e-6,
        "response_length/mean": 120 + 20 * wave,
        "response_length/max": 256.0,
        "response_length/min": 12.0,
        "response_length/clip_ratio": 0.01,
        "prompt_length/mean": 80.0,
        "prompt_length/max": 120.0,
        "prompt_length/min": 40.0,
        "perf/throughput": 1500 + 100 * wave,
        "perf/total_num_tokens": 40_000.0,
        "perf/time_per_step": 26.0,
    }
    for stage, seconds in (
        ("gen", 14.0),
        ("old_log_prob", 2.0),
        ("ref", 2.0),
        ("adv", 0.1),
        ("update_actor", 7.0),
        ("update_weights", 0.8),
        ("step", 26.0),
    ):
        metrics[f"timing_s/{stage}"] = seconds * (1 + 0.05 * wave)
        metrics[f"timing_per_token_ms/{stage}"] = 1000 * seconds / 40_000
    if step % 50 == 0:
        metrics["val-core/gsm8k/reward/mean@1"] = 0.3 + 0.4 * (1 - math.exp(-x))
    return metrics


def percentile(values: list[float], q: float) -> float:
    """Return the ``q``-th percentile (0-100) by linear interpolation."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median_ms(function: Any, repeats: int = 3) -> float:
    """Return the median wall time of ``repeats`` calls of ``function``, in milliseconds."""
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        function()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1000
