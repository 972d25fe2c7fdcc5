"""Build an asset once into ``<base>/<key>/`` and share it between processes.

The embedded tiny model, its reward model and the tiny tool tasks are built on first use and kept
under the data folder, keyed by a hash of what the build depends on. Two processes that ask for
the same key at once (two test workers, the web app and a Celery worker) must not build it twice
or see half of it: the build runs under an exclusive ``flock`` on ``<base>/.<key>.lock`` into a
staging folder, which is renamed into place only when the build has written its manifest.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

MANIFEST_NAME = "manifest.json"  # the last file every build writes: a folder with it is whole


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the duration of the block."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(
    base: Path, key: str, build: Callable[[Path], object], *, force: bool = False
) -> Path:
    """Return ``base / key``, calling ``build(staging)`` to make it first if it is not whole.

    ``build`` writes everything into the staging folder it is given, ``MANIFEST_NAME`` last; the
    folder then takes the name ``base / key``. ``force`` builds again even when it is whole.
    """
    root = base / key
    if not force and (root / MANIFEST_NAME).is_file():
        return root
    base.mkdir(parents=True, exist_ok=True)
    with file_lock(base / f".{key}.lock"):
        # Another process may have finished the same build while this one waited for the lock.
        if not force and (root / MANIFEST_NAME).is_file():
            return root
        # Leftovers of a build that was killed: only the lock holder builds, so none is live.
        for stale in [*base.glob(f".{key}-build-*"), *base.glob(f".{key}-old-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-build-", dir=base))
        try:
            build(staging)
            if not (staging / MANIFEST_NAME).is_file():
                raise RuntimeError(f"the build of {root} wrote no {MANIFEST_NAME}")
            retired = base / f".{key}-old-{os.getpid()}"
            if root.exists():
                root.rename(retired)
            staging.rename(root)
            shutil.rmtree(retired, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return root
