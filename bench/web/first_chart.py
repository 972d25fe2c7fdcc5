"""Time to first chart on the run page of a 20,000-step run, in Debian's Chromium.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.web.first_chart [--steps 20000] [--repeats 5]

It creates a scratch database (``bench_first_chart``) holding one running run with ``--steps``
recorded steps of verl's 45-odd GRPO metrics (``live_common.verl_metrics``, a validation score
every 50 steps), starts Daphne on the studio's ASGI app and opens the run page
``--repeats`` times, each in a fresh browser context (empty HTTP cache, so Plotly's 4.8 MB bundle
is fetched and parsed every time). For each load it reads, from navigation start:

- ``html``: the page's HTML received; ``scripts``: DOMContentLoaded (Plotly and the charts parsed)
- ``first_chart``: the first panel drawn with data (the score panel, from the socket's first
  backlog message, which holds only the score series)
- ``on_screen``: every panel in the viewport drawn (after the second backlog message)

Beside the browser numbers it times the two backlog queries in-process and reports the size of
the backlog as sent (about 1,500 points per series) against the whole run's JSON export.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta

from bench.web.live_common import (
    bench_run,
    chromium,
    daphne,
    fresh_channel_layer,
    logged_in_context,
    median_ms,
    scratch_database,
    setup_django,
    verl_metrics,
)

setup_django("bench_first_chart")

from django.db import connection  # noqa: E402

from webapp.runs.metrics import HEADLINE_METRICS, run_metric_series, run_metrics_json  # noqa: E402
from webapp.runs.models import MetricPoint, Run  # noqa: E402

ON_SCREEN = """() => {
  const grid = window.postTrainCharts;
  if (!grid || grid.panels.size < 10) return false;
  const shown = [...grid.panels.values()].filter((p) => p.visible);
  return shown.length > 0 && shown.every((p) => !p.dirty && p.plot.data && p.plot.data.length);
}"""

READ = """async () => {
  const {hasWebGL} = await import("/static/js/charts.js");
  const nav = performance.getEntriesByType("navigation")[0];
  const first = performance.getEntriesByName("posttrain:first-chart")[0];
  const grid = window.postTrainCharts;
  const score = grid.panels.get("score");
  const mark = (prefix) => performance.getEntriesByType("mark").find((m) => m.name.startsWith(prefix))?.startTime ?? null;
  return {
    html: nav.responseEnd,
    scripts: nav.domContentLoadedEventEnd,
    socket_open: mark("posttrain:socket-open"),
    first_backlog: mark("posttrain:first-backlog"),
    first_chart: first ? first.startTime : null,
    on_screen: performance.now(),
    webgl: hasWebGL,
    panels: grid.panels.size,
    panels_on_screen: [...grid.panels.values()].filter((p) => p.visible).length,
    score_points: Math.max(...score.plot.data.map((t) => t.x.length)),
  };
}"""


def record_run(steps: int) -> Run:
    """Create the run and its ``steps`` metric rows, 26 s apart as a real GRPO run would be."""
    run = bench_run(total_steps=steps)
    start = run.started_at - timedelta(seconds=26 * steps)
    batch = []
    for step in range(1, steps + 1):
        wall_time = start + timedelta(seconds=26 * step)
        batch.append(
            MetricPoint(run=run, step=step, wall_time=wall_time, metrics=verl_metrics(step))
        )
        if len(batch) == 2000:
            MetricPoint.objects.bulk_create(batch)
            batch = []
    MetricPoint.objects.bulk_create(batch)
    Run.objects.filter(pk=run.pk).update(latest_step=steps, started_at=start)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_metricpoint")
    return run


def server_side(run: Run) -> dict[str, float]:
    """Time the consumer's two backlog queries and size what they send."""
    head = run_metric_series(run_id=run.pk, names=HEADLINE_METRICS)
    rest = run_metric_series(run_id=run.pk, step_max=head["last_step"])
    whole = run_metrics_json(run_id=run.pk)
    return {
        "score_query_ms": round(
            median_ms(lambda: run_metric_series(run_id=run.pk, names=HEADLINE_METRICS)), 1
        ),
        "all_series_query_ms": round(median_ms(lambda: run_metric_series(run_id=run.pk)), 1),
        "series": len(rest["series"]),
        "max_points_per_series": max(len(s["step"]) for s in rest["series"].values()),
        "score_message_kb": round(len(json.dumps(head["series"])) / 1024, 1),
        "backlog_kb": round(len(json.dumps(rest["series"])) / 1024, 1),
        "full_export_json_kb": round(len(json.dumps(whole)) / 1024, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    fresh_channel_layer()
    with scratch_database() as database, daphne(database) as base_url, chromium() as browser:
        begin = time.perf_counter()
        run = record_run(args.steps)
        inserted_s = time.perf_counter() - begin
        server = server_side(run)
        loads = []
        for _ in range(args.repeats):
            context = logged_in_context(browser, base_url, run.owner)
            page = context.new_page()
            page.goto(f"{base_url}{run.get_absolute_url()}")
            page.wait_for_function(ON_SCREEN, timeout=120_000, polling="raf")
            loads.append(page.evaluate(READ))
            context.close()

    def median(key: str) -> float:
        return round(statistics.median(load[key] for load in loads), 1)

    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "steps": args.steps,
        "metrics_per_step": len(verl_metrics(1)),
        "insert_s": round(inserted_s, 1),
        "server": server,
        "browser_median_ms": {
            k: median(k)
            for k in ("html", "scripts", "socket_open", "first_backlog", "first_chart", "on_screen")
        },
        "loads": loads,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
