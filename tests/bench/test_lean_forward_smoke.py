"""Smoke test of ``bench.training.lean_forward``: two rounds of every variant on the tiny model.

It checks that the script still runs against the trainer and reports every variant's passes;
it asserts no timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_rounds_time_every_variant_on_one_batch():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "bench.training.lean_forward", "--threads", "1"]
    command += ["--rounds", "2", "--warmup", "1", "--unshared"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 32  # 8 prompts x 4 samples, as in compare_trl
    assert set(result["median_ms"]) == {"lean", "module", "unshared"}
    assert all(ms > 0 for parts in result["median_ms"].values() for ms in parts.values())
    assert set(result["ratio_to_lean"]) == {"module", "unshared"}
    assert all(set(r) == {"generate", "ref", "update"} for r in result["ratio_to_lean"].values())
