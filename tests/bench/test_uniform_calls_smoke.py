"""Smoke test of ``bench.training.uniform_calls``: two rounds of both ways on two FSDP2 ranks.

It checks that the script still runs and reports both passes; it asserts no timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_two_rounds_time_one_call_and_agreed_buckets():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "bench.training.uniform_calls", "--rounds", "2"]
    command += ["--rows", "4", "--longest", "40"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 4 and result["lengths"] == [8, 40]
    shorter, longer = sorted(result["rank_mean_lengths"])
    assert shorter < longer  # the ranks hold different rows
    for name in ("forward", "forward_backward"):
        figures = result[name]
        assert figures["agreed_ms"] > 0 and figures["one_call_ms"] > 0
        assert figures["one_call_over_agreed"] > 0
