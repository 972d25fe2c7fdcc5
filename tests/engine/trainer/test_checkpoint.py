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


def save_both(folder: Path, step: int) -> Path:
    parts = {f"{role}/state.pt": text_writer(role) for role in ("actor", "critic")}
    return write_checkpoint(folder, step, {**parts, STATE_FILE: text_writer("t")})


def roles_held(folder: Path) -> dict[int, list[str]]:
    return {
        step: sorted(p.name for p in (folder / f"global_step_{step}").iterdir() if p.is_dir())
        for step in saved_steps(folder)
    }


def test_prune_keeps_actor_and_critic_state_by_their_own_limits(tmp_path):
    # trainer.max_actor_ckpt_to_keep=3, trainer.max_critic_ckpt_to_keep=1
    for step in (1, 2, 3, 4):
        save_both(tmp_path, step)
        prune(tmp_path, 3, 1)
    assert roles_held(tmp_path) == {2: ["actor"], 3: ["actor"], 4: ["actor", "critic"]}
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step_4"
    # Without the critic's limit, a tighter actor limit empties steps 2 and 3: both go.
    prune(tmp_path, 1, None)
    assert roles_held(tmp_path) == {4: ["actor", "critic"]}


def test_prune_with_only_a_critic_limit_keeps_every_actor_state(tmp_path):
    for step in (1, 2, 3):
        save_both(tmp_path, step)
    prune(tmp_path, None, 2)
    assert roles_held(tmp_path) == {1: ["actor"], 2: ["actor", "critic"], 3: ["actor", "critic"]}
    prune(tmp_path, 1, 3)  # a step left with critic/ only stays: its critic is kept
    assert roles_held(tmp_path) == {2: ["critic"], 3: ["actor", "critic"]}


def test_the_module_loads_without_torch():
    import subprocess

    code = "import sys, engine.trainer.checkpoint; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class RunsCodeWhenUnpickled:
    """An object whose unpickling writes ``marker``: what a hostile checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_a_state_file_with_a_pickled_object_is_refused_before_it_runs(tmp_path):
    import torch

    from engine.trainer.checkpoint import load_state

    marker = tmp_path / "marker"
    path = tmp_path / "state.pt"
    torch.save({"model": {"w": torch.ones(2)}, "extra": RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(ValueError, match=r"state\.pt holds objects other than tensors"):
        load_state(path)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the payload is live: a plain load runs it
    assert marker.read_text() == "ran"


def test_the_rng_states_come_back_through_a_weights_only_load(tmp_path):
    import random

    import numpy as np
    import torch

    from engine.trainer.checkpoint import load_state, restore_rng_states, rng_states, save_state

    np.random.normal()  # a cached Gaussian is part of NumPy's state
    save_state({"rng": rng_states()}, tmp_path / "trainer_state.pt")
    expected = (torch.rand(3), random.random(), np.random.normal(size=3))
    restore_rng_states(load_state(tmp_path / "trainer_state.pt")["rng"])
    torch.testing.assert_close(torch.rand(3), expected[0], atol=0, rtol=0)
    assert random.random() == expected[1]
    np.testing.assert_array_equal(np.random.normal(size=3), expected[2])


@pytest.mark.parametrize(
    "config",
    [
        {"type": "fixed", "kl_coef": 0.1},
        {"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.05, "horizon": 100},
        {"type": "pid", "kl_coef": 0.1, "target_kl": 0.05, "kp": 0.1, "ki": 0.01, "kd": 0.0},
    ],
)
def test_every_kl_controller_state_loads_weights_only(tmp_path, config):
    from engine.algorithms.kl import get_kl_controller
    from engine.trainer.checkpoint import load_state, save_state

    controller = get_kl_controller(config)
    controller.update(current_kl=0.2, n_steps=4)
    controller.update(current_kl=0.01, n_steps=4)
    save_state({"kl_ctrl": controller.__dict__}, tmp_path / "trainer_state.pt")
    assert load_state(tmp_path / "trainer_state.pt")["kl_ctrl"] == controller.__dict__
