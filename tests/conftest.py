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

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def vllm_importable(monkeypatch):
    """Make vLLM look installed to the config validator, which only asks whether it imports.

    Configs written for a GPU machine (``rollout.name=vllm``) then validate the same here with
    or without a vLLM extra; the adapter's own tests use the real engine.
    """
    import importlib.machinery
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("vllm") is None:
        module = types.ModuleType("vllm")
        module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
        monkeypatch.setitem(sys.modules, "vllm", module)
