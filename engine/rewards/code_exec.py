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
  nonce are in another sandbox. What a candidate does control is the values its functions
  return, which is what the tests are meant to judge. A test can pass plain values and handles to
  the program, not its own functions or objects; statements that are not asserts run in the
  evaluator, so setup code cannot set the program's globals.

``POSTTRAIN_SANDBOX=local`` is the administrator's opt-in for machines without bubblewrap: one
``python -I`` subprocess per candidate, rlimits, a temporary working directory and an audit hook
(PEP 578) that refuses writes outside it, new processes, signals, sockets and ``ctypes``. That
stops accidents and the usual reward hacks of a policy model; it is not a security boundary
(audit hooks are not one, by their own documentation, and the candidate shares an interpreter
with the harness that reports its results).
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import env
from engine.rewards import sandbox

_FENCED_PYTHON = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_FENCED_ANY = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_MAX_ERROR_CHARS = 500

# POSTTRAIN_SANDBOX=local only. It reads the payload, installs the audit hook, runs the tests
# and reports one nonce-tagged JSON line per test on its real stdout.
_LOCAL_HARNESS = r"""
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
    with (
        tempfile.TemporaryDirectory(prefix="reward-sandbox-") as workdir,
        tempfile.TemporaryDirectory(prefix="reward-io-") as io_dir,
    ):
        out_path, err_path = Path(io_dir, "stdout"), Path(io_dir, "stderr")
        with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-X", "utf8", "-c", _LOCAL_HARNESS],
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
    return _score(suite, reported, timed_out, stderr_tail.strip())


def _score(
    suite: TestSuite, reported: dict[int, tuple[Any, str | None]], timed_out: bool, fallback: str
) -> dict[str, Any]:
    """Return the result parts from ``{test index: (value, error)}``."""
    passed, error = 0, ""
    for index in range(suite.total):
        if index not in reported:
            error = error or ("timed out" if timed_out else fallback or "no result")
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


# Both sandboxes of an assertion suite: plain values as JSON, anything else as a handle. The
# program's side converts subclasses (a namedtuple is sent as a tuple); the evaluator's side
# trusts nothing it decodes.
_CODEC = r"""
import json

def encode(value, handle, loose=False, depth=0):
    if depth > 64:
        raise ValueError("value nested too deeply to send")
    def e(v):
        return encode(v, handle, loose, depth + 1)
    kind = type(value)
    if loose and kind not in (bool, int, float, str):
        for base in (bool, int, float, str, list, tuple, dict, frozenset, set, bytes):
            if isinstance(value, base):
                kind, value = base, base(value)
                break
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if abs(value) < float("inf") else {"f": repr(value)}
    if kind is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is list:
        return [e(v) for v in value]
    if kind is tuple:
        return {"t": [e(v) for v in value]}
    if kind is set:
        return {"s": [e(v) for v in value]}
    if kind is frozenset:
        return {"z": [e(v) for v in value]}
    if kind is dict:
        return {"d": [[e(k), e(v)] for k, v in value.items()]}
    return {"h": handle(value)}

def decode(data, remote, depth=0):
    if depth > 64:
        raise ValueError("value nested too deeply")
    def d(v):
        return decode(v, remote, depth + 1)
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [d(v) for v in data]
    ((tag, body),) = data.items()
    if tag == "f":
        return float(str(body))
    if tag == "c":
        return complex(float(str(body[0])), float(str(body[1])))
    if tag == "b":
        return bytes.fromhex(str(body))
    if tag == "h":
        return remote(int(body))
    items = [d(v) for v in list(body)]
    if tag == "t":
        return tuple(items)
    if tag == "s":
        return set(items)
    if tag == "z":
        return frozenset(items)
    if tag == "d":
        return {k: v for k, v in items}
    raise ValueError("unknown value tag " + repr(tag))
"""

# The program's sandbox: run the candidate, then answer the evaluator's requests with values.
_PROGRAM_SERVER = (
    _CODEC
    + r"""
import builtins, os, sys
requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
null = os.open("/dev/null", os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
objects = []

def handle(value):
    objects.append(value)
    return len(objects) - 1

def reply(message):
    replies.write(json.dumps(message).encode() + b"\n")
    replies.flush()

def failure(exc):
    return {"err": [type(exc).__name__, str(exc)[:500]]}

namespace = {"__name__": "__main__", "__builtins__": builtins}
try:
    with open("/box/main.py", encoding="utf-8") as f:
        exec(compile(f.read(), "<candidate>", "exec"), namespace)
except SystemExit:
    pass
except BaseException as exc:
    reply(failure(exc))
    os._exit(0)
reply({"names": [name for name in namespace if not name.startswith("__")]})

def arg(value):
    return decode(value, objects.__getitem__)

ops = {
    "global": lambda r: namespace[r["name"]],
    "call": lambda r: objects[r["h"]](*map(arg, r["args"]), **{k: arg(v) for k, v in r["kw"].items()}),
    "getattr": lambda r: getattr(objects[r["h"]], r["name"]),
    "iter": lambda r: iter(objects[r["h"]]),
    "next": lambda r: next(objects[r["h"]]),
    "len": lambda r: len(objects[r["h"]]),
    "getitem": lambda r: objects[r["h"]][arg(r["key"])],
    "contains": lambda r: arg(r["item"]) in objects[r["h"]],
    "repr": lambda r: repr(objects[r["h"]]),
}
for line in requests:
    try:
        request = json.loads(line)
        message = {"ok": encode(ops[request["op"]](request), handle, loose=True)}
    except BaseException as exc:
        message = failure(exc)
    reply(message)
"""
)

# The evaluator's sandbox: never runs candidate code. It runs the test statements with the
# program's names bound to proxies and reports each assert on its own stdout.
_EVALUATOR = (
    _CODEC
    + r"""
import builtins, os, sys
with open("/box/tests.json", encoding="utf-8") as f:
    payload = json.load(f)
report = os.fdopen(os.dup(1), "w")
null = os.open("/dev/null", os.O_RDWR)
os.dup2(null, 1)
replies, requests = os.fdopen(0, "rb"), os.fdopen(int(sys.argv[1]), "wb")
limit = payload["max_reply_bytes"]
PLAIN = "plain values (None, bool, numbers, str, bytes, list, tuple, dict, set)"

class ProgramGone(Exception):
    pass

def receive():
    line = replies.readline(limit + 1)
    if not line.endswith(b"\n"):
        raise ProgramGone("the program ended, or sent a value over %d bytes" % limit)
    return json.loads(line)

def rpc(op, **fields):
    try:
        requests.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        requests.flush()
    except OSError:
        raise ProgramGone("the program ended") from None
    message = receive()
    if "ok" in message:
        return decode(message["ok"], Remote)
    name, text = message["err"]
    kind = getattr(builtins, str(name), None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            error = kind(str(text))
        except Exception:
            error = None
        if error is not None:
            raise error
    raise RuntimeError("%s: %s" % (name, text))

def send(value):
    def handle(v):
        if isinstance(v, Remote):
            return object.__getattribute__(v, "_id")
        raise TypeError("a test can pass the program only %s, not %s" % (PLAIN, type(v).__name__))
    return encode(value, handle)

class Remote:
    __slots__ = ("_id",)
    def __init__(self, ident):
        object.__setattr__(self, "_id", ident)
    def __call__(self, *args, **kwargs):
        return rpc("call", h=self._id, args=[send(a) for a in args],
                   kw={k: send(v) for k, v in kwargs.items()})
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return rpc("getattr", h=self._id, name=name)
    def __iter__(self):
        return rpc("iter", h=self._id)
    def __next__(self):
        return rpc("next", h=self._id)
    def __len__(self):
        return rpc("len", h=self._id)
    def __getitem__(self, key):
        return rpc("getitem", h=self._id, key=send(key))
    def __contains__(self, item):
        return rpc("contains", h=self._id, item=send(item))
    def __repr__(self):
        return str(rpc("repr", h=self._id))
    def __bool__(self):
        raise TypeError("a test judges only " + PLAIN + "; the program returned another object")

try:
    first = receive()
    names = set(first["names"]) if "names" in first else set()
    setup_error = None if "names" in first else "%s: %s" % tuple(first["err"])
except Exception as exc:
    names, setup_error = set(), "the program exited before its tests ran (%s)" % exc

class Namespace(dict):
    def __missing__(self, name):
        if name in names:
            try:
                return rpc("global", name=name)
            except KeyError:
                pass
        raise KeyError(name)

namespace = Namespace(__name__="__main__", __builtins__=builtins)
index = 0
for source, is_test in payload["statements"]:
    error = setup_error
    if error is None:
        try:
            exec(compile(source, "<tests>", "exec"), namespace)
        except ProgramGone as exc:
            error = setup_error = str(exc)
        except BaseException as exc:
            text = str(exc)
            error = ("%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__)[:500]
    if is_test:
        report.write(payload["nonce"] + " " + json.dumps([index, error is None, error]) + "\n")
        report.flush()
        index += 1
"""
)


def _python_argv(script: str, *args: str) -> list[str]:
    return [sandbox.interpreter(), "-I", "-B", "-X", "utf8", script, *args]


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:_MAX_ERROR_CHARS] if lines else ""


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
    reported: dict[int, tuple[Any, str | None]] = {}
    timed_out = False
    for index, text in enumerate(suite.inputs):
        if time.monotonic() >= deadline:
            timed_out = True
            break
        box = sandbox.Sandbox(bwrap, {"/box/main.py": code}, limits, _python_argv("/box/main.py"))
        result = box.run(text.encode(), deadline)
        error = None
        if result.output_overflow:
            error = f"output over {int(limits.max_output_bytes)} bytes"
        elif result.timed_out:
            timed_out = True
            error = "timed out"
        elif result.returncode != 0:
            error = _last_line(result.stderr) or f"exit status {result.returncode}"
        reported[index] = (result.stdout.decode("utf-8", "replace"), error)
        if timed_out:
            break
    return _score(suite, reported, timed_out, "")


def _run_asserts(
    bwrap: str, code: bytes, suite: TestSuite, limits: sandbox.Limits, deadline: float
) -> dict[str, Any]:
    """Run the program and the evaluator in two sandboxes joined by pipes; read its reports."""
    nonce = secrets.token_hex(16)
    tests = {
        "nonce": nonce,
        "statements": suite.statements,
        "max_reply_bytes": int(limits.max_output_bytes),
    }
    request_r, request_w = os.pipe()  # evaluator -> program
    reply_r, reply_w = os.pipe()  # program -> evaluator
    program = evaluator = None
    try:
        program = sandbox.Sandbox(
            bwrap,
            {"/box/server.py": _PROGRAM_SERVER.encode(), "/box/main.py": code},
            limits,
            _python_argv("/box/server.py"),
            stdin=request_r,
            stdout=reply_w,
            stderr=subprocess.DEVNULL,
        )
        evaluator = sandbox.Sandbox(
            bwrap,
            {
                "/box/evaluator.py": _EVALUATOR.encode(),
                "/box/tests.json": json.dumps(tests).encode(),
            },
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
    reported = _read_reports(result.stdout, nonce)
    return _score(suite, reported, result.timed_out, _last_line(result.stderr))


def run_tests(code: str, suite: TestSuite, limits: sandbox.Limits) -> dict[str, Any]:
    """Run a candidate against its tests as ``POSTTRAIN_SANDBOX`` says; return the result parts."""
    if env.sandbox_mode() == "local":
        return run_tests_local(code, suite, timeout_s=limits.timeout_s, memory_mb=limits.memory_mb)
    return run_tests_bwrap(code, suite, limits)


def compute_score(
    solution_str: str,
    ground_truth: str | dict[str, Any],
    extra_info: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    **limits: float,
) -> dict[str, Any]:
    """Return ``{"score", "syntax_ok", "passed", "total", "timed_out", "error"}`` for a program.

    ``timeout_s`` and ``limits`` (``memory_mb``, ``max_processes``, ``max_file_mb``,
    ``max_output_bytes``), and the same keys of ``extra_info``, may lower the server's ceilings.
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
    return run_tests(code, suite, resolved)
