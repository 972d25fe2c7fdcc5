"""Checkpoint folders: the newest complete one, atomic writes, pruning (no torch needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.trainer.checkpoint import (
    LATEST_FILE,
    STATE_FILE,
    latest_checkpoint,
    prune,
    saved_steps,
    write_checkpoint,
)


def text_writer(text: str):
    return lambda path: Path(path).write_text(text)


def save(folder: Path, step: int) -> Path:
    return write_checkpoint(
        folder, step, {"actor/state.pt": text_writer("a"), STATE_FILE: text_writer("t")}
    )


def test_a_written_checkpoint_is_complete_and_the_latest(tmp_path):
    target = save(tmp_path, 3)
    assert target == tmp_path / "global_step_3"
    assert (target / "actor" / "state.pt").read_text() == "a"
    assert (tmp_path / LATEST_FILE).read_text() == "3"
    assert latest_checkpoint(tmp_path) == target
    assert not list(tmp_path.glob(".tmp_*"))


def test_the_latest_file_wins_only_when_its_checkpoint_is_complete(tmp_path):
    save(tmp_path, 2)
    save(tmp_path, 4)
    (tmp_path / LATEST_FILE).write_text("2")
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step_2"
    (tmp_path / LATEST_FILE).write_text("9")  # names a folder that is not there
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step_4"
    (tmp_path / "global_step_7").mkdir()  # a crash before the trainer state: not complete
    (tmp_path / LATEST_FILE).unlink()
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step_4"
    assert latest_checkpoint(tmp_path / "none") is None and latest_checkpoint(None) is None


def test_a_checkpoint_without_the_trainer_state_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs trainer_state.pt"):
        write_checkpoint(tmp_path, 1, {"actor/state.pt": text_writer("a")})


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step)
    prune(tmp_path, 2)
    assert saved_steps(tmp_path) == [3, 4]
    prune(tmp_path, None)
    assert saved_steps(tmp_path) == [3, 4]


def test_the_module_loads_without_torch():
    import subprocess

    code = "import sys, engine.trainer.checkpoint; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
