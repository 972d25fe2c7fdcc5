"""Fixtures of the engine's tests: the embedded tiny model and short configs over it."""

from __future__ import annotations

import pytest

from engine.config import PPOConfig, load_config
from tests.engine.tiny_run import short_run


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
