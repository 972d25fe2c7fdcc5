"""Escape attempts against the bubblewrap sandbox of the code reward, with real bwrap.

Each test checks what was left outside the sandbox (files, processes, host memory), not only
the reward's return value. A stdio suite whose expected output is what a contained attack prints
doubles as proof that the attack ran. The attacks on the verdict itself (forged reports,
exceptions and objects that would pass a test without the right values, patched builtins) run
under the local guard (``mode``) too, which judges assertion tests the same way.
"""

import os
import resource
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from engine.rewards import sandbox
from engine.rewards.batch import RewardInput, score_samples
from engine.rewards.code_exec import compute_score
from engine.rewards.registry import get_reward_fn

CODE_EXEC = Path(__file__).resolve().parents[3] / "engine" / "rewards" / "code_exec.py"


def prints(expected: str) -> dict:
    return {"inputs": [""], "outputs": [expected]}


def attempts(*lines: str) -> str:
    """Return a program that runs each line and prints ``ok`` or the error type, one per line."""
    body = "".join(
        f"try:\n    {line}\n    print('ok')\nexcept BaseException as e:\n    print('no')\n"
        for line in lines
    )
    return "import os, sys, subprocess, socket, signal, builtins, _posixsubprocess\n" + body


def processes_with(marker: str) -> list[str]:
    """Return the command lines of host processes whose argv contains ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and pid != str(os.getpid()):
            found.append(cmdline)
    return found


@pytest.fixture
def targets(tmp_path):
    """Two host paths a candidate must not create: one in the test's tmp, one in /tmp."""
    paths = [tmp_path / "pwned", Path("/tmp") / f"pwned-{secrets.token_hex(8)}"]
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


@pytest.fixture(params=["bwrap", "local"])
def mode(request, monkeypatch):
    """Run the test in the bubblewrap sandbox and under the local guard."""
    monkeypatch.setenv("POSTTRAIN_SANDBOX", request.param)
    return request.param


def test_correct_programs_still_score_one():
    stdio = compute_score("print(int(input()) * 2)", {"inputs": ["2", "5"], "outputs": ["4", "10"]})
    asserts = compute_score("def f(x):\n    return [x] * 2\n", {"assert": "assert f(1) == [1, 1]"})
    assert stdio["score"] == 1.0 and asserts["score"] == 1.0, (stdio, asserts)


def test_writes_outside_the_working_folder_by_every_route(targets):
    lines = []
    for target in map(str, targets):
        folder, name = os.path.split(target)
        lines += [
            f"open({target!r}, 'w').write('x')",
            f"os.close(os.open({name!r}, os.O_CREAT | os.O_WRONLY, dir_fd=os.open({folder!r}, os.O_RDONLY)))",
            f"os.close(os.open({target!r}, os.O_CREAT | os.O_WRONLY))",
        ]
    patched = "import io; builtins.open = print; io.open({!r}, 'w').write('x')"
    lines += [patched.format(str(target)) for target in targets]
    # The host's /tmp path lands in the sandbox's own /tmp (a tmpfs that vanishes with it).
    result = compute_score(attempts(*lines), prints("no\nno\nno\nok\nok\nok\nno\nok"))
    assert result["score"] == 1.0, result
    assert [p for p in targets if p.exists()] == []


def test_programs_started_by_any_api_cannot_touch_the_host(targets):
    first, second = map(str, targets)
    lines = [
        f"subprocess.run(['touch', {first!r}], check=True)",
        f"assert os.system('touch {second}') == 0",
        f"pid = os.posix_spawn('/usr/bin/touch', ['touch', {first!r}], {{}}); assert os.waitpid(pid, 0)[1] == 0",
        "r, w = os.pipe(); pid = _posixsubprocess.fork_exec(['touch', "
        f"{second!r}], [b'/usr/bin/touch'], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, "
        "True, False, -1, None, None, None, -1, None, False); assert os.waitpid(pid, 0)[1] == 0",
        "assert subprocess.run(['true']).returncode == 0",  # starting programs inside is fine
    ]
    result = compute_score(attempts(*lines), prints("no\nok\nno\nok\nok"))  # ok: its own /tmp
    assert result["score"] == 1.0, result
    assert [p for p in targets if p.exists()] == []


def test_cannot_signal_a_host_process():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        lines = [
            f"os.kill({sleeper.pid}, signal.SIGKILL)",
            f"signal.pidfd_send_signal(os.pidfd_open({sleeper.pid}), signal.SIGKILL)",
            "os.kill(-1, signal.SIGKILL)",  # everything it may signal: only its own namespace
        ]
        result = compute_score(attempts(*lines), prints("no\nno\n"))
        time.sleep(0.2)
        assert sleeper.poll() is None, "the host process was killed"
        assert result["passed"] == 0  # the last attempt killed the candidate itself
    finally:
        sleeper.kill()
        sleeper.wait()


def test_cannot_read_the_hosts_or_its_own_secrets(monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("POSTTRAIN_LEAK_CHECK", secret)
    monkeypatch.setenv("DATABASE_URL", f"postgresql://user:{secret}@127.0.0.1/db")
    probe = (
        "import os\n"
        "seen = repr(dict(os.environ))\n"
        f"for pid in ['1', 'self', str(os.getppid()), {str(os.getpid())!r}] + os.listdir('/proc'):\n"
        "    for part in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            seen += open(f'/proc/{pid}/{part}', 'rb').read().decode('latin-1')\n"
        "        except OSError:\n"
        "            pass\n"
        f"print('FOUND' if {secret!r} in seen else 'clean')\n"
    )
    result = compute_score(probe, prints("clean"))
    assert result["score"] == 1.0, result


def test_cannot_read_the_projects_files():
    paths = [str(CODE_EXEC), "/work/main/README.md", str(Path.home() / ".bashrc"), "/etc/passwd"]
    assert CODE_EXEC.exists()
    lines = [f"open({path!r}).read()" for path in paths]
    result = compute_score(attempts(*lines), prints("no\n" * len(paths)))
    assert result["score"] == 1.0, result


def test_cannot_reach_postgres_or_redis():
    lines = [f"socket.create_connection(('127.0.0.1', {port}), timeout=1)" for port in (5432, 6379)]
    result = compute_score(attempts(*lines), prints("no\nno"))
    assert result["score"] == 1.0, result


def test_no_process_outlives_the_run():
    marker = f"987.{secrets.randbelow(10**9):09d}"
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/usr/bin/sleep', ['sleep', {marker!r}])\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "print('started')\n"
    )
    result = compute_score(daemon, prints("started"))
    assert result["score"] == 1.0, result
    assert processes_with(marker) == []


def test_forged_reports_score_zero(mode):
    forger = (
        "import gc, os, sys, re\n"
        "found = set()\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, dict):\n"
        "        found |= {v for v in obj.values() if isinstance(v, str) and re.fullmatch('[0-9a-f]{32}', v)}\n"
        "frame = sys._getframe()\n"
        "while frame:\n"
        "    found |= {v for v in frame.f_locals.values() if isinstance(v, str)}\n"
        "    frame = frame.f_back\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    for nonce in found | {'x'}:\n"
        "        for i in range(3):\n"
        "            try:\n"
        "                os.write(fd, f'{nonce} [{i}, true, null]\\n'.encode())\n"
        "            except OSError:\n"
        "                pass\n"
        "class Always:\n"
        "    __eq__ = lambda self, other: True\n"
        "    __bool__ = lambda self: True\n"
        "def f(x):\n"
        "    return Always()\n"
        "def g(x):\n"
        "    raise SystemExit(0)\n"
        "if len(sys.argv) > 5:\n"
        "    os._exit(0)\n"
    )
    tests = {"assert": "assert f(1) == 2\nassert f(2)\nassert g(1) == 1"}
    result = compute_score(forger, tests)
    assert (result["passed"], result["score"]) == (0, 0.0), result
    early_exit = compute_score("import os\nos._exit(0)\n", tests)
    assert early_exit["score"] == 0.0


def test_fork_bomb_is_contained():
    marker = f"bomb{secrets.token_hex(4)}"
    bomb = f"import os\n{marker} = 1\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    before = len(os.listdir("/proc"))
    start = time.monotonic()
    result = compute_score(bomb, prints(""), timeout_s=2.0)
    assert time.monotonic() - start < 5.0
    assert result["score"] == 0.0
    assert processes_with("/box/main.py") == []
    assert len(os.listdir("/proc")) < before + 20
    subprocess.run(["true"], check=True)  # the host can still start processes


def test_ten_gigabyte_allocation_fails_inside():
    rss_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = compute_score(attempts("bytearray(10 * 1024**3)"), prints("no"))
    assert result["score"] == 1.0, result
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss - rss_before < 2**20  # KiB


def test_infinite_loop_times_out(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SANDBOX_TIMEOUT_S", "1.5")
    start = time.monotonic()
    result = compute_score("while True:\n    pass\n", {"assert": "assert f() == 1"})
    assert time.monotonic() - start < 1.5 + 1.0
    assert result["timed_out"] == 1 and result["score"] == 0.0


def test_a_gigabyte_of_output_is_cut_off():
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    flood = "import sys\nchunk = b'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.buffer.write(chunk)\n"
    result = compute_score(flood, prints("x"), max_output_bytes=2**16)
    assert time.monotonic() - start < 5.0
    assert result["score"] == 0.0 and result["error"] == "output over 65536 bytes"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 64 * 1024  # KiB


def test_kwargs_cannot_raise_the_timeout_ceiling(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SANDBOX_TIMEOUT_S", "1")
    start = time.monotonic()
    result = compute_score("import time\ntime.sleep(10)\nprint(1)", prints("1"), timeout_s=30)
    assert time.monotonic() - start < 2.5
    assert result["timed_out"] == 1 and result["score"] == 0.0


def test_extra_info_can_lower_the_memory_limit():
    program = "x = bytearray(300 * 1024**2)\nprint('ok')"
    assert compute_score(program, prints("ok"))["score"] == 1.0
    lowered = compute_score(program, prints("ok"), {"memory_mb": 200})
    assert lowered["score"] == 0.0 and "MemoryError" in lowered["error"]


def test_missing_bubblewrap_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SANDBOX_BWRAP", "/nonexistent/bwrap")
    with pytest.raises(sandbox.SandboxUnavailable, match=r"apt-get install bubblewrap"):
        compute_score("print(1)", prints("1"))
    # Not swallowed as one failed sample: it fails the batch, hence the run.
    sample = RewardInput("code", "print(1)", prints("1"), None)
    with pytest.raises(sandbox.SandboxUnavailable, match="POSTTRAIN_SANDBOX=local"):
        score_samples(get_reward_fn("code_exec"), [sample])


def test_local_opt_in_runs_without_bubblewrap(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SANDBOX_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setenv("POSTTRAIN_SANDBOX", "local")
    result = compute_score("print(int(input()) + 1)", {"inputs": ["1"], "outputs": ["2"]})
    assert result["score"] == 1.0, result


# -- a pass only from values the candidate returned, over the tests' own iteration -----------------

# Each assert holds for f(x) == 2 * x and g(n) == [0, 2, ..., 2n - 2]; each iterates in its own
# way (map, filter, any/all, comprehensions, generators, zip, next with a default), so an
# exception that ended the test's iteration early would make some of them vacuously true.
ITERATING_TESTS = """\
assert all(map(lambda x: f(x) == 2 * x, [1, 2, 3]))
assert not any(map(lambda x: f(x) != 2 * x, [1, 2, 3]))
assert list(filter(lambda x: f(x) != 2 * x, [1, 2, 3])) == []
assert next(filter(lambda x: f(x) != 2 * x, [1, 2, 3]), None) is None
assert all(f(x) == 2 * x for x in [1, 2, 3])
assert all(f(x) == 2 * x for x in (y for y in [1, 2, 3]))
assert [f(x) for x in [1, 2, 3]] == [2, 4, 6]
assert {x: f(x) for x in [1, 2]} == {1: 2, 2: 4}
assert all(a == b for a, b in zip(map(f, [1, 2, 3]), [2, 4, 6]))
assert sum(map(f, [1, 2, 3])) == 12
assert all(a == 2 * b for a, b in zip(g(3), [0, 1, 2], strict=True))
assert list(g(3)) == [0, 2, 4]
assert [v for v in g(2)] == [0, 2]
"""
ITERATING_TOTAL = ITERATING_TESTS.count("assert ")
ALWAYS = (
    "class Always:\n"
    "    __eq__ = lambda self, other: True\n"
    "    __ne__ = lambda self, other: False\n"
    "    __bool__ = lambda self: True\n"
    "    __hash__ = lambda self: 0\n"
    "    __index__ = lambda self: 0\n"
    "    __int__ = lambda self: 0\n"
    "    __iter__ = lambda self: iter([self] * 3)\n"
    "    __len__ = lambda self: 3\n"
    "    __add__ = __radd__ = lambda self, other: 12\n"
)
HOSTILE_RESULTS = {
    "StopIteration": "raise StopIteration",
    "StopIteration with a value": "raise StopIteration(2 * x)",
    "StopAsyncIteration": "raise StopAsyncIteration",
    "GeneratorExit": "raise GeneratorExit",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "SystemExit": "raise SystemExit(0)",
    "a BaseException subclass": "raise type('Out', (BaseException,), {})()",
    "its own class named StopIteration": "raise type('StopIteration', (Exception,), {})()",
    "next() of an empty iterator": "return next(iter([]))",
    "an always-equal object": "return Always()",
}


def hostile(result: str) -> str:
    """Return f and g that both end in ``result`` (a ``raise`` or ``return`` of x and n)."""
    return f"{ALWAYS}def f(x):\n    {result}\ndef g(n):\n    x = n\n    {result}\n"


def test_the_iterating_tests_pass_for_a_correct_candidate(mode):
    code = (
        "def f(x):\n"
        "    if x < 0:\n"
        "        raise ValueError(x)\n"
        "    return 2 * x\n"
        "def g(n):\n"
        "    yield from (2 * i for i in range(n))\n"
    )
    expects_an_error = "try:\n    f(-1)\nexcept ValueError:\n    raised = True\nassert raised\n"
    result = compute_score(code, {"assert": ITERATING_TESTS + expects_an_error})
    assert (result["passed"], result["total"]) == (ITERATING_TOTAL + 1,) * 2, result


@pytest.mark.parametrize("result", HOSTILE_RESULTS.values(), ids=HOSTILE_RESULTS.keys())
def test_an_exception_or_object_from_the_candidate_never_passes_an_iterating_test(mode, result):
    scored = compute_score(hostile(result), {"assert": ITERATING_TESTS})
    assert (scored["passed"], scored["score"]) == (0, 0.0), scored


@pytest.mark.parametrize(
    "iterable",
    [
        "class Bad:\n    def __iter__(self):\n        raise StopIteration\n",
        "class Bad:\n    def __iter__(self):\n        return self\n"
        "    def __next__(self):\n        raise StopAsyncIteration\n",
        "def Bad():\n    yield 0\n    raise StopIteration\n",  # PEP 479: a RuntimeError
    ],
    ids=["__iter__ raises StopIteration", "__next__ raises StopAsyncIteration", "a generator"],
)
def test_a_candidates_iterable_that_raises_never_passes_an_iterating_test(mode, iterable):
    code = f"{iterable}def g(n):\n    return Bad()\n"
    tests = "assert all(map(lambda n: list(g(n)) == [0, 2][:n], [1, 2]))"
    scored = compute_score(code, {"assert": tests})
    assert scored["passed"] == 0, scored


def test_patched_builtins_do_not_reach_the_tests(mode):
    patcher = (
        "import builtins\n"
        "builtins.all = builtins.any = lambda *args: True\n"
        "builtins.map = lambda *args: iter([])\n"
        "builtins.AssertionError = type('AssertionError', (Exception,), {})\n"
        "def f(x):\n"
        "    import builtins\n"
        "    builtins.all = lambda *args: True\n"
        "    return 0\n"
        "def g(n):\n"
        "    return []\n"
    )
    scored = compute_score(patcher, {"assert": ITERATING_TESTS})
    assert (scored["passed"], scored["score"]) == (0, 0.0), scored
