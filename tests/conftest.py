"""Session-wide test setup: one torch thread per process and Ray without token auth.

Two torch processes sharing two cores with default threading ran a tiny model ~100x slower, and
the suite runs Celery workers, Ray actors and run drivers beside pytest itself.
"""

from __future__ import annotations

import os

from engine.env import CPU_PROCESS_ENV

for _key, _value in CPU_PROCESS_ENV.items():
    os.environ.setdefault(_key, _value)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402

torch.set_num_threads(1)
