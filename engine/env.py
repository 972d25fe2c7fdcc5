"""Process environment for the engine: the data directory and CPU thread settings.

Nothing here is read at import time; call the functions when a value is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DATA_DIR = Path.home() / ".cache" / "posttrain-studio"

# Environment every torch or Ray process on a shared CPU machine should start with.
# Without OMP_NUM_THREADS=1 two torch processes sharing 2 cores ran a tiny model ~100x slower;
# Ray 2.60 enables token auth by default, which makes `ray status` fail on a local head.
CPU_PROCESS_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_AUTH_MODE": "disabled",
}


def data_dir() -> Path:
    """Return the directory for checkpoints, uploads and caches (``POSTTRAIN_DATA_DIR``)."""
    path = Path(os.environ.get("POSTTRAIN_DATA_DIR") or DEFAULT_DATA_DIR).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def apply_cpu_process_env(num_threads: int | None = None) -> None:
    """Set the thread and Ray variables for this process and its children, and torch's threads.

    Values already present in the environment win, so a user can still raise the thread count.
    """
    for key, value in CPU_PROCESS_ENV.items():
        os.environ.setdefault(key, value)
    import torch

    threads = num_threads or int(os.environ["OMP_NUM_THREADS"])
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's random generators (every rank starts identical)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


# The code-execution reward's sandbox (engine/rewards/sandbox.py). Each ceiling is the most a
# dataset row or a reward's keyword arguments may ask for; they may ask for less.
SANDBOX_MODES = ("bwrap", "local")
SANDBOX_CEILINGS = {
    "timeout_s": ("POSTTRAIN_SANDBOX_TIMEOUT_S", 5.0),
    "memory_mb": ("POSTTRAIN_SANDBOX_MEMORY_MB", 1024),
    "max_processes": ("POSTTRAIN_SANDBOX_MAX_PROCESSES", 32),
    "max_file_mb": ("POSTTRAIN_SANDBOX_MAX_FILE_MB", 16),
    "max_output_bytes": ("POSTTRAIN_SANDBOX_MAX_OUTPUT_BYTES", 1 << 20),
}


def sandbox_mode() -> str:
    """Return how candidate programs run (``POSTTRAIN_SANDBOX``): ``bwrap`` or ``local``."""
    mode = os.environ.get("POSTTRAIN_SANDBOX") or "bwrap"
    if mode not in SANDBOX_MODES:
        raise ValueError(
            f"POSTTRAIN_SANDBOX={mode!r} is not a sandbox mode; set it to 'bwrap' (default) or "
            "'local' (the weaker in-process guard, for machines without bubblewrap)"
        )
    return mode


def sandbox_bwrap_path() -> str | None:
    """Return the bubblewrap executable (``POSTTRAIN_SANDBOX_BWRAP``, else ``bwrap`` on PATH)."""
    import shutil

    return os.environ.get("POSTTRAIN_SANDBOX_BWRAP") or shutil.which("bwrap")


def sandbox_ceilings() -> dict[str, float]:
    """Return the sandbox's limits from ``POSTTRAIN_SANDBOX_*`` (see ``SANDBOX_CEILINGS``)."""
    ceilings: dict[str, float] = {}
    for key, (variable, default) in SANDBOX_CEILINGS.items():
        raw = os.environ.get(variable)
        try:
            value = float(raw) if raw else float(default)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ValueError(f"{variable}={raw!r} must be a positive number (default {default})")
        ceilings[key] = value
    return ceilings
