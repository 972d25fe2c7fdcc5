"""A short run of the embedded tiny model: the overrides most engine tests start from."""

from __future__ import annotations

from pathlib import Path


def short_run(tmp_path: Path, *, steps: int = 1, batch: int = 4) -> list[str]:
    """Return the overrides of a short tiny run: ``batch`` prompts a step in one mini-batch,
    ``steps`` steps, no validation, no checkpoints, no loggers, its folder under ``tmp_path``."""
    return [
        f"data.train_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=-1",
        "trainer.logger=[]",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
