"""Smoke test of ``bench.training.ray_overhead``: a few alternating steps of the four arms.

It checks that the script runs end to end and that what it compares is the same work: the
in-process trainer and the Ray trainers (one rank; step calls over the direct channel or through
Ray; the reference pass in the rollout call or in its own call) log the same losses and rewards
at every step. It asserts no timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 7


@pytest.mark.slow
def test_the_four_arms_alternate_and_do_the_same_work(tmp_path):
    results = tmp_path / "results"
    command = [sys.executable, "-m", "bench.training.ray_overhead", "--steps", str(STEPS)]
    command += [
        "--ray-calls",
        "--three-calls",
        "--block",
        "2",
        "--root",
        str(tmp_path / "root"),
        "--results-dir",
        str(results),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]

    (path,) = results.glob("ray_overhead_*.json")
    data = json.loads(path.read_text())
    arms = ("ray", "ray_calls", "ray_three_calls")
    assert set(data["steps"]) == {"local", *arms}
    local = data["steps"]["local"]
    assert len(local) == STEPS
    assert any(row["actor/kl_loss"] > 0 for row in local)  # the reference pass was used
    for arm in arms:
        for row, base in zip(data["steps"][arm], local, strict=True):
            for key in ("actor/pg_loss", "actor/kl_loss", "critic/score/mean"):
                assert row[key] == base[key], (arm, key)
            assert row["ref"] > 0 and row["gen"] > 0
        assert data["summary"][arm]["step_over_local"] > 0
    assert "| ray_calls |" in proc.stdout and "2-step blocks" in proc.stdout
