"""Train from the command line as a user would: ``python -m engine.main_ppo`` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def train_from_command_line(
    *overrides: str, run_dir: Path, timeout: float = 900
) -> subprocess.CompletedProcess:
    """Run ``engine.main_ppo`` with ``overrides`` (``--config-name`` among them, if any), the
    console and jsonl loggers and ``run_dir`` as its local dir; assert that it succeeded."""
    cmd = [
        sys.executable,
        "-m",
        "engine.main_ppo",
        *overrides,
        "trainer.logger=[console,jsonl]",
        f"trainer.default_local_dir={run_dir}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def metric_rows(run_dir: Path) -> list[dict[str, float]]:
    """Return the steps' metrics the jsonl logger wrote under ``run_dir``, in order."""
    lines = (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
