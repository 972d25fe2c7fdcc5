"""Chart load time of a seed group: 10 runs of 2,000 steps drawn as one band, in Debian's Chromium.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.web.group_chart [--runs 10] [--steps 2000]
        [--repeats 5] [--database bench_group_chart]

It creates a scratch database (``--database``, migrated like a test database and dropped
afterwards) holding ``--runs`` finished runs of one config that differ only by ``trainer.seed``,
each with ``--steps`` steps of verl's 45-odd GRPO metrics (``live_common.verl_metrics``, shifted
per seed so the band has a width), starts Daphne on the studio's ASGI app, and opens, each
``--repeats`` times in a fresh browser context (empty cache):

- ``group``: the compare page of the group (``?group=<token>``): one band per series;
- ``runs``: the compare page of the first 8 of those runs as separate lines (the most compare
  overlays), the nearest thing the studio drew before groups.

For each load it reads, from navigation start: ``first_chart`` (the score panel drawn with data)
and ``on_screen`` (every panel in the viewport drawn with every series). In-process it times the
band query (``bands.group_metric_series``) for the score series and for all series, against
reading the same runs one by one (``metrics.run_metric_series``), and sizes the JSON each sends.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.web.live_common import (
    chromium,
    daphne,
    fresh_channel_layer,
    logged_in_context,
    median_ms,
    scratch_database,
    setup_django,
    verl_metrics,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--database", default="bench_group_chart")
    return parser.parse_args()


# Every panel in the viewport drawn, holding a trace of every source it has data for.
ON_SCREEN = """(sources) => {
  const grid = window.postTrainCharts;
  if (!grid || grid.panels.size < 10) return false;
  const shown = [...grid.panels.values()].filter((p) => p.visible);
  return shown.length > 0 && shown.every((p) => !p.dirty && p.plot.data
    && new Set(p.plot.data.map((t) => t.legendgroup.split(":").slice(0, -1).join(":"))).size >= sources);
}"""

READ = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const first = performance.getEntriesByName("posttrain:first-chart")[0];
  const grid = window.postTrainCharts;
  const score = grid.panels.get("score");
  return {
    html: nav.responseEnd,
    scripts: nav.domContentLoadedEventEnd,
    first_chart: first ? first.startTime : null,
    on_screen: performance.now(),
    panels: grid.panels.size,
    score_traces: score.plot.data.length,
    score_points: Math.max(...score.plot.data.map((t) => t.x.length)),
  };
}"""


def record_runs(runs: int, steps: int) -> list[Any]:
    """Create ``runs`` finished runs differing only by ``trainer.seed``, ``steps`` steps each."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from webapp.experiments.configs import preset_load
    from webapp.experiments.services import experiment_create
    from webapp.runs.models import MetricPoint, Run, RunStatus

    owner = get_user_model().objects.create_user("bench", password="bench-pass")
    experiment = experiment_create(owner=owner, name="bench", config=preset_load("grpo_tiny"))
    end = timezone.now()
    start = end - timedelta(seconds=26 * steps)
    created = []
    for seed in range(1, runs + 1):
        config = experiment.config | {"trainer": experiment.config["trainer"] | {"seed": seed}}
        run = Run.objects.create(
            experiment=experiment,
            owner=owner,
            number=seed,
            status=RunStatus.SUCCEEDED,
            config=config,
            started_at=start,
            finished_at=end,
            total_steps=steps,
            latest_step=steps,
        )
        shift = 0.02 * (seed - runs / 2)
        batch = []
        for step in range(1, steps + 1):
            metrics = {k: v + shift for k, v in verl_metrics(step).items()}
            wall_time = start + timedelta(seconds=26 * step + seed)
            batch.append(MetricPoint(run=run, step=step, wall_time=wall_time, metrics=metrics))
        MetricPoint.objects.bulk_create(batch, batch_size=2000)
        created.append(run)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_metricpoint")
    return created


def kb(value: Any) -> float:
    return round(len(json.dumps(value)) / 1024, 1)


def server_side(runs: list[Any]) -> dict[str, Any]:
    """Time the band queries against reading each run's series, and size what each sends."""
    from webapp.runs.bands import group_metric_series
    from webapp.runs.metrics import HEADLINE_METRICS, run_metric_series

    ids = [run.pk for run in runs]
    band_score = group_metric_series(run_ids=ids, names=HEADLINE_METRICS)
    band_all = group_metric_series(run_ids=ids)
    each_all = [run_metric_series(run_id=pk) for pk in ids]
    return {
        "band_score_query_ms": round(
            median_ms(lambda: group_metric_series(run_ids=ids, names=HEADLINE_METRICS)), 1
        ),
        "band_all_query_ms": round(median_ms(lambda: group_metric_series(run_ids=ids)), 1),
        "runs_one_by_one_all_query_ms": round(
            median_ms(lambda: [run_metric_series(run_id=pk) for pk in ids]), 1
        ),
        "band_series": len(band_all["series"]),
        "band_max_points_per_series": max(len(s["step"]) for s in band_all["series"].values()),
        "band_score_kb": kb(band_score["series"]),
        "band_all_kb": kb(band_all["series"]),
        "runs_one_by_one_all_kb": round(sum(kb(r["series"]) for r in each_all), 1),
    }


def load(browser: Any, base_url: str, owner: Any, url: str, sources: int) -> dict[str, Any]:
    context = logged_in_context(browser, base_url, owner)
    page = context.new_page()
    page.goto(f"{base_url}{url}")
    page.wait_for_function(ON_SCREEN, arg=sources, timeout=120_000, polling="raf")
    result = page.evaluate(READ)
    context.close()
    return result


def main() -> int:
    args = parse_args()
    setup_django(args.database)
    from django.urls import reverse

    from webapp.runs.groups import run_groups_for_user

    fresh_channel_layer()
    with (
        scratch_database() as database,
        daphne(database) as base_url,
        chromium() as browser,
    ):
        begin = time.perf_counter()
        runs = record_runs(args.runs, args.steps)
        inserted_s = round(time.perf_counter() - begin, 1)
        owner = runs[0].owner
        [group] = run_groups_for_user(user=owner)
        assert len(group.runs) == args.runs, group.label
        server = server_side(runs)
        compare = reverse("runs:compare")
        pages = {
            "group": (f"{compare}?group={group.token}", 1),
            "runs": (f"{compare}?" + "&".join(f"run={r.pk}" for r in runs[:8]), min(8, args.runs)),
        }
        for url, sources in pages.values():  # warm the server's first request, unmeasured
            load(browser, base_url, owner, url, sources)
        loads: dict[str, list[dict[str, Any]]] = {name: [] for name in pages}
        for _ in range(args.repeats):  # alternate, so load drifts hit both alike
            for name, (url, sources) in pages.items():
                loads[name].append(load(browser, base_url, owner, url, sources))

    def median(name: str, key: str) -> float:
        return round(statistics.median(load[key] for load in loads[name]), 1)

    keys = ("html", "scripts", "first_chart", "on_screen")
    browser_ms = {name: {key: median(name, key) for key in keys} for name in pages}
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "runs": args.runs,
        "steps": args.steps,
        "metrics_per_step": len(verl_metrics(1)),
        "insert_s": inserted_s,
        "server": server,
        "browser_median_ms": browser_ms,
        "group_over_runs": {
            key: round(browser_ms["group"][key] / browser_ms["runs"][key], 2) for key in keys
        },
        "loads": loads,
    }
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
