"""Real Ray nodes for the tests, started with ``ray start`` as an operator would.

Each node gets ports and a ``--temp-dir`` of its own (short, under ``/tmp``: Ray's socket paths
must fit in 107 bytes), so it never meets another test's head (or
``scripts/dev.sh``'s), and runs in a session of its own: its daemons (GCS, raylet, dashboard,
agents) share that process group, and the workers its raylet starts are the raylet's children.
:func:`kill_node` kills exactly those processes, never ``ray stop``, which stops every Ray on the
machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from engine.env import CPU_PROCESS_ENV

RAY = Path(sys.executable).with_name("ray")
REPO = Path(__file__).resolve().parents[3]


@dataclass
class RayNode:
    """A node started by :func:`start_head` or :func:`start_node`."""

    session: int  # the process group of its daemons
    temp_dir: Path
    gcs_address: str  # the head's, which every node joins
    dashboard: str | None = None  # the job server's URL, on a head started with it


def free_port() -> int:
    """Return a TCP port that is free on this machine right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_env(path_first: Path | None = None) -> dict[str, str]:
    """Return a Ray node's environment: the basics of a host with the venv activated, no more.

    No database, Redis or Django variables: what a job's driver needs must come with the job.
    ``path_first`` goes before the venv on ``PATH`` (a job's ``python`` found there instead).
    """
    keep = ("HOME", "LANG", "TMPDIR", "LD_LIBRARY_PATH")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    path = f"{RAY.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    if path_first is not None:
        path = f"{path_first}:{path}"
    env.update(CPU_PROCESS_ENV, PATH=path, RAY_USAGE_STATS_ENABLED="0")
    return env


def _start(args: list[str], path_first: Path | None = None) -> tuple[int, Path]:
    temp_dir = Path(tempfile.mkdtemp(prefix="ptray-", dir="/tmp"))
    ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-grpc-port",
             "--dashboard-agent-listen-port", "--runtime-env-agent-port", "--metrics-export-port"]  # fmt: skip
    command = [str(RAY), "start", *args, f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    command += [f"{option}={free_port()}" for option in ports]
    with open(temp_dir / "ray-start.log", "ab") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,  # a job's entrypoint runs here, as in the image's /app
            env=node_env(path_first),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
    if code != 0:
        kill_session(process.pid)
        tail = (temp_dir / "ray-start.log").read_text()[-3000:]
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise RuntimeError(f"ray start {' '.join(args)} failed ({code}):\n{tail}")
    return process.pid, temp_dir


def start_head(
    *, num_cpus: int, dashboard: bool = False, path_first: Path | None = None
) -> RayNode:
    """Start a head node (with its dashboard and job server when ``dashboard``); ``path_first``
    goes first on its ``PATH`` (see :func:`node_env`)."""
    port = free_port()
    args = ["--head", f"--port={port}", f"--num-cpus={num_cpus}", "--node-ip-address=127.0.0.1"]
    args.append(f"--ray-client-server-port={free_port()}")
    url = None
    if dashboard:
        dashboard_port = free_port()
        args += ["--include-dashboard=true", f"--dashboard-port={dashboard_port}"]
        url = f"http://127.0.0.1:{dashboard_port}"
    else:
        args.append("--include-dashboard=false")
    return RayNode(*_start(args, path_first), f"127.0.0.1:{port}", url)


def start_node(head: RayNode, *, num_cpus: int, resources: dict[str, float]) -> RayNode:
    """Start a worker node that joins ``head`` with ``num_cpus`` CPUs and custom ``resources``."""
    args = [f"--address={head.gcs_address}", f"--num-cpus={num_cpus}"]
    args += [f"--resources={json.dumps(resources)}", "--node-ip-address=127.0.0.1"]
    return RayNode(*_start(args), head.gcs_address)


def _processes() -> dict[int, tuple[int, int]]:
    """Return ``{pid: (parent pid, process group)}`` of every live (not zombie) process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def node_pids(session: int) -> set[int]:
    """Return the daemons of a node's session and all their descendants (its workers)."""
    table = _processes()
    pids = {pid for pid, (_, group) in table.items() if group == session}
    grew = True
    while grew:
        children = {pid for pid, (parent, _) in table.items() if parent in pids} - pids
        pids |= children
        grew = bool(children)
    return pids


def kill_session(session: int) -> None:
    """SIGKILL every process of a node at once, as if its machine lost power."""
    for pid in node_pids(session):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_node(node: RayNode, timeout: float = 10.0, *, remove: bool = True) -> None:
    """Kill ``node``'s processes, wait until none is left, then remove its folder (``remove``)."""
    deadline = time.monotonic() + timeout
    while (pids := node_pids(node.session)) and time.monotonic() < deadline:
        kill_session(node.session)
        time.sleep(0.1)
    if pids:
        raise RuntimeError(f"processes {sorted(pids)} of the Ray node in {node.temp_dir} survived")
    if remove:
        shutil.rmtree(node.temp_dir, ignore_errors=True)
