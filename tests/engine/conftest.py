"""Fixtures of the engine's tests: the embedded tiny model and short configs over it."""

from __future__ import annotations

import pytest

from engine.config import PPOConfig, load_config
from tests.engine.tiny_run import short_run


@pytest.fixture
def fresh_group():
    """Destroy the process group the test makes, and only that one.

    A default group that was there before stays: whoever made it still holds it. An in-process
    vLLM engine keeps its own handles on the group it joined, and the next engine in this
    process fails ("not initialized in the world group map") once another test destroys it.
    """
    import torch.distributed as dist

    existed = dist.is_initialized()
    yield
    if not existed and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_assets():
    from engine.tiny import ensure_tiny_assets

    return ensure_tiny_assets()


@pytest.fixture
def tiny_config(tiny_assets, tmp_path):
    """Return a function building a short tiny-model config (``short_run``) with extra
    overrides."""

    def build(preset: str = "grpo_tiny", *overrides: str, steps: int = 1) -> PPOConfig:
        return load_config(
            f"{preset}.yaml", overrides=short_run(tmp_path, steps=steps) + [*overrides]
        )

    return build
