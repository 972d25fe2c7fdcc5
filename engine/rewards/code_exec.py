"""Code-execution reward (``data_source`` ``"code"``, ``"codecontests"``, ``"apps"``, ...).

The candidate program is the last fenced ```` ```python ```` block of the response (or the last
plain fence, or the whole response). It is syntax-checked with ``compile`` in this process; a
syntax error scores 0 and the error is kept in the parts. Otherwise it runs against the tests of
the ground truth, a dict or its JSON string:

- ``{"inputs": [...], "outputs": [...]}``: stdin/stdout pairs. A test passes when the program,
  run on the input, exits with status 0 and its output equals the expected one up to trailing
  whitespace on each line and blank lines at the end.
- ``{"assert": "assert f(1) == 2\\n..."}``: the program runs once, then each top-level
  statement of the assertion code in order; every ``assert`` statement is one test, the other
  statements (imports, helpers) are setup.

``score`` is the fraction of tests passed (verl's ``continuous=True`` scoring).

The boundary (``POSTTRAIN_SANDBOX=bwrap``, the default): every program runs in a bubblewrap
sandbox (``engine/rewards/sandbox.py``: own uid, no network, no host processes, read-only
minimal filesystem, empty environment, rlimits, a wall-clock kill of its whole PID namespace).
Its limits are the server's ceilings (``POSTTRAIN_SANDBOX_*``); ``extra_info`` of the row and the
reward's keyword arguments (``timeout_s``, ``memory_mb``, ``max_processes``, ``max_file_mb``,
``max_output_bytes``) may lower them, and asking for more gets the ceiling and one warning.
``timeout_s`` is the wall-clock budget of the whole candidate; tests finished before it keep
their results. Without bubblewrap the reward raises ``SandboxUnavailable`` (it fails the run);
nothing runs unsandboxed.

Why a candidate cannot forge a pass. Verdicts are made outside the candidate's process, from
what it cannot fake:

- stdio tests: each input is a separate sandbox; this process compares the program's stdout
  with the expected output, which never enters any sandbox. The only thing the program controls
  is its own output, which is what is judged.
- assertion tests: the program and the tests run in two separate sandboxes joined by two pipes.
  The program's sandbox runs its code, then answers requests ("call f with these arguments",
  "get attribute x") with the *values* it produces, serialised as plain data: None, bool, int,
  float, complex, str, bytes, and lists, tuples, sets and dicts of them; any other object stays
  in the program's sandbox and is named by a handle. The evaluator's sandbox never runs the
  candidate's code: it runs the test statements with the program's names bound to proxies,
  evaluates each ``assert`` with its own interpreter on those plain values, and reports on its
  own stdout, tagged with a nonce only it holds. So a test passes only if its expression is
  truthy when computed by trusted code from values the candidate's functions returned. Exiting
  early (``os._exit(0)``, ``SystemExit``), printing fake report lines, reading frames, ``gc``,
  ``/proc/self`` or file descriptors, or returning an object whose ``__eq__`` is always true (a
  handle is equal only to itself and has no truth value) earns nothing: the evaluator and its
  nonce are in another sandbox. An exception the program raises comes back by its builtin name
  (a test may expect a ``ValueError``), except where it would steer the test's own control
  flow: ``StopIteration`` and ``StopAsyncIteration`` come back as a ``RuntimeError`` naming them
  (as PEP 479 does in generators), like ``GeneratorExit``, ``KeyboardInterrupt``, ``SystemExit``
  and every other ``BaseException``; only the end of one of the program's own iterators is a
  ``StopIteration``. So a function that raises cannot end the test's ``all(map(...))``,
  ``filter``, ``zip`` or generator early. What a candidate does control is the values its
  functions return, which is what the tests are meant to judge. A test can pass plain values and
  handles to the program, not its own functions or objects; statements that are not asserts run
  in the evaluator, so setup code cannot set the program's globals.

``POSTTRAIN_SANDBOX=local`` is the administrator's opt-in for machines without bubblewrap:
``python -I`` subprocesses with rlimits, temporary working directories and an audit hook (PEP
578) that refuses writes outside them, new processes, signals, sockets and ``ctypes``; an
assertion suite runs the same two programs as above, as two such processes. That stops accidents
and the usual reward hacks of a policy model, those above included; it is not a security
boundary (audit hooks are not one, by their own documentation, a candidate can read the
evaluator's tests and nonce, and a stdio candidate shares an interpreter with the harness that
reports its outputs).

``reward_model.sandbox_fusion.url`` (an entry of the administrator's
``POSTTRAIN_REWARD_ENDPOINTS``) runs stdio tests on verl's SandboxFusion service instead
(``engine.rewards.sandbox_fusion``); assertion suites are judged only locally.

Where the code is: this module (the reward: pick the code, check its syntax, choose the path),
``code_tests`` (parse the ground truth, compare outputs, score the reports), ``code_sandboxed``
(the bubblewrap path: stdio runs and the two-sandbox assertion protocol), ``code_local`` (the
local guard) and ``harness/`` (the programs that run inside a sandbox, kept as files).
"""

from __future__ import annotations

import re
import time
from typing import Any

from engine import env
from engine.rewards import sandbox
from engine.rewards.code_local import run_program_local, run_tests_local
from engine.rewards.code_sandboxed import run_program_bwrap, run_tests_bwrap
from engine.rewards.code_tests import TestSuite, parse_tests, same_output
from engine.rewards.sandbox_fusion import run_tests_fusion

__all__ = [
    "TestSuite",
    "compute_score",
    "extract_code",
    "parse_tests",
    "run_program",
    "run_tests",
    "run_tests_bwrap",
    "run_tests_local",
    "same_output",
]

_FENCED_PYTHON = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_FENCED_ANY = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(solution_str: str) -> str:
    """Return the last ```python block, else the last fenced block, else the whole response."""
    blocks = _FENCED_PYTHON.findall(solution_str) or _FENCED_ANY.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def run_tests(code: str, suite: TestSuite, limits: sandbox.Limits) -> dict[str, Any]:
    """Run a candidate against its tests as ``POSTTRAIN_SANDBOX`` says; return the result parts."""
    if env.sandbox_mode() == "local":
        return run_tests_local(
            code,
            suite,
            timeout_s=limits.timeout_s,
            memory_mb=limits.memory_mb,
            max_output_bytes=limits.max_output_bytes,
        )
    return run_tests_bwrap(code, suite, limits)


def run_program(code: str, limits: sandbox.Limits, stdin: str = "") -> tuple[str, str | None, bool]:
    """Run one Python program as ``POSTTRAIN_SANDBOX`` says, under the code reward's limits;
    return (its stdout, its error or None, whether it ran out of time)."""
    if env.sandbox_mode() == "local":
        return run_program_local(
            code, stdin, timeout_s=limits.timeout_s, memory_mb=limits.memory_mb
        )
    bwrap = sandbox.check_available()
    return run_program_bwrap(
        bwrap, code.encode(), stdin, limits, time.monotonic() + limits.timeout_s
    )


def compute_score(
    solution_str: str,
    ground_truth: str | dict[str, Any],
    extra_info: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    sandbox_fusion: dict[str, Any] | None = None,
    **limits: float,
) -> dict[str, Any]:
    """Return ``{"score", "syntax_ok", "passed", "total", "timed_out", "error"}`` for a program.

    ``timeout_s`` and ``limits`` (``memory_mb``, ``max_processes``, ``max_file_mb``,
    ``max_output_bytes``), and the same keys of ``extra_info``, may lower the server's ceilings.
    ``sandbox_fusion`` (``reward_model.sandbox_fusion``: ``url``, ``max_concurrent``,
    ``memory_limit_mb``) with a url runs the tests on that allowed SandboxFusion service
    (``engine.rewards.sandbox_fusion``) instead of the local sandbox.
    """
    unknown = set(limits) - set(env.SANDBOX_CEILINGS)
    if unknown:
        raise TypeError(
            f"code reward got unknown keyword arguments {sorted(unknown)}; it accepts "
            f"{', '.join(env.SANDBOX_CEILINGS)}"
        )
    resolved = sandbox.resolve_limits(
        {"timeout_s": timeout_s, **limits},
        {k: v for k, v in (extra_info or {}).items() if k in env.SANDBOX_CEILINGS},
    )
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
    if sandbox_fusion and sandbox_fusion.get("url"):
        return run_tests_fusion(code, suite, resolved, sandbox_fusion)
    return run_tests(code, suite, resolved)
