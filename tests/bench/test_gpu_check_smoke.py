"""Smoke test of ``scripts/gpu_check.sh --cpu``: every stage of the device check, on this CPU.

The device check costs one call on a lent GPU; this runs the same stages with a tiny model so a
broken stage is found here first. It asserts no timing.
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
STAGES = ("versions", "device_info", "pytest_gpu", "vllm", "prepare", "engine", "trl", "summary")


@pytest.mark.slow
def test_every_stage_of_the_device_check_runs_on_a_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_PYTHON": sys.executable}
    env.pop("GPU_CHECK_WHEEL_DIR", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    stages = (tmp_path / "stages.txt").read_text().splitlines()
    assert [line.split()[0] for line in stages] == list(STAGES)
    assert stages[3] == "vllm skipped: CI runs these on the CPU build"
    assert all(" rc=0 " in line for line in stages if not line.startswith("vllm "))
    log = (tmp_path / "gpu_check.log").read_text()
    assert "needs a CUDA GPU" in log  # the gpu tests were collected and skipped, not missing
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["prepare"]["size"] == "tiny"
    for arm in ("engine", "trl"):
        assert result[arm]["status"] == "succeeded"
        assert len(result[arm]["steps"]) == 3
        assert result[arm]["median_s_per_step"] > 0
        assert result[arm]["tokens_per_step"]["response"] > 0
    assert result["trl_over_engine_s_per_step"] > 0
    assert json.loads((tmp_path / "device_info.json").read_text())["cuda_available"] is False
