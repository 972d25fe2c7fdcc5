"""Escape attempts against the bubblewrap sandbox of the code reward, with real bwrap.

Each test checks what was left outside the sandbox (files, processes, host memory), not only
the reward's return value. A stdio suite whose expected output is what a contained attack prints
doubles as proof that the attack ran.
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


def test_forged_reports_score_zero():
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
