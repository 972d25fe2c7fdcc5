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
