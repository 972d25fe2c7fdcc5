"""Overrides the engine's benchmark arms share (no import of the engine: the arms import it
themselves, after measuring what that costs)."""

from __future__ import annotations

from pathlib import Path


def training_only(steps: int, seed: int, out_dir: Path | str) -> list[str]:
    """Return the overrides of ``steps`` training steps from ``seed``, its folder ``out_dir``,
    with no validation, no checkpoint and no logger."""
    return [
        f"trainer.total_training_steps={steps}",
        f"trainer.seed={seed}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=-1",
        "trainer.logger=[]",
        f"trainer.default_local_dir={out_dir}",
    ]
