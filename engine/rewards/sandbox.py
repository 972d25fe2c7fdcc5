"""Run an untrusted program in a bubblewrap sandbox, with limits from the server's settings.

The boundary is the kernel's, set up by bubblewrap (``bwrap``, Debian package ``bubblewrap``)
for every program run:

- its own PID, network, IPC, UTS and cgroup namespaces: it sees only its own processes, has only
  an unconfigured loopback (no route to PostgreSQL, Redis or anything else) and cannot signal
  a process outside;
- an unprivileged uid: 65534 with no capabilities and ``no_new_privs``. When the server runs as
  root, bwrap builds the sandbox as root without a user namespace and a launcher switches to host
  uid 65534 before anything else runs (a user namespace would map the sandbox to host uid 0,
  which the kernel exempts from ``RLIMIT_NPROC``); otherwise bwrap maps uid 65534 in a user
  namespace onto the server's uid and forbids nested user namespaces (``--disable-userns``);
- a read-only root holding only ``/usr`` and the Python installation (``sys.base_prefix``),
  the files given to the program under ``/box``, a fresh ``/proc`` and a minimal ``/dev``; a
  size-capped tmpfs ``/tmp`` as working folder, ``HOME`` and ``TMPDIR``; nothing of the project,
  the virtualenv, ``/home``, ``/root``, ``/work``, the host's ``/tmp`` or ``/etc``;
- an empty environment apart from ``HOME``, ``TMPDIR``, ``PATH`` and the locale (bwrap itself is
  started with an empty environment, since the sandbox's PID 1 is bwrap);
- rlimits set by the launcher before the program runs: CPU seconds, address space, processes
  and threads, file size, open files, no core dumps;
- a wall-clock deadline after which the sandbox's PID 1 is killed, which makes the kernel kill
  every process of its PID namespace (``setsid`` or double forks do not escape it);
- output read back capped: stdout beyond ``max_output_bytes`` kills the run, stderr is kept up
  to 64 KiB and then no longer read.

What it does not stop: the program still shares the kernel (a kernel exploit escapes any
namespace sandbox) and CPU time within its limits. When the server runs as root, the sandbox
cannot forbid nested user namespaces (bwrap needs its own user namespace for that), and
``RLIMIT_NPROC`` counts every process of host uid 65534 together, so concurrent sandboxes share
that budget. Where bubblewrap is missing or cannot create namespaces, ``SandboxUnavailable``
says so; nothing falls back to a weaker guard unless ``POSTTRAIN_SANDBOX=local`` is set.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from engine import env

logger = logging.getLogger(__name__)

SANDBOX_UID = 65534
MAX_STDERR_BYTES = 64 * 1024
_MAX_OPEN_FILES = 256
_warned: set[tuple[str, float]] = set()
_probed: dict[tuple[str, str], str | None] = {}

# Runs first in the sandbox (``python -I -S -c``), then becomes the program with ``execv``.
_LAUNCHER = r"""
import os, resource, sys
cpu, memory, processes, file_size, open_files = map(int, sys.argv[1:6])
if os.getuid() == 0:
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
R = resource
for limit, value in ((R.RLIMIT_CPU, cpu), (R.RLIMIT_AS, memory), (R.RLIMIT_NPROC, processes),
                     (R.RLIMIT_FSIZE, file_size), (R.RLIMIT_NOFILE, open_files), (R.RLIMIT_CORE, 0)):
    hard = resource.getrlimit(limit)[1]
    value = value if hard == R.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (value, value))
with open("/proc/self/status") as status:
    caps = [line for line in status if line.startswith(("CapPrm", "CapEff", "NoNewPrivs"))]
if os.getuid() == 0 or any(line.split()[1].strip("0") not in ("", "1") for line in caps):
    os.write(2, b"sandbox launcher: still privileged, refusing to run the program\n")
    os._exit(125)
os.execv(sys.argv[6], sys.argv[6:])
"""


class SandboxUnavailable(RuntimeError):
    """Bubblewrap is missing or cannot build a sandbox on this machine; no program was run."""


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use; each at most the server's ceiling."""

    timeout_s: float
    memory_mb: float
    max_processes: float
    max_file_mb: float
    max_output_bytes: float


@dataclass
class RunResult:
    """What came back from one sandboxed program."""

    stdout: bytes
    stderr: bytes
    returncode: int | None
    timed_out: bool
    output_overflow: bool


def resolve_limits(*requests: Mapping[str, Any] | None) -> Limits:
    """Return the ceilings of ``POSTTRAIN_SANDBOX_*``, lowered by any request that asks for less.

    A request above a ceiling gets the ceiling; it is logged once per (setting, value).
    """
    limits = env.sandbox_ceilings()
    for request in requests:
        for key, value in (request or {}).items():
            if key not in limits or value is None:
                continue
            wanted = float(value)
            if not wanted > 0:
                raise ValueError(f"sandbox limit {key}={value!r} must be a positive number")
            if wanted > limits[key] and (key, wanted) not in _warned:
                _warned.add((key, wanted))
                variable = env.SANDBOX_CEILINGS[key][0]
                logger.warning(
                    "code reward asked for %s=%s, above the server's ceiling %s; using the "
                    "ceiling (raise %s to allow more)",
                    key,
                    value,
                    limits[key],
                    variable,
                )
            limits[key] = min(limits[key], wanted)
    return Limits(**limits)


def interpreter() -> str:
    """Return the base Python interpreter (outside any virtualenv) that the sandbox runs."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _refusal(reason: str) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"the code-execution reward runs candidate programs only in a bubblewrap sandbox and "
        f"{reason}; install it (apt-get install bubblewrap) on a kernel that allows user "
        "namespaces, or set POSTTRAIN_SANDBOX=local to accept the weaker in-process guard"
    )


def _filesystem_args() -> list[str]:
    """Return the bwrap arguments for the read-only root: /usr, the Python prefix, /proc, /dev."""
    python = interpreter()
    prefixes = {
        "/usr",
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(python)),
    }
    binds = sorted(
        p for p in map(os.path.realpath, prefixes) if p == "/usr" or not p.startswith("/usr/")
    )
    args: list[str] = []
    made: set[str] = set()
    for path in binds:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):  # parents the program must be able to traverse
            parent = "/" + "/".join(parts[:depth])
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", path, path]
    for top in ("/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args + ["--proc", "/proc", "--dev", "/dev"]


def bwrap_argv(
    bwrap: str, files: Mapping[str, int], limits: Limits, program: Sequence[str]
) -> list[str]:
    """Return the command line that runs ``program`` in a sandbox holding ``files`` (dest -> fd)."""
    if os.geteuid() == 0:
        isolation = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        isolation += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        isolation += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]  # for the launcher
    else:
        isolation = ["--unshare-all", "--unshare-user", "--disable-userns"]
        isolation += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    box = ["--perms", "0755", "--dir", "/box"]
    for dest, fd in files.items():
        box += ["--perms", "0444", "--ro-bind-data", str(fd), dest]
    tmp_bytes = int(limits.max_file_mb * 2**20)
    launcher = [
        interpreter(), "-I", "-S", "-c", _LAUNCHER,
        str(math.ceil(limits.timeout_s) + 1),
        str(int(limits.memory_mb * 2**20)),
        str(int(limits.max_processes)),
        str(tmp_bytes),
        str(_MAX_OPEN_FILES),
    ]  # fmt: skip
    return [
        bwrap, *isolation, "--die-with-parent", "--new-session", "--hostname", "sandbox",
        *_filesystem_args(), *box,
        "--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp",
        "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp",
        "--clearenv", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
        "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
        "--info-fd", "{info_fd}",
        *launcher, *program,
    ]  # fmt: skip


def check_available() -> str:
    """Return the bwrap path after one probe run per process; raise ``SandboxUnavailable``."""
    bwrap = env.sandbox_bwrap_path()
    if not bwrap or not os.access(bwrap, os.X_OK):
        raise _refusal(f"bubblewrap is not installed (no executable at {bwrap or 'bwrap on PATH'})")
    key = (bwrap, str(os.geteuid()))
    if key not in _probed:
        probe = Sandbox(bwrap, {}, resolve_limits(), [interpreter(), "-I", "-c", "pass"])
        result = probe.run(b"")
        error = result.stderr.decode("utf-8", "replace").strip()[-300:]
        _probed[key] = (
            None if result.returncode == 0 else (error or f"exit status {result.returncode}")
        )
    if _probed[key] is not None:
        raise _refusal(f"bubblewrap ({bwrap}) could not start a sandbox here: {_probed[key]}")
    return bwrap


class Sandbox:
    """One program in one bubblewrap sandbox: start it, feed stdin, read capped output, kill it."""

    def __init__(
        self,
        bwrap: str,
        files: Mapping[str, bytes],
        limits: Limits,
        program: Sequence[str],
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.limits = limits
        fds = {}
        for dest, data in files.items():
            fd = os.memfd_create("box", 0)
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            fds[dest] = fd
        info_r, info_w = os.pipe()
        argv = [
            a.replace("{info_fd}", str(info_w)) for a in bwrap_argv(bwrap, fds, limits, program)
        ]
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is None else stdin,
                stdout=subprocess.PIPE if stdout is None else stdout,
                stderr=subprocess.PIPE if stderr is None else stderr,
                env={},
                pass_fds=(*fds.values(), info_w, *pass_fds),
                close_fds=True,
            )
        finally:
            for fd in (*fds.values(), info_w):
                os.close(fd)
        self._info = os.fdopen(info_r, "rb")
        self._pidfd: int | None = None

    def _namespace_pidfd(self) -> int | None:
        """Return a pidfd of the sandbox's PID 1 (from bwrap's info fd), once it is known."""
        if self._pidfd is None:
            selector = selectors.DefaultSelector()
            selector.register(self._info, selectors.EVENT_READ)
            ready = selector.select(timeout=2.0)  # bwrap writes it as soon as PID 1 exists
            selector.close()
            with contextlib.suppress(OSError, ValueError, KeyError):
                info = json.loads(os.read(self._info.fileno(), 4096) if ready else b"{}")
                self._pidfd = os.pidfd_open(int(info["child-pid"]))
        return self._pidfd

    def kill(self) -> None:
        """Kill the sandbox's PID 1, hence every process in it, and wait until they are gone."""
        pidfd = self._namespace_pidfd() if self.proc.poll() is None else self._pidfd
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        if pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            selector = selectors.DefaultSelector()
            selector.register(pidfd, selectors.EVENT_READ)
            selector.select(timeout=5.0)  # readable once PID 1, the namespace's last, has exited
            selector.close()
            os.close(pidfd)
            self._pidfd = None
        self.proc.wait()
        self._info.close()

    def run(self, stdin_data: bytes | None, deadline: float | None = None) -> RunResult:
        """Feed ``stdin_data``, collect capped stdout/stderr until exit or the deadline, kill."""
        deadline = deadline or time.monotonic() + self.limits.timeout_s
        if stdin_data is not None and self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.write(stdin_data)
            self.proc.stdin.close()
        streams = {"stdout": self.proc.stdout, "stderr": self.proc.stderr}
        out, timed_out, overflow = collect(
            {k: v for k, v in streams.items() if v is not None},
            deadline,
            {"stdout": int(self.limits.max_output_bytes), "stderr": MAX_STDERR_BYTES},
            kill_on_overflow={"stdout"},
        )
        returncode = None
        if not timed_out and not overflow:
            with contextlib.suppress(subprocess.TimeoutExpired):
                returncode = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            timed_out = returncode is None
        self.kill()
        return RunResult(
            out.get("stdout", b""), out.get("stderr", b""), returncode, timed_out, overflow
        )


def collect(
    streams: Mapping[str, IO[bytes]],
    deadline: float,
    caps: Mapping[str, int],
    *,
    kill_on_overflow: set[str],
) -> tuple[dict[str, bytes], bool, bool]:
    """Read ``streams`` until all close or the deadline; return (data, timed out, overflowed).

    A stream in ``kill_on_overflow`` that passes its cap stops the collection (the caller kills
    the sandbox); any other stream is kept up to its cap and then closed unread.
    """
    chunks: dict[str, list[bytes]] = {name: [] for name in streams}
    sizes = dict.fromkeys(streams, 0)
    selector = selectors.DefaultSelector()
    for name, stream in streams.items():
        selector.register(stream, selectors.EVENT_READ, name)
    timed_out = overflow = False
    try:
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in selector.select(timeout=left):
                name = key.data
                data = os.read(key.fd, 65536)
                if data:
                    room = caps[name] - sizes[name]
                    chunks[name].append(data[: max(room, 0)])
                    sizes[name] += len(data)
                if not data or sizes[name] > caps[name]:
                    selector.unregister(key.fileobj)
                    if data and name in kill_on_overflow:
                        overflow = True
                    elif data:
                        key.fileobj.close()  # type: ignore[union-attr]
            if overflow:
                break
    finally:
        selector.close()
    return {name: b"".join(parts) for name, parts in chunks.items()}, timed_out, overflow
