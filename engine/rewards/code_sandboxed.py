"""``POSTTRAIN_SANDBOX=bwrap`` (the default): run a candidate's tests in bubblewrap sandboxes.

Every program runs in a sandbox of ``engine/rewards/sandbox.py`` under the resolved limits, and
``timeout_s`` is the wall-clock budget of the whole candidate: one deadline for all its
sandboxes; tests finished before it keep their results, the rest fail as timed out.

- stdio tests: one sandbox per input, holding only the program at ``/box/main.py``, run one
  after another. The program's stdout comes back here and is compared in this process; a test
  whose program overflows ``max_output_bytes``, exits non-zero or times out carries that error
  (a timeout also ends the suite).
- assertion tests: two sandboxes joined by two pipes. The program's sandbox runs
  ``harness/program_server.py`` (``/box/server.py``) over the candidate (``/box/main.py``); the
  evaluator's runs ``harness/evaluator.py`` over the test statements (``/box/tests.json``, with
  a nonce made here). Both load ``harness/codec.py`` from ``/box``. The evaluator writes requests
  on one pipe (inherited as an extra fd) and reads the replies, capped at ``max_output_bytes`` a
  line, on its stdin; it reports each assert on its stdout, the only output read back here, and
  only lines with the nonce count. The program's stderr is dropped; the evaluator's last stderr
  line explains tests it never reported. Whatever happens, the program's sandbox is killed when
  the evaluator's ends.

The harness programs are files of ``engine/rewards/harness`` read as text at each call and
given to the sandbox as read-only files of ``/box``: the project itself is never mounted.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from typing import Any

from engine.rewards import harness, sandbox
from engine.rewards.code_tests import MAX_ERROR_CHARS, Reports, TestSuite, read_reports, score


def _python_argv(script: str, *args: str) -> list[str]:
    return [sandbox.interpreter(), "-I", "-B", "-X", "utf8", script, *args]


def _in_box(files: dict[str, bytes]) -> dict[str, bytes]:
    return {f"/box/{name}": data for name, data in files.items()}


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:MAX_ERROR_CHARS] if lines else ""


def run_tests_bwrap(code: str, suite: TestSuite, limits: sandbox.Limits) -> dict[str, Any]:
    """Run a candidate against its tests in bubblewrap sandboxes; return the result parts."""
    bwrap = sandbox.check_available()
    deadline = time.monotonic() + limits.timeout_s
    if suite.mode == "stdio":
        return _run_stdio(bwrap, code.encode(), suite, limits, deadline)
    return _run_asserts(bwrap, code.encode(), suite, limits, deadline)


def _run_stdio(
    bwrap: str, code: bytes, suite: TestSuite, limits: sandbox.Limits, deadline: float
) -> dict[str, Any]:
    """Run the program once per input, each in its own sandbox; compare outputs here."""
    reported: Reports = {}
    timed_out = False
    for index, text in enumerate(suite.inputs):
        if time.monotonic() >= deadline:
            timed_out = True
            break
        stdout, error, timed_out = run_program_bwrap(bwrap, code, text, limits, deadline)
        reported[index] = (stdout, error)
        if timed_out:
            break
    return score(suite, reported, timed_out, "")


def run_program_bwrap(
    bwrap: str, code: bytes, stdin: str, limits: sandbox.Limits, deadline: float
) -> tuple[str, str | None, bool]:
    """Run one program on ``stdin`` in a sandbox of its own; return (stdout, error, timed out)."""
    box = sandbox.Sandbox(bwrap, {"/box/main.py": code}, limits, _python_argv("/box/main.py"))
    result = box.run(stdin.encode(), deadline)
    error = None
    if result.output_overflow:
        error = f"output over {int(limits.max_output_bytes)} bytes"
    elif result.timed_out:
        error = "timed out"
    elif result.returncode != 0:
        error = _last_line(result.stderr) or f"exit status {result.returncode}"
    return result.stdout.decode("utf-8", "replace"), error, result.timed_out


def _run_asserts(
    bwrap: str, code: bytes, suite: TestSuite, limits: sandbox.Limits, deadline: float
) -> dict[str, Any]:
    """Run the program and the evaluator in two sandboxes joined by pipes; read its reports."""
    nonce = secrets.token_hex(16)
    request_r, request_w = os.pipe()  # evaluator -> program
    reply_r, reply_w = os.pipe()  # program -> evaluator
    program = evaluator = None
    try:
        program = sandbox.Sandbox(
            bwrap,
            _in_box(harness.program_files(code)),
            limits,
            _python_argv("/box/server.py"),
            stdin=request_r,
            stdout=reply_w,
            stderr=subprocess.DEVNULL,
        )
        evaluator = sandbox.Sandbox(
            bwrap,
            _in_box(harness.evaluator_files(suite.statements, nonce, int(limits.max_output_bytes))),
            limits,
            _python_argv("/box/evaluator.py", str(request_w)),
            stdin=reply_r,
            pass_fds=(request_w,),
        )
    finally:
        for fd in (request_r, request_w, reply_r, reply_w):
            os.close(fd)
        if evaluator is None and program is not None:
            program.kill()
    try:
        result = evaluator.run(None, deadline)
    finally:
        program.kill()
    reported = read_reports(result.stdout, nonce)
    return score(suite, reported, result.timed_out, _last_line(result.stderr))
