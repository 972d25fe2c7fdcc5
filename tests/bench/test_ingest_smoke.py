"""Smoke test of ``bench.web.ingest``: small sizes through the API, the driver's COPY and the
watcher, so the script keeps working; it asserts no rate (the sizes are all overhead)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_small_ingest_run_reports_rates_and_watcher_lags():
    database = (os.environ.get("POSTTRAIN_TEST_DATABASE") or "test_posttrain") + "_ingest"
    command = [sys.executable, "-m", "bench.web.ingest", "--short", "320", "--prompts", "8",
               "--n", "4", "--tokens", "64", "--steps", "2", "--period", "1",
               "--database", database]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"\| short samples \(320\) \| [\d,]+ \| [\d,]+ \| [\d.]+ \|", proc.stdout)
    assert re.search(r"one step: 8 x 4 x 64 tokens", proc.stdout)
    lags = re.search(r"lag per step ([\d.]+), ([\d.]+) s", proc.stdout)
    assert lags, proc.stdout
