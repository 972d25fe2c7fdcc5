"""Soak: a 2,000-step tiny run keeps the driver's and the web process's memory flat.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.web.soak [--steps 2000] [--viewers 5] [--json PATH]

The whole path is the studio's: ``run_create`` on the ``grpo_tiny`` preset (with the small
settings below) writes the Run row, and its start request runs ``workers.tasks.start_run`` in this
process (Celery's eager mode, so no worker of the machine's broker can take it), which starts the
real driver, ``python -m workers.driver <run_id>``, recording to PostgreSQL and publishing to
Redis. A real Daphne process serves the studio; ``--viewers`` aiohttp clients open the run page
with a logged-in session cookie, then follow the run's WebSocket with the site's Origin, as a
browser tab would, from before the first step to the run's end.

Every ``--interval`` seconds the script reads the resident memory (``VmRSS`` of
``/proc/<pid>/status``) of the driver and of Daphne, with the run's latest recorded step. The
growth rate is the least-squares slope of RSS against the step over the second half of the run
(the first half is warm-up: allocator pools, caches, the checkpoints and validations' first
use), reported in MiB per 1,000 steps beside the RSS at the first step, at the half and at the
end, and the step rate. A table goes to stdout and everything, samples included, to ``--json``.

It exits 1 when the run does not succeed or a viewer misses a step: a run that leaks by failing
measures nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.web.live_common import ROOT, daphne, fresh_channel_layer, scratch_database, setup_django

# Small steps, so that 2,000 of them take a few minutes on two shared cores: 8 prompts x 4
# samples of up to 8 tokens (the preset's 32 x 8 would take ~0.3 s a step), a checkpoint every
# 500 steps (the last two kept) and a validation every 500 (200 held-out prompts each), none
# before the first step. --save-freq and --test-freq change the two frequencies.
SETTINGS = {
    "data.train_batch_size": 8,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.rollout.n": 4,
    "data.max_response_length": 8,
    "trainer.save_freq": 500,
    "trainer.max_actor_ckpt_to_keep": 2,
    "trainer.test_freq": 500,
    "trainer.val_before_train": False,
    "trainer.log_freq": 100,
}
ENDED = ("succeeded", "failed", "cancelled", "lost")


def note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rss_mib(pid: int) -> float | None:
    """Return the resident memory of process ``pid`` in MiB; None once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None  # a zombie has no VmRSS line


def child_pid(name: str) -> int:
    """Return the pid of this process's child whose command line contains ``name``."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and name in cmdline:
            return int(entry.name)
    raise RuntimeError(f"no child process of {me} runs {name!r}")


def slope_per_1000(steps: list[float], values: list[float]) -> float:
    """Return the least-squares slope of ``values`` against ``steps``, per 1,000 steps."""
    n = len(steps)
    if n < 2:
        return float("nan")
    mean_x, mean_y = sum(steps) / n, sum(values) / n
    sxx = sum((x - mean_x) ** 2 for x in steps)
    if sxx == 0:
        return float("nan")
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(steps, values, strict=True))
    return 1000 * sxy / sxx


@dataclass
class Viewer:
    """What one viewer saw: the backlog's last step, every live step, the final status."""

    page_status: int = 0
    backlog_step: int = 0
    steps: list[int] = field(default_factory=list)
    status: str = ""


class Viewers(threading.Thread):
    """``count`` browser-like clients of one run: the run page, then its socket to the run's end."""

    def __init__(self, base_url: str, path: str, ws_path: str, session: str, count: int) -> None:
        super().__init__(name="viewers", daemon=True)
        self.base_url, self.path, self.ws_path, self.session = base_url, path, ws_path, session
        self.viewers = [Viewer() for _ in range(count)]
        self.ready = threading.Event()
        self.connected = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self.watch_all())
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self.ready.set()

    async def watch_all(self) -> None:
        await asyncio.gather(*(self.watch(viewer) for viewer in self.viewers))

    async def watch(self, viewer: Viewer) -> None:
        import aiohttp

        url = self.base_url.replace("http", "ws", 1) + self.ws_path
        async with aiohttp.ClientSession(cookies={"sessionid": self.session}) as client:
            async with client.get(self.base_url + self.path) as page:
                viewer.page_status = page.status
                await page.read()
            async with client.ws_connect(url, origin=self.base_url, max_msg_size=0) as socket:
                async for message in socket:
                    data = message.json()
                    if data["type"] == "backlog" and data["complete"]:
                        viewer.backlog_step = data["last_step"] or 0
                        self.connected += 1
                        if self.connected == len(self.viewers):
                            self.ready.set()
                    elif data["type"] == "metrics":
                        viewer.steps.extend(point["step"] for point in data["points"])
                    elif data["type"] == "status" and data["run"]["status"] in ENDED:
                        viewer.status = data["run"]["status"]
                        return


def soak_config(settings: dict[str, Any]) -> Any:
    """Return the ``grpo_tiny`` preset with ``settings`` (dotted keys) set."""
    from engine.config import set_value
    from webapp.experiments.configs import preset_load

    config = preset_load("grpo_tiny")
    for key, value in settings.items():
        set_value(config, key, value)
    return config


def launch(settings: dict[str, Any]) -> Any:
    """Create a user and an experiment and launch its run as the builder does; return the run."""
    from django.contrib.auth import get_user_model

    from webapp.experiments.services import experiment_create
    from webapp.runs.models import Run
    from webapp.runs.services import run_create
    from workers import tasks  # noqa: F401  (registers start_run here, for the eager send)
    from workers.celery_app import app

    owner = get_user_model().objects.create_user("soak", password="soak-pass")
    experiment = experiment_create(owner=owner, name="soak", config=soak_config(settings))
    app.conf.task_always_eager = True  # start_run here, not on whichever worker reads Redis
    run = run_create(experiment=experiment)
    return Run.objects.get(pk=run.pk)


def sample(driver: int, web: int, run_id: int, interval: float, limit_s: float) -> list[dict]:
    """Sample both processes' RSS and the run's step every ``interval`` s until the run ends."""
    from webapp.runs.models import Run

    samples: list[dict] = []
    started = time.monotonic()
    while True:
        tick = time.monotonic()
        status, step = Run.objects.filter(pk=run_id).values_list("status", "latest_step").get()
        driver_mib, web_mib = rss_mib(driver), rss_mib(web)
        if driver_mib is None or status in ENDED:
            return samples
        if web_mib is None:
            raise RuntimeError("the Daphne process exited during the run")
        at = round(tick - started, 2)
        samples.append({"t": at, "step": step, "driver_mib": driver_mib, "web_mib": web_mib})
        if len(samples) % 30 == 0:
            note(f"step {step}: driver {driver_mib:.1f} MiB, web {web_mib:.1f} MiB")
        if tick - started > limit_s:
            raise RuntimeError(f"the run did not end within --limit {limit_s:.0f} s")
        time.sleep(max(0.0, interval - (time.monotonic() - tick)))


def summarise(samples: list[dict], steps: int) -> dict[str, Any]:
    """Return each process's RSS at the first step, the half and the end, and its slope."""
    stepped = [s for s in samples if s["step"] >= 1]
    half = [s for s in stepped if s["step"] >= steps / 2]
    if len(half) < 5:
        raise RuntimeError(
            f"only {len(half)} samples in the run's second half; lower --interval or raise --steps"
        )
    out: dict[str, Any] = {}
    for process in ("driver", "web"):
        key = f"{process}_mib"
        out[process] = {
            "start_mib": round(stepped[0][key], 1),
            "half_mib": round(half[0][key], 1),
            "end_mib": round(stepped[-1][key], 1),
            "max_mib": round(max(s[key] for s in samples), 1),
            "slope_mib_per_1000_steps": round(
                slope_per_1000([s["step"] for s in half], [s[key] for s in half]), 2
            ),
        }
    return out


def step_rate(run_id: int) -> dict[str, float]:
    """Return steps per second over the whole run and over its second half (recorded times)."""
    from webapp.runs.models import MetricPoint

    times = list(
        MetricPoint.objects.filter(run_id=run_id).order_by("step").values_list("step", "wall_time")
    )
    (first, t0), (last, t1) = times[0], times[-1]
    mid, tm = times[len(times) // 2]
    return {
        "steps_per_s": round((last - first) / (t1 - t0).total_seconds(), 2),
        "second_half_steps_per_s": round((last - mid) / (t1 - tm).total_seconds(), 2),
    }


def check_viewers(viewers: Viewers, steps: int) -> list[str]:
    """Return a sentence for each viewer that missed a step, the page or the end."""
    problems = []
    for i, viewer in enumerate(viewers.viewers):
        expected = list(range(viewer.backlog_step + 1, steps + 1))
        if viewer.page_status != 200:
            problems.append(f"viewer {i}: the run page answered {viewer.page_status}")
        if viewer.steps != expected:
            problems.append(
                f"viewer {i}: got {len(viewer.steps)} live steps after the backlog's "
                f"{viewer.backlog_step}, not steps {viewer.backlog_step + 1}..{steps} in order"
            )
        if viewer.status != "succeeded":
            problems.append(f"viewer {i}: last status {viewer.status or 'none'}, not succeeded")
    return problems


def table(result: dict[str, Any]) -> str:
    rows = [
        "| process | RSS at step 1 (MiB) | at the half | at the end | max | slope, 2nd half "
        "(MiB / 1,000 steps) |",
        "|---|---|---|---|---|---|",
    ]
    for process in ("driver", "web"):
        r = result[process]
        rows.append(
            f"| {process} | {r['start_mib']} | {r['half_mib']} | {r['end_mib']} | "
            f"{r['max_mib']} | {r['slope_mib_per_1000_steps']:+.2f} |"
        )
    rate = result["step_rate"]
    rows.append(
        f"\n{result['steps']} steps, {result['viewers']} viewers, {len(result['samples'])} samples;"
        f" {rate['steps_per_s']} steps/s ({rate['second_half_steps_per_s']} in the second half);"
        f" run {result['run_wall_s']} s"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--viewers", type=int, default=5, help="WebSocket clients of the run")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--limit", type=float, default=1800, help="seconds the run may take")
    parser.add_argument("--save-freq", type=int, default=500, help="trainer.save_freq")
    parser.add_argument("--test-freq", type=int, default=500, help="trainer.test_freq")
    parser.add_argument("--database", default="bench_soak", help="scratch database (dropped after)")
    parser.add_argument(
        "--json",
        type=Path,
        default=ROOT / "bench" / "results" / f"soak_{time.strftime('%Y%m%d_%H%M%S')}.json",
        help="where to write the results and samples",
    )
    args = parser.parse_args(argv)

    from engine.env import data_dir
    from engine.tiny import ensure_tiny_assets

    shared = data_dir()
    ensure_tiny_assets(shared)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        # Run folders of its own (run ids restart at 1 in the scratch database); the tiny
        # model and data from the shared cache.
        (Path(tmp) / "tiny").symlink_to(shared / "tiny", target_is_directory=True)
        os.environ["POSTTRAIN_DATA_DIR"] = tmp
        os.environ.setdefault("POSTTRAIN_LOG_LEVEL", "WARNING")
        setup_django(args.database)
        fresh_channel_layer()
        with scratch_database() as database, daphne(database) as base_url:
            result = soak(args, base_url)
    if result is None:
        return 1
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"results: {args.json}")
    return 0 if not result["problems"] else 1


def soak(args: argparse.Namespace, base_url: str) -> dict[str, Any] | None:
    """Launch the run, watch it with the viewers and sample both processes to its end."""
    from django.db import connection
    from django.test import Client

    from webapp.runs.models import run_dir

    web = child_pid("daphne")
    settings = {
        **SETTINGS,
        "trainer.total_training_steps": args.steps,
        "trainer.save_freq": args.save_freq,
        "trainer.test_freq": args.test_freq,
    }
    note(f"server at {base_url} (pid {web}); launching {args.steps} steps")
    run = launch(settings)
    if not run.driver.startswith("pid:"):
        note(f"the run did not start a local driver: status {run.status}, {run.error}")
        return None
    driver = int(run.driver.removeprefix("pid:"))
    client = Client()
    client.force_login(run.owner)
    viewers = Viewers(
        base_url,
        run.get_absolute_url(),
        f"/ws/runs/{run.pk}/",
        client.cookies["sessionid"].value,
        args.viewers,
    )
    viewers.start()
    if not viewers.ready.wait(60) or viewers.error:
        raise RuntimeError(f"the viewers did not connect: {viewers.error!r}")
    note(f"driver pid {driver}; {args.viewers} viewers connected")
    started = time.monotonic()
    samples = sample(driver, web, run.pk, args.interval, args.limit)
    run_wall = time.monotonic() - started
    viewers.join(60)
    run.refresh_from_db()
    if run.status != "succeeded":
        log = run_dir(run.pk) / "driver.log"
        tail = log.read_text()[-4000:] if log.exists() else "(no driver.log)"
        note(f"the run ended {run.status}: {run.error[-2000:]}\n{tail}")
        return None
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": " ".join(["python -m bench.web.soak", *sys.argv[1:]]),
        "steps": args.steps,
        "viewers": args.viewers,
        "interval_s": args.interval,
        "settings": settings,
        "run_wall_s": round(run_wall, 1),
        "step_rate": step_rate(run.pk),
        **summarise(samples, args.steps),
        "problems": check_viewers(viewers, args.steps),
        "samples": samples,
    }
    connection.close()
    for problem in result["problems"]:
        note(problem)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
