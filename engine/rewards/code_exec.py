"""Code-execution reward (``data_source`` ``"code"``, ``"codecontests"``, ``"apps"``, ...).

The candidate program is the last fenced ```` ```python ```` block of the response (or the last
plain fence, or the whole response). It is syntax-checked with ``compile`` in this process; a
syntax error scores 0 and the error is kept in the parts. Otherwise it runs against the tests of
the ground truth, a dict or its JSON string:

- ``{"inputs": [...], "outputs": [...]}``: stdin/stdout pairs. The program runs once per input;
  its output must equal the expected one up to trailing whitespace on each line and blank lines
  at the end. Expected outputs never enter the sandbox: this process compares them.
- ``{"assert": "assert f(1) == 2\\n..."}``: the program runs once, then each top-level
  statement of the assertion code in order; every ``assert`` statement is one test, the other
  statements (imports, helpers) are setup.

``score`` is the fraction of tests passed (verl's ``continuous=True`` scoring).

Sandbox. Each candidate runs in its own ``python -I -B`` subprocess (isolated mode: no user site,
no ``PYTHON*`` variables, the script's directory not on ``sys.path``) with:

- a wall-clock timeout for the whole candidate; on expiry its process group is killed, the
  tests already finished keep their results and ``timed_out`` is 1;
- rlimits set in ``preexec_fn``: CPU seconds, address space, file size, no core dumps;
- an empty temporary working directory, removed afterwards, as ``cwd``, ``HOME`` and ``TMPDIR``,
  and a minimal environment;
- an audit hook (PEP 578), installed before the candidate's code runs, that refuses writes,
  deletes, renames and permission changes outside the working directory, starting processes,
  signalling other processes, sockets and ``ctypes``.

Results come back as lines tagged with a random nonce the candidate is not told, so printing a
fake "passed" line earns nothing. This stops accidents and the usual reward hacks of a policy
model; it is not a security boundary against a determined attacker (audit hooks are not one, by
their own documentation). Run untrusted code at scale inside a container or a sandbox service.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import math
import os
import re
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FENCED_PYTHON = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_FENCED_ANY = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_MAX_ERROR_CHARS = 500

# Runs inside the sandbox. It reads the payload, installs the audit hook, runs the tests and
# reports one nonce-tagged JSON line per test on its real stdout.
_HARNESS = r"""
import io, json, os, sys

def _install_guard(workdir):
    root = os.path.realpath(workdir)
    realpath, join, fsdecode = os.path.realpath, os.path.join, os.fsdecode
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    path_args = {
        "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
        "os.link": (0, 1), "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,),
        "os.chflags": (0,), "os.truncate": (0,), "os.utime": (0,), "os.mkfifo": (0,),
        "os.mknod": (0,), "shutil.rmtree": (0,), "shutil.chown": (0,),
    }
    refused = ("subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
               "os.forkpty", "pty.", "os.kill", "os.killpg", "signal.pthread_kill", "socket.",
               "ctypes.", "webbrowser.")

    def inside(path):
        if isinstance(path, int):
            return True
        resolved = realpath(join(root, fsdecode(path)))
        return resolved == root or resolved.startswith(root + os.sep)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writes and path is not None and not inside(path):
                raise PermissionError(f"writing {path!r} outside the sandbox is not allowed")
        elif event in path_args:
            for i in path_args[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    raise PermissionError(f"{event} on {args[i]!r} outside the sandbox is not allowed")
        elif event.startswith(refused) or (event == "import" and args[0] in ("ctypes", "_ctypes")):
            raise PermissionError(f"{event} is not allowed in the sandbox")

    sys.addaudithook(hook)

def _run():
    payload = json.loads(sys.stdin.read())
    nonce = payload["nonce"]
    report = sys.stdout
    code = compile(payload["code"], "<candidate>", "exec")

    def emit(index, value, error):
        report.write(nonce + " " + json.dumps([index, value, error]) + "\n")
        report.flush()

    def describe(exc):
        text = str(exc)
        return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:500]

    def text_stream(text=""):
        return io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8", write_through=True)

    _install_guard(os.getcwd())
    if payload["mode"] == "stdio":
        for index, text in enumerate(payload["inputs"]):
            sys.stdin, sys.stdout = text_stream(text), text_stream()
            captured, error = sys.stdout, None
            try:
                exec(code, {"__name__": "__main__"})
            except SystemExit:
                pass
            except BaseException as exc:
                error = describe(exc)
            sys.stdout = report
            try:
                output = captured.buffer.getvalue().decode("utf-8", "replace")
            except Exception as exc:
                output, error = "", error or describe(exc)
            emit(index, output, error)
        return
    namespace = {"__name__": "__main__"}
    setup_error = None
    try:
        exec(code, namespace)
    except SystemExit:
        pass
    except BaseException as exc:
        setup_error = describe(exc)
    index = 0
    for source, is_test in payload["statements"]:
        error = setup_error
        if error is None:
            try:
                exec(compile(source, "<tests>", "exec"), namespace)
            except BaseException as exc:
                error = describe(exc)
        if is_test:
            emit(index, error is None, error)
            index += 1

_run()
"""


@dataclass
class TestSuite:
    """Tests parsed from a ground truth: stdin/stdout pairs or assertion statements."""

    mode: str  # "stdio" or "assert"
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    statements: list[tuple[str, bool]] = field(default_factory=list)  # (source, is_assert)

    @property
    def total(self) -> int:
        """Return the number of tests."""
        if self.mode == "stdio":
            return len(self.inputs)
        return sum(is_test for _, is_test in self.statements)


def extract_code(solution_str: str) -> str:
    """Return the last ```python block, else the last fenced block, else the whole response."""
    blocks = _FENCED_PYTHON.findall(solution_str) or _FENCED_ANY.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def _as_text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def parse_tests(ground_truth: str | dict[str, Any]) -> TestSuite:
    """Return the tests of a ground truth given as a dict or its JSON string."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"code ground truth is not valid JSON ({exc}); expected "
                '{"inputs": [...], "outputs": [...]} or {"assert": "assert f(1) == 2"}'
            ) from exc
    if not isinstance(ground_truth, dict):
        raise ValueError(f"code ground truth must be a dict, got {type(ground_truth).__name__}")
    if "inputs" in ground_truth and "outputs" in ground_truth:
        inputs, outputs = list(ground_truth["inputs"]), list(ground_truth["outputs"])
        if len(inputs) != len(outputs) or not inputs:
            raise ValueError(
                f"code ground truth has {len(inputs)} inputs and {len(outputs)} outputs; "
                "give the same positive number of each"
            )
        return TestSuite("stdio", [_as_text(i) for i in inputs], [_as_text(o) for o in outputs])
    if "assert" in ground_truth:
        source = str(ground_truth["assert"])
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise ValueError(f"assertion code of the ground truth does not parse: {exc}") from exc
        statements = [
            (
                ast.get_source_segment(source, node) or ast.unparse(node),
                isinstance(node, ast.Assert),
            )
            for node in tree.body
        ]
        suite = TestSuite("assert", statements=statements)
        if suite.total == 0:
            raise ValueError("assertion code of the ground truth has no assert statement")
        return suite
    raise ValueError(
        f"code ground truth has keys {sorted(ground_truth)}; expected 'inputs' and 'outputs' "
        "(stdin/stdout pairs) or 'assert' (assertion code)"
    )


def same_output(actual: str, expected: str) -> bool:
    """Return whether two program outputs match up to trailing whitespace and final blank lines."""

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(actual) == lines(expected)


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


def run_tests(
    code: str, suite: TestSuite, *, timeout_s: float = 5.0, memory_mb: int = 1024
) -> dict[str, Any]:
    """Run a candidate against its tests in the sandbox; return the result parts."""
    nonce = secrets.token_hex(16)
    payload: dict[str, Any] = {"nonce": nonce, "code": code, "mode": suite.mode}
    if suite.mode == "stdio":
        payload["inputs"] = suite.inputs
    else:
        payload["statements"] = suite.statements
    limits = functools.partial(
        _apply_limits, math.ceil(timeout_s) + 1, memory_mb * 2**20, 16 * 2**20
    )
    with (
        tempfile.TemporaryDirectory(prefix="reward-sandbox-") as workdir,
        tempfile.TemporaryDirectory(prefix="reward-io-") as io_dir,
    ):
        out_path, err_path = Path(io_dir, "stdout"), Path(io_dir, "stderr")
        with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-X", "utf8", "-c", _HARNESS],
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
        reported = _read_reports(out_path.read_bytes(), nonce)
        stderr_tail = err_path.read_bytes()[-_MAX_ERROR_CHARS:].decode("utf-8", "replace")

    passed, error = 0, ""
    for index in range(suite.total):
        if index not in reported:
            error = error or ("timed out" if timed_out else stderr_tail.strip() or "no result")
            continue
        value, case_error = reported[index]
        ok = same_output(value, suite.outputs[index]) if suite.mode == "stdio" else value is True
        passed += int(ok and (suite.mode == "assert" or case_error is None))
        if not ok and not error:
            error = case_error or f"test {index}: wrong output"
    return {
        "score": passed / suite.total,
        "syntax_ok": 1,
        "passed": passed,
        "total": suite.total,
        "timed_out": int(timed_out),
        "error": error,
    }


def _read_reports(raw: bytes, nonce: str) -> dict[int, tuple[Any, str | None]]:
    """Return ``{test index: (value, error)}`` from the nonce-tagged lines of the harness."""
    reports: dict[int, tuple[Any, str | None]] = {}
    prefix = nonce + " "
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith(prefix):
            continue
        try:
            index, value, error = json.loads(line[len(prefix) :])
        except (ValueError, TypeError):
            continue
        reports.setdefault(int(index), (value, error))
    return reports


def compute_score(
    solution_str: str,
    ground_truth: str | dict[str, Any],
    extra_info: dict[str, Any] | None = None,
    timeout_s: float = 5.0,
    *,
    memory_mb: int = 1024,
) -> dict[str, Any]:
    """Return ``{"score", "syntax_ok", "passed", "total", "timed_out", "error"}`` for a program."""
    suite = parse_tests(ground_truth)
    code = extract_code(solution_str)
    try:
        compile(code, "<candidate>", "exec")
    except (SyntaxError, ValueError) as exc:
        line = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        return {
            "score": 0.0,
            "syntax_ok": 0,
            "passed": 0,
            "total": suite.total,
            "timed_out": 0,
            "error": f"{type(exc).__name__}: {exc.msg if isinstance(exc, SyntaxError) else exc}{line}",
        }
    return run_tests(code, suite, timeout_s=timeout_s, memory_mb=memory_mb)
