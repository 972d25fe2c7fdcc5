"""Smoke test of ``bench.training.compare_trl``: one short repeat of every phase on the tiny scale.

It checks that the script still runs end to end against the installed TRL and writes what the
benchmark page reads; it asserts no timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "trl", reason="TRL is not installed; install the bench extra: pip install -e '.[bench]'"
)

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


@pytest.mark.slow
def test_one_short_repeat_runs_both_frameworks_and_writes_the_results(tmp_path):
    results = tmp_path / "results"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "bench.training.compare_trl", "all", "--scale", "tiny"]
    command += ["--repeats", "1", "--steps", str(STEPS), "--test-size", "16"]
    command += ["--root", str(tmp_path / "root"), "--results-dir", str(results)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]

    (path,) = results.glob("compare_tiny_*.json")
    summary = json.loads(path.read_text())
    ((repeat,),) = [summary["per_repeat"]]
    assert {"engine_s_per_step", "trl_s_per_step", "trl_over_engine", "raw_sum_s"} <= set(repeat)
    assert repeat["engine_over_raw_sum"] > 0 and isinstance(repeat["clean"], bool)
    for arm in ("engine", "trl"):
        run = summary["arms"][arm]["typical_repeat"]
        assert len(run["step_wall_all_s"]) == STEPS
        assert len(run["reward_all_steps"]) == STEPS
        assert 0.0 <= summary["arms"][arm]["accuracy_at_step"][str(STEPS)] <= 1.0
        assert run["cpu_during_train"]["foreign_cpu_frac"] >= 0.0
        assert run["peak_rss_mib"] > 0
    engine, trl = (summary["arms"][a]["typical_repeat"] for a in ("engine", "trl"))
    assert engine["completions_per_s"] > 0 and trl["completions_per_s"] > 0
    assert 0.0 <= summary["base_acc"] <= 1.0 and summary["prepare"]["n_test"] == 16
    assert "| engine |" in proc.stdout and "| trl |" in proc.stdout
