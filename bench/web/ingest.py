"""External-run ingest: samples per second through the API, and ``posttrain watch`` keeping up
with a verl run at scale (512 prompts x 16 responses x 4k tokens a step, a step every 10 s).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.web.ingest [--short 50000] [--prompts 512]
        [--n 16] [--tokens 4096] [--steps 4] [--period 10]

It makes a scratch database (``--database``, ``bench_ingest``) and serves the studio from Daphne in another
process (``bench.web.live_common.daphne``), then:

1. **short samples** (a 60-word prompt, a 120-word response, 3 reward parts): ``--short`` samples
   sent through ``/api/external-runs/{id}/samples`` by ``posttrain_client`` (batches of 2,000,
   one request at a time, real HTTP), against the same records written by the driver's own path
   (``driver_writes.samples_write``: one COPY, no HTTP) — samples/s of each and their ratio;
2. **one verl step at scale**: ``prompts x n`` samples with ``--tokens``-word responses (about
   20 KB of text each), the same two ways;
3. **the watcher following a run**: a writer process writes ``--steps`` steps of that size in
   verl's formats (``RayPPOTrainer._dump_generations``'s ``<step>.jsonl``, then
   ``FileLogger``'s log line), one every ``--period`` seconds; ``python -m posttrain_client watch``
   follows the files; for each step, the lag from its log line being written to its metrics
   being in PostgreSQL (the watcher sends a step's samples before its metrics, so the metrics'
   arrival is the step's).

Text is random words from a fixed vocabulary (seeded), so PostgreSQL's compression of the text
columns sees what it would on real rollouts, not a repeated string. The machine is shared with
other jobs: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.web.live_common import ROOT, daphne, scratch_database, setup_django

VOCAB = [
    "the", "answer", "is", "so", "we", "add", "carry", "one", "then", "multiply", "by", "two",
    "step", "first", "next", "finally", "therefore", "total", "equals", "minus", "plus", "of",
    "each", "group", "has", "items", "and", "left", "over", "which", "gives", "us", "boxed",
]  # fmt: skip
CHARS_PER_TOKEN = 4.5  # English text runs about 4 characters a token; a little over, to be safe


def text_pool(words: int, seed: int = 0) -> str:
    """Return ``words`` random words: slices of it are the responses."""
    rng = np.random.default_rng(seed)
    return " ".join(np.array(VOCAB)[rng.integers(0, len(VOCAB), words)])


def sample_dicts(step: int, prompts: int, n: int, tokens: int, pool: str, seed: int) -> list[dict]:
    """Return one step's samples as the API takes them (prompt groups of ``n``)."""
    rng = np.random.default_rng(seed)
    length = int(tokens * CHARS_PER_TOKEN)
    starts = rng.integers(0, len(pool) - length - 1, prompts * n)
    samples = []
    for p in range(prompts):
        prompt = f"Problem {step}-{p}: " + pool[starts[p * n] // 2 :][:300]
        for i in range(n):
            start = int(starts[p * n + i])
            samples.append(
                {
                    "step": step,
                    "prompt": prompt,
                    "response": pool[start : start + length],
                    "reward": float((p + i) % 2),
                    "sample_index": i,
                    "ground_truth": str(p),
                    "reward_parts": {"acc": float((p + i) % 2), "format": 1.0, "pred": str(i)},
                }
            )
    return samples


def as_records(samples: list[dict]) -> list:
    """Return the samples as the driver records them (``SampleRecord``s: what ``samples_write``
    takes)."""
    from webapp.external.services import external_sample

    return [external_sample(**s) for s in samples]


def external_run(owner, key: str):
    from webapp.external.services import external_run_create

    run, _ = external_run_create(owner=owner, key=key, name="bench", source="verl")
    return run


def direct_rate(owner, samples: list[dict]) -> float:
    """Samples/s of the driver's path: build the records, one COPY (the transaction's time)."""
    from webapp.runs.driver_writes import samples_write

    run = external_run(owner, f"direct-{time.time_ns()}")
    started = time.perf_counter()
    samples_write(run_id=run.pk, samples=as_records(samples))
    return len(samples) / (time.perf_counter() - started)


def api_rate(url: str, token: str, samples: list[dict]) -> float:
    """Samples/s through the API: ``posttrain_client`` batches, HTTP, the server's COPY."""
    from posttrain_client import Studio
    from posttrain_client.external import ExternalRun

    with Studio(url, token, timeout=300) as studio:
        run = ExternalRun.create(studio, key=f"api-{time.time_ns()}", name="bench", source="verl")
        started = time.perf_counter()
        stored = run.samples(samples)
        elapsed = time.perf_counter() - started
    assert stored == len(samples)
    return len(samples) / elapsed


WRITER = r"""
import json, shutil, sys, time
staged, folder, log_path, steps, period = sys.argv[1:4] + [int(sys.argv[4]), float(sys.argv[5])]
log = open(log_path, "wb", buffering=0)  # verl's FileLogger
written = {}
start = time.time()
for step in range(1, steps + 1):
    time.sleep(max(0.0, start + step * period - time.time()))
    # RayPPOTrainer._dump_generations writes <step>.jsonl whole; then the step's log line.
    shutil.copyfile(f"{staged}/{step}.jsonl", f"{folder}/{step}.jsonl")
    log.write(json.dumps({"step": step, "data": {"critic/score/mean": 0.5}}).encode() + b"\n")
    written[step] = time.time()
json.dump(written, open(log_path + ".written", "w"))
"""


def stage_dumps(staged: Path, args: argparse.Namespace, pool: str) -> None:
    """Write each step's dump in verl's format (``_dump_generations``) to ``staged``."""
    for step in range(1, args.steps + 1):
        samples = sample_dicts(step, args.prompts, args.n, args.tokens, pool, seed=step)
        lines = [
            json.dumps({"input": s["prompt"], "output": s["response"], "gts": s["ground_truth"],
                        "score": s["reward"], "step": step, **s["reward_parts"]},
                       ensure_ascii=False)
            for s in samples
        ]  # fmt: skip
        (staged / f"{step}.jsonl").write_text("\n".join(lines) + "\n")


def watcher_lags(url: str, token: str, args: argparse.Namespace, pool: str) -> list[float]:
    """Return, per step, seconds from its log line being written to its metrics being stored."""
    from webapp.runs.models import MetricPoint, Run, Sample

    with tempfile.TemporaryDirectory() as tmp:
        staged, folder, log = Path(tmp) / "staged", Path(tmp) / "rollouts", Path(tmp) / "m.jsonl"
        staged.mkdir()
        folder.mkdir()
        stage_dumps(staged, args, pool)
        log.touch()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "POSTTRAIN_URL": url,
            "POSTTRAIN_TOKEN": token,
        }
        watch = subprocess.Popen(
            [sys.executable, "-m", "posttrain_client", "watch", "--log", str(log),
             "--rollout-dir", str(folder), "--name", "watch bench", "--interval", "0.5"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(staged), str(folder), str(log), str(args.steps),
             str(args.period)]
        )  # fmt: skip
        arrived: dict[int, float] = {}
        run = None
        deadline = time.time() + args.steps * args.period + 300
        try:
            while len(arrived) < args.steps and time.time() < deadline:
                run = run or Run.objects.filter(experiment__name="watch bench").first()
                if run is not None:
                    for step in MetricPoint.objects.filter(run=run).values_list("step", flat=True):
                        arrived.setdefault(step, time.time())
                time.sleep(0.1)
            writer.wait(60)
        finally:
            watch.terminate()
            watch.wait(30)
        written = {int(k): v for k, v in json.loads(Path(f"{log}.written").read_text()).items()}
        stored = Sample.objects.filter(run=run).count()
        expected = args.steps * args.prompts * args.n
        assert stored == expected, f"{stored} samples stored, {expected} written"
        return [arrived[s] - written[s] for s in sorted(written)]


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=50_000, help="short samples to send")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--n", type=int, default=16, help="responses per prompt")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per response")
    parser.add_argument("--steps", type=int, default=4, help="steps the watcher follows")
    parser.add_argument("--period", type=float, default=10.0, help="seconds between steps")
    parser.add_argument("--database", default="bench_ingest", help="scratch database (dropped)")
    args = parser.parse_args(argv)
    setup_django(args.database)

    from django.contrib.auth import get_user_model

    from webapp.api.tokens import token_create

    with scratch_database() as database, daphne(database) as url:
        owner = get_user_model().objects.create_user("bench", password="bench-pass")
        _, token = token_create(owner=owner, name="bench")
        pool = text_pool(400_000)
        print(f"machine: {os.cpu_count()} cores, load average {load()}")

        short = sample_dicts(0, args.short // 16, 16, 120, pool[:40_000], seed=1)
        for sample in short:
            sample["prompt"] = sample["prompt"][:330]
        direct, api = direct_rate(owner, short), api_rate(url, token, short)
        print(
            f"| short samples ({len(short):,}) | {direct:,.0f} | {api:,.0f} | {api / direct:.2f} |"
        )

        big = sample_dicts(1, args.prompts, args.n, args.tokens, pool, seed=2)
        mib = sum(len(s["response"]) + len(s["prompt"]) for s in big) / 1024**2
        direct, api = direct_rate(owner, big), api_rate(url, token, big)
        print(
            f"| one step: {args.prompts} x {args.n} x {args.tokens} tokens ({mib:,.0f} MiB of "
            f"text) | {direct:,.0f} | {api:,.0f} | {api / direct:.2f} |"
        )
        print(f"  one step through the API: {len(big) / api:.1f} s; load average {load()}")
        del big

        lags = watcher_lags(url, token, args, pool)
        print(
            f"watcher, a step every {args.period:g} s: lag per step "
            + ", ".join(f"{lag:.1f}" for lag in lags)
            + f" s (max {max(lags):.1f} s); load average {load()}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
