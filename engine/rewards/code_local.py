"""``POSTTRAIN_SANDBOX=local``: run a candidate under an in-process guard, not in a sandbox.

The administrator's opt-in for machines without bubblewrap. One ``python -I`` subprocess per
candidate runs ``harness/local_guard.py``: it gets rlimits (CPU seconds, address space, file
size, no core dumps), a temporary working folder as ``HOME`` and ``TMPDIR``, a minimal
environment, its own session (killed as a group at the deadline) and an audit hook (PEP 578)
that refuses writes outside the folder, new processes, signals, sockets and ``ctypes``. All
tests of the candidate run in that one process, which reports each on its stdout tagged with a
nonce.

This is NOT a security boundary. It stops accidents and the usual reward hacks of a policy
model, but audit hooks are not one (their own documentation says so: code in the process can
get around them), reads are not refused (the candidate can read any file the server's user
can), and the candidate shares an interpreter with the harness that reports its results, so a
determined one can forge them. Only the time and memory limits (``timeout_s``, ``memory_mb``)
apply here; files are capped at 16 MiB, and ``max_processes``, ``max_file_mb`` and
``max_output_bytes`` are the bubblewrap path's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from engine.rewards import harness
from engine.rewards.code_tests import MAX_ERROR_CHARS, TestSuite, read_reports, score


def _apply_limits(cpu_s: int, memory_bytes: int, file_bytes: int) -> None:
    """Lower this (forked, not yet exec'd) process's rlimits; runs as ``preexec_fn``."""
    for limit, value in (
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_CORE, 0),
    ):
        _, hard = resource.getrlimit(limit)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(limit, (value, value))


def _sandbox_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": os.defpath,
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
    }


def run_tests_local(
    code: str, suite: TestSuite, *, timeout_s: float = 5.0, memory_mb: float = 1024
) -> dict[str, Any]:
    """Run a candidate against its tests under the local guard; return the result parts."""
    nonce = secrets.token_hex(16)
    payload: dict[str, Any] = {"nonce": nonce, "code": code, "mode": suite.mode}
    if suite.mode == "stdio":
        payload["inputs"] = suite.inputs
    else:
        payload["statements"] = suite.statements
    limits = functools.partial(
        _apply_limits, math.ceil(timeout_s) + 1, int(memory_mb * 2**20), 16 * 2**20
    )
    program = harness.source("local_guard.py")
    with (
        tempfile.TemporaryDirectory(prefix="reward-sandbox-") as workdir,
        tempfile.TemporaryDirectory(prefix="reward-io-") as io_dir,
    ):
        out_path, err_path = Path(io_dir, "stdout"), Path(io_dir, "stderr")
        with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-X", "utf8", "-c", program],
                stdin=subprocess.PIPE,
                stdout=out_file,
                stderr=err_file,
                cwd=workdir,
                env=_sandbox_env(workdir),
                preexec_fn=limits,  # only setrlimit runs between fork and exec
                start_new_session=True,
                close_fds=True,
            )
            timed_out = False
            try:
                proc.communicate(json.dumps(payload).encode(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # The whole group: a candidate's own children die with it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        timed_out = timed_out or proc.returncode == -signal.SIGXCPU
        reported = read_reports(out_path.read_bytes(), nonce)
        stderr_tail = err_path.read_bytes()[-MAX_ERROR_CHARS:].decode("utf-8", "replace")
    return score(suite, reported, timed_out, stderr_tail.strip())
