"""Train from the command line as a user would: ``python -m engine.main_ppo`` in a subprocess;
and the arguments a shell script hands its python command, as bash passes them."""

from __future__ import annotations

import json
import os
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


def run_python_code(
    code: str, *args: str, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """Run ``code`` (``python -c``, this interpreter) with ``args`` in ``cwd`` under ``env``;
    assert that it succeeded, naming the end of its stderr."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def metric_rows(run_dir: Path) -> list[dict[str, float]]:
    """Return the steps' metrics the jsonl logger wrote under ``run_dir``, in order."""
    lines = (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


PYTHON_STUB = """#!{python}
import json, sys
if {marker!r} in sys.argv:
    with open({out!r}, "w") as f:
        json.dump(sys.argv[1:], f)
"""
RAY_STUB = """#!/usr/bin/env bash
while [ "$1" != "--" ]; do shift; done
shift
exec "$@"
"""


def bash_arguments(script: Path, marker: str, tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run ``script`` with bash in ``tmp_path``, ``python3`` and ``ray`` on the PATH replaced by
    stubs, and return the arguments of the python command that names ``marker`` (after
    ``python3``), exactly as the shell passed them. ``env`` is the script's whole environment
    but for PATH."""
    bin_dir, out = tmp_path / "bin", tmp_path / "argv.json"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(
        PYTHON_STUB.format(python=sys.executable, marker=marker, out=str(out))
    )
    (bin_dir / "ray").write_text(RAY_STUB)
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    # The script's exit status is not checked: a script may fail after its python command (or
    # around it: the command line is what is asked for).
    done = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.exists(), f"no python command names {marker}: {done.stderr[-2000:]}"
    return json.loads(out.read_text())
