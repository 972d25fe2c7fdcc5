"""Smoke test of ``bench.training.uniform_calls``: two rounds of both variants on the tiny model.

It checks that the script still runs and reports both passes; it asserts no timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_two_rounds_time_buckets_and_one_call():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "bench.training.uniform_calls", "--rounds", "2"]
    command += ["--rows", "4", "--longest", "40"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 4 and result["lengths"] == [8, 40]
    for name in ("forward", "forward_backward"):
        figures = result[name]
        assert figures["buckets_ms"] > 0 and figures["one_call_ms"] > 0
        assert figures["one_call_over_buckets"] > 0
