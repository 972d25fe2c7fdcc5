"""``POSTTRAIN_SANDBOX=local``: run a candidate under an in-process guard, not in a sandbox.

The administrator's opt-in for machines without bubblewrap. Each process runs
``harness/local_guard.py`` as ``python -I`` in a temporary working folder of its own (its
``HOME`` and ``TMPDIR``), with rlimits (CPU seconds, address space, file size, no core dumps), a
minimal environment, its own session (killed as a group at the deadline) and an audit hook (PEP
578) that refuses writes outside the folder, new processes, signals, sockets and ``ctypes``.

- stdio tests: one process runs the candidate once per input and reports each output on its
  stdout, tagged with a nonce; this process compares the outputs.
- assertion tests: the bubblewrap path's protocol on two guarded processes joined by pipes: the
  program's (``harness/program_server.py`` over the candidate) and the evaluator's
  (``harness/evaluator.py`` over the test statements, with the nonce). The tests never share an
  interpreter with the candidate: they judge plain values the program's functions returned,
  with builtins the candidate cannot patch, and an exception from the candidate never ends their
  iteration.

This is NOT a security boundary. It stops accidents and the usual reward hacks of a policy
model, but audit hooks are not one (their own documentation says so: code in the process can get
around them), reads are not refused (the candidate can read any file the server's user can, the
evaluator's tests and nonce included), and a stdio candidate shares an interpreter with the
harness that reports its outputs, so a determined one can forge results. Only the time and
memory limits (``timeout_s``, ``memory_mb``) and the size of one reply between the processes
(``max_output_bytes``) apply here; files are capped at 16 MiB, and ``max_processes`` and
``max_file_mb`` are the bubblewrap path's.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.rewards import harness
from engine.rewards.code_tests import MAX_ERROR_CHARS, Reports, TestSuite, read_reports, score


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


def _start_guarded(
    workdir: str, limits: Callable[[], None], *script: str, **streams: Any
) -> subprocess.Popen:
    """Start the local guard in ``workdir``, over a harness ``script`` and its arguments if given."""
    return subprocess.Popen(
        [sys.executable, "-I", "-B", "-X", "utf8", "-c", harness.source("local_guard.py"), *script],
        cwd=workdir,
        env=_sandbox_env(workdir),
        preexec_fn=limits,  # only setrlimit runs between fork and exec
        start_new_session=True,
        **streams,
    )


def _end(process: subprocess.Popen) -> None:
    """Kill ``process``'s whole group (a candidate's own children die with it) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _wait(process: subprocess.Popen, timeout_s: float, data: bytes | None = None) -> bool:
    """Feed ``data`` to ``process`` and wait; end its group; return whether it ran out of time."""
    timed_out = False
    try:
        process.communicate(data, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _end(process)
    return timed_out or process.returncode == -signal.SIGXCPU


def run_tests_local(
    code: str,
    suite: TestSuite,
    *,
    timeout_s: float = 5.0,
    memory_mb: float = 1024,
    max_output_bytes: float = 1 << 20,
) -> dict[str, Any]:
    """Run a candidate against its tests under the local guard; return the result parts."""
    reported, timed_out, stderr_tail = _guarded_reports(
        code, suite, timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes
    )
    return score(suite, reported, timed_out, stderr_tail)


def run_program_local(
    code: str, stdin: str, *, timeout_s: float, memory_mb: float
) -> tuple[str, str | None, bool]:
    """Run one program on ``stdin`` under the local guard; return (stdout, error, timed out)."""
    reported, timed_out, stderr_tail = _guarded_reports(
        code, TestSuite("stdio", [stdin], [""]), timeout_s=timeout_s, memory_mb=memory_mb
    )
    if 0 not in reported:
        return "", "timed out" if timed_out else stderr_tail or "no result", timed_out
    stdout, error = reported[0]
    return str(stdout), error, timed_out


def _guarded_reports(
    code: str,
    suite: TestSuite,
    *,
    timeout_s: float,
    memory_mb: float,
    max_output_bytes: float = 1 << 20,
) -> tuple[Reports, bool, str]:
    """Run a candidate's tests under the local guard; return (reports, timed out, stderr tail)."""
    nonce = secrets.token_hex(16)
    limits = functools.partial(
        _apply_limits, math.ceil(timeout_s) + 1, int(memory_mb * 2**20), 16 * 2**20
    )
    with tempfile.TemporaryDirectory(prefix="reward-io-") as io_dir:
        out_path, err_path = Path(io_dir, "stdout"), Path(io_dir, "stderr")
        with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
            if suite.mode == "stdio":
                payload = json.dumps({"nonce": nonce, "code": code, "inputs": suite.inputs})
                with tempfile.TemporaryDirectory(prefix="reward-sandbox-") as workdir:
                    process = _start_guarded(
                        workdir, limits, stdin=subprocess.PIPE, stdout=out_file, stderr=err_file
                    )
                    timed_out = _wait(process, timeout_s, payload.encode())
            else:
                evaluator = harness.evaluator_files(suite.statements, nonce, int(max_output_bytes))
                timed_out = _run_asserts(
                    harness.program_files(code.encode()),
                    evaluator,
                    limits,
                    timeout_s,
                    stdout=out_file,
                    stderr=err_file,
                )
        reported = read_reports(out_path.read_bytes(), nonce)
        stderr_tail = err_path.read_bytes()[-MAX_ERROR_CHARS:].decode("utf-8", "replace")
    return reported, timed_out, stderr_tail.strip()


def _run_asserts(
    program_files: dict[str, bytes],
    evaluator_files: dict[str, bytes],
    limits: Callable[[], None],
    timeout_s: float,
    **evaluator_output: Any,
) -> bool:
    """Run the program and the evaluator as two guarded processes joined by pipes, as the
    bubblewrap path does; return whether the evaluator ran out of time."""
    with (
        tempfile.TemporaryDirectory(prefix="reward-program-") as program_dir,
        tempfile.TemporaryDirectory(prefix="reward-evaluator-") as evaluator_dir,
    ):
        for folder, files in ((program_dir, program_files), (evaluator_dir, evaluator_files)):
            for name, data in files.items():
                Path(folder, name).write_bytes(data)
        request_r, request_w = os.pipe()  # evaluator -> program
        reply_r, reply_w = os.pipe()  # program -> evaluator
        program = None
        try:
            program = _start_guarded(
                program_dir,
                limits,
                str(Path(program_dir, "server.py")),
                stdin=request_r,
                stdout=reply_w,
                stderr=subprocess.DEVNULL,
            )
            evaluator = _start_guarded(
                evaluator_dir,
                limits,
                str(Path(evaluator_dir, "evaluator.py")),
                str(request_w),
                stdin=reply_r,
                pass_fds=(request_w,),
                **evaluator_output,
            )
        except BaseException:
            if program is not None:
                _end(program)
            raise
        finally:
            for fd in (request_r, request_w, reply_r, reply_w):
                os.close(fd)
        try:
            return _wait(evaluator, timeout_s)
        finally:
            _end(program)
