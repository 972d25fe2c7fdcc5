"""Smoke test of ``bench.web.soak``: a 60-step tiny run through the real driver, Daphne, viewers.

It checks that the script still launches the run the studio's way, that its viewers get every
step and the end, and that it samples both processes and reports their slopes; it asserts no
memory figure (60 steps are all warm-up).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 60


@pytest.mark.slow
def test_a_short_soak_samples_the_driver_and_the_web_process(tmp_path):
    out = tmp_path / "soak.json"
    database = (os.environ.get("POSTTRAIN_TEST_DATABASE") or "test_posttrain") + "_soak"
    command = [sys.executable, "-m", "bench.web.soak", "--steps", str(STEPS), "--viewers", "2"]
    # Sample often: on a quiet machine 60 steps take under 10 s.
    command += ["--interval", "0.1", "--save-freq", "30", "--test-freq", "30"]
    command += ["--database", database, "--json", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]

    result = json.loads(out.read_text())
    assert result["problems"] == []
    assert result["settings"]["trainer.total_training_steps"] == STEPS
    assert result["step_rate"]["steps_per_s"] > 0
    steps = [s["step"] for s in result["samples"]]
    assert steps == sorted(steps) and steps[-1] >= STEPS / 2
    for process in ("driver", "web"):
        figures = result[process]
        assert 0 < figures["start_mib"] <= figures["max_mib"]
        assert isinstance(figures["slope_mib_per_1000_steps"], float)
    assert "| driver |" in proc.stdout and "| web |" in proc.stdout
