"""Sample inspector speed with 200,000 samples in one run: step view, group view and friends.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.web.sample_inspector [--steps 200] [--prompts 125]
        [--n 8] [--repeats 40] [--keep]

It creates a scratch database (``bench_sample_inspector``, migrated like a test database),
inserts ``steps * prompts * n`` train samples into one run with the recorder's COPY path
(``samples_write``; 16-96 tokens each with their log-prob, reference log-prob and advantage
arrays), runs ANALYZE, and times whole requests through Django's test client (URL routing,
session and auth middleware, the selectors' queries and the template render): the median,
90th percentile and max server time of each view over ``--repeats`` requests at random steps and
prompts. It then prints ``EXPLAIN (ANALYZE, BUFFERS)`` for every query the step and group
views send, fails if one of them reads ``runs_sample`` with a sequential scan, and streams the
whole run as JSONL with its resident memory growth. The database is dropped afterwards
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Production settings (DEBUG off) need a secret key; a throwaway one serves a benchmark.
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["POSTTRAIN_TEST_DATABASE"] = "bench_sample_inspector"

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import reverse  # noqa: E402

from engine.trainer.reporting import SampleRecord  # noqa: E402
from webapp.experiments.models import Experiment  # noqa: E402
from webapp.runs.driver_writes import samples_write  # noqa: E402
from webapp.runs.models import Run, RunStatus, Sample  # noqa: E402

WORDS = ["Ġthe", "Ġanswer", "Ġis", "Ġ4", "2", "Ġso", "Ġwe", "Ġadd", "Ġcarry", "Ġ1", ".", "Ċ"]


def generate(run: Run, steps: int, prompts: int, n: int, seed: int = 0) -> float:
    """Insert the samples one step at a time with COPY; return the seconds spent in COPY."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    copying = 0.0
    for step in range(1, steps + 1):
        batch = []
        # A GRPO batch: `prompts` different dataset rows per step, each answered n times.
        indices = rng.choice(prompts * 20, size=prompts, replace=False)
        for prompt_index in indices.tolist():
            rewards = rng.integers(0, 2, size=n).astype(float)
            mean, std = rewards.mean(), rewards.std(ddof=1)
            for i in range(n):
                length = int(rng.integers(16, 97))
                tokens = words[rng.integers(0, len(words), size=length)].tolist()
                advantage = float((rewards[i] - mean) / (std + 1e-6))
                logprobs = np.minimum(rng.normal(-0.8, 0.6, size=length), 0.0)
                batch.append(
                    SampleRecord(
                        step=step,
                        split="train",
                        prompt_index=prompt_index,
                        sample_index=i,
                        group_id=f"{step}-{prompt_index}",
                        data_source="bench_arithmetic",
                        prompt_text=f"Question {prompt_index}: what is {prompt_index} + 17?",
                        response_text="".join(tokens).replace("Ġ", " ").replace("Ċ", "\n"),
                        ground_truth=str(prompt_index + 17),
                        reward=float(rewards[i]),
                        reward_parts={"correct": float(rewards[i]), "format": 1.0},
                        advantage=advantage,
                        response_length=length,
                        truncated=length == 96,
                        tokens=tokens,
                        token_logprobs=logprobs.tolist(),
                        token_ref_logprobs=(logprobs - rng.normal(0, 0.05, size=length)).tolist(),
                        token_advantages=[advantage] * length,
                    )
                )
        started = time.perf_counter()
        samples_write(run_id=run.pk, samples=batch)
        copying += time.perf_counter() - started
    return copying


def timed(client: Client, urls: list[str]) -> list[float]:
    """Return the server time in milliseconds of each GET (the body fully read)."""
    times = []
    for url in urls:
        started = time.perf_counter()
        response = client.get(url)
        if response.streaming:
            for _ in response.streaming_content:
                pass
        elapsed = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, (url, response.status_code)
        times.append(elapsed)
    return times


def explain(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def plans(client: Client, url: str) -> list[tuple[str, str]]:
    """Return (sql, plan) for each query ``url`` sends to the sample table."""
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    table = Sample._meta.db_table
    return [(q["sql"], explain(q["sql"])) for q in captured.captured_queries if table in q["sql"]]


def rss_mib() -> float:
    """Return this process's resident memory in MiB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def export_stream(client: Client, url: str) -> tuple[float, float, int, float]:
    """Return seconds, resident memory growth (MiB), rows and MiB written of one export."""
    before = peak = rss_mib()
    started = time.perf_counter()
    response = client.get(url)
    rows = written = 0
    for chunk in response.streaming_content:
        rows += chunk.count(b"\n")
        written += len(chunk)
        peak = max(peak, rss_mib())
    return time.perf_counter() - started, peak - before, rows, written / 2**20


def summary(name: str, times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return (
        f"| {name} | {statistics.median(times):.1f} | {p90:.1f} | {max(times):.1f} | {len(times)} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=125)
    parser.add_argument("--n", type=int, default=8, help="responses per prompt (rollout.n)")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--keep", action="store_true", help="keep the database for a rerun")
    args = parser.parse_args()
    settings.DEBUG = False
    old_name = connection.settings_dict["NAME"]
    kept = args.keep and _database_has_samples(args)
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=args.keep)
    try:
        return run_benchmark(args, reuse=kept)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=args.keep)


def _database_has_samples(args: argparse.Namespace) -> bool:
    import psycopg

    db = connection.settings_dict
    try:
        with psycopg.connect(
            host=db["HOST"], port=db["PORT"], user=db["USER"], dbname="bench_sample_inspector"
        ) as conn:
            count = conn.execute("SELECT count(*) FROM runs_sample").fetchone()[0]
    except psycopg.Error:
        return False
    return count == args.steps * args.prompts * args.n


def run_benchmark(args: argparse.Namespace, reuse: bool) -> int:
    user_model = get_user_model()
    total = args.steps * args.prompts * args.n
    if reuse:
        run = Run.objects.get()
        user = run.owner
        print(f"reusing {total} samples in run {run.pk}")
    else:
        user = user_model.objects.create_user("bench", password="bench-pass")
        experiment = Experiment.objects.create(owner=user, name="bench", config={})
        run = Run.objects.create(
            experiment=experiment, owner=user, number=1, status=RunStatus.SUCCEEDED, config={}
        )
        copying = generate(run, args.steps, args.prompts, args.n)
        print(
            f"inserted {total} samples with samples_write (COPY) at {total / copying:,.0f} rows/s"
        )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Sample._meta.db_table}")
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size(%s))", [Sample._meta.db_table])
        size = cursor.fetchone()[0]
    print(f"{Sample.objects.filter(run=run).count()} samples in run {run.pk}; table {size}")

    client = Client()
    client.force_login(user)
    rng = random.Random(1)
    base = reverse("samples:step", kwargs={"run_id": run.pk})
    steps = list(range(1, args.steps + 1))
    groups = list(
        Sample.objects.filter(run=run, sample_index=0).values_list("step", "prompt_index")
    )

    def step_urls(query: str) -> list[str]:
        return [f"{base}?step={rng.choice(steps)}{query}" for _ in range(args.repeats)]

    group_urls = [
        reverse("samples:group", kwargs={"run_id": run.pk}) + f"?step={s}&prompt={p}"
        for s, p in rng.sample(groups, args.repeats)
    ]
    prompt_urls = [
        reverse("samples:prompt", kwargs={"run_id": run.pk}) + f"?prompt={p}"
        for _, p in rng.sample(groups, args.repeats)
    ]
    timed(client, step_urls("")[:5])  # warm the connection, templates and caches
    rows = [
        summary("step view (50 rows, index order)", timed(client, step_urls(""))),
        summary("step view sorted by reward", timed(client, step_urls("&sort=-reward"))),
        summary(
            "step view, text search + reward range",
            timed(client, step_urls("&q=carry&reward_min=0.5&sort=-length")),
        ),
        summary(
            "step view, page 10 (rows 451-500)", timed(client, step_urls("&per_page=50&page=10"))
        ),
        summary("group view (8 responses with tokens)", timed(client, group_urls)),
        summary(
            "steps list (slider, live polling)",
            timed(client, [reverse("samples:steps", kwargs={"run_id": run.pk})] * args.repeats),
        ),
        summary("across steps (one prompt)", timed(client, prompt_urls)),
    ]
    print("\n| request | median ms | p90 ms | max ms | requests |\n|---|---|---|---|---|")
    print("\n".join(rows))

    seq_scans = []
    for name, url in (("step view", step_urls("&sort=-reward")[0]), ("group view", group_urls[0])):
        print(f"\n### EXPLAIN of the {name}: {url}")
        for sql, plan in plans(client, url):
            print(f"\n{sql}\n{plan}")
            if f"Seq Scan on {Sample._meta.db_table}" in plan:
                seq_scans.append(sql)

    export_url = reverse("samples:export-jsonl", kwargs={"run_id": run.pk})
    seconds, growth, rows, written = export_stream(client, export_url)
    print(
        f"\nJSONL export of every step with the token arrays: {rows} rows, {written:.0f} MiB in "
        f"{seconds:.1f} s ({rows / seconds:,.0f} rows/s); resident memory grew {growth:.1f} MiB"
    )
    if seq_scans:
        print("FAIL: sequential scans of the sample table:\n" + "\n".join(seq_scans))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
