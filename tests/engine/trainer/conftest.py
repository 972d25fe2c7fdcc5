"""Fixtures for trainer tests: the embedded tiny model and small configs over it."""

from __future__ import annotations

import pytest

from engine.config import load_config


@pytest.fixture(scope="session")
def tiny_assets():
    from engine.tiny import ensure_tiny_assets

    return ensure_tiny_assets()


@pytest.fixture
def make_config(tiny_assets, tmp_path):
    """Return a function building a short tiny-model config with extra overrides."""

    def build(preset: str = "grpo_tiny", *overrides: str):
        base = [
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.total_training_steps=2",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            "trainer.save_freq=-1",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ]
        return load_config(f"{preset}.yaml", overrides=base + list(overrides))

    return build
