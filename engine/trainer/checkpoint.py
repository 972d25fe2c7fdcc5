"""Checkpoint folders on disk, verl's layout: ``<default_local_dir>/global_step_<N>/``.

Each checkpoint holds ``actor/state.pt`` (weights, optimizer, schedule and sampling RNG; a
sharded run keeps each rank's shards), ``critic/state.pt`` when a critic trains, optionally
``actor/huggingface/`` and ``critic/huggingface/`` and ``trainer_state.pt`` (step, data position,
KL controller, RNG). ``latest_checkpointed_iteration.txt`` names the newest complete one.

What a worker's state file holds is verl's ``checkpoint.save_contents``: ``model`` (weights and
LoRA settings), ``optimizer``, ``extra`` (learning-rate schedule and sampling RNG); ``hf_model``
adds the ``huggingface/`` folder. The file lists what it holds under ``contents``, and a resume
restores only ``checkpoint.load_contents`` (:func:`merge_contents`).

The trainer's policy is here too, as functions of the workers and the controller's state:
:func:`save_checkpoint` writes each role's contents and the trainer state then prunes to
``trainer.max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep``; :func:`resume_dir` finds the
checkpoint ``trainer.resume_mode`` names and :func:`load_checkpoint` restores it.

Every file holds only tensors and plain containers and is read back with
``torch.load(weights_only=True)``, so loading a checkpoint never runs code. A checkpoint is
written under a temporary name and renamed into place, so a crash mid-save never leaves a
half-written folder that looks complete.

This module imports no torch at import time: the web app asks it for a run's latest checkpoint,
so the functions that read or write a state file import torch themselves.
"""

from __future__ import annotations

import pickle
import random
import shutil
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from engine.algorithms.kl import KLController
    from engine.config import PPOConfig, TrainerConfig
    from engine.config.actor import CheckpointConfig

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.pt"
HF_FOLDER = "huggingface"
# The keys of a worker's state dict each ``checkpoint.save_contents`` entry covers.
CONTENT_KEYS = {
    "model": ("model", "lora"),
    "optimizer": ("optimizer",),
    "extra": ("lr_scheduler", "generator"),
}
# What checkpoints written before save_contents was honoured hold.
LEGACY_CONTENTS = ("model", "optimizer", "extra")
# What a worker keeps when a resume leaves a checkpoint content out (checkpoint.load_contents).
FRESH = {
    "model": "the weights stay those of the model path",
    "optimizer": "the optimizer starts fresh (no moment estimates)",
    "extra": "the learning-rate schedule and sampling RNG start afresh",
}


def step_dir(folder: str | Path, step: int) -> Path:
    """Return the folder of the checkpoint at ``step``."""
    return Path(folder) / f"global_step_{step}"


def is_complete(path: Path) -> bool:
    """Return True when ``path`` is a finished checkpoint folder (its trainer state written)."""
    return (path / STATE_FILE).is_file()


def saved_steps(folder: str | Path) -> list[int]:
    """Return the steps of the complete checkpoints in ``folder``, in order."""
    steps = []
    for path in Path(folder).glob("global_step_*"):
        suffix = path.name.rsplit("_", 1)[1]
        if suffix.isdigit() and is_complete(path):
            steps.append(int(suffix))
    return sorted(steps)


def latest_checkpoint(folder: str | Path | None) -> Path | None:
    """Return the newest complete ``global_step_<N>`` folder in ``folder``, or None.

    The step ``latest_checkpointed_iteration.txt`` names wins when that checkpoint is complete;
    otherwise (a missing or stale file) the highest complete step does.
    """
    if not folder:
        return None
    folder = Path(folder)
    latest = folder / LATEST_FILE
    if latest.is_file():
        text = latest.read_text().strip()
        if text.isdigit() and is_complete(step_dir(folder, int(text))):
            return step_dir(folder, int(text))
    steps = saved_steps(folder)
    return step_dir(folder, steps[-1]) if steps else None


def write_checkpoint(
    folder: str | Path, step: int, parts: dict[str, Callable[[Path], None]]
) -> Path:
    """Write checkpoint ``step`` atomically and mark it the latest; return its folder.

    ``parts`` maps a relative path (``actor/state.pt``) to a function that writes it; the
    trainer state (``trainer_state.pt``) must be among them, since it marks the folder complete.
    """
    if STATE_FILE not in parts:
        raise ValueError(f"a checkpoint needs {STATE_FILE}; it marks the folder complete")
    target = step_dir(folder, step)
    tmp = Path(folder) / f".tmp_global_step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    for relative, write in parts.items():
        path = tmp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    (Path(folder) / LATEST_FILE).write_text(str(step))
    return target


def prune(folder: str | Path, actor_keep: int | None, critic_keep: int | None = None) -> None:
    """Keep the newest ``actor_keep`` ``actor/`` and ``critic_keep`` ``critic/`` folders.

    As verl's ``max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep``, each role is pruned on
    its own (a falsy limit keeps all); a step folder left with neither is removed entirely. The
    newest step always keeps both, so a resume from the latest checkpoint is whole.
    """
    for role, keep in (("actor", actor_keep), ("critic", critic_keep)):
        if not keep:
            continue
        held = [step for step in saved_steps(folder) if (step_dir(folder, step) / role).is_dir()]
        for step in held[:-keep]:
            shutil.rmtree(step_dir(folder, step) / role, ignore_errors=True)
    for step in saved_steps(folder)[:-1]:
        path = step_dir(folder, step)
        if not any((path / role).is_dir() for role in ("actor", "critic")):
            shutil.rmtree(path, ignore_errors=True)


def save_state(state: Any, path: Path) -> None:
    """Write one state file (``torch.save``): tensors and plain containers only.

    :func:`load_state` reads it back with ``weights_only=True``, which refuses any other object
    (NumPy arrays included: see :func:`rng_states`).
    """
    import torch  # deferred: the web app imports this module without torch

    torch.save(state, path)


def load_state(path: Path) -> Any:
    """Read one state file written by :func:`save_state`, with ``torch.load(weights_only=True)``.

    Only tensors and plain containers (dict, list, tuple, str, numbers) come back: a file holding
    any other pickled object is refused instead of letting it run code on load, so a checkpoint
    folder handed in from elsewhere (``trainer.resume_from_path``) cannot execute anything.
    """
    import torch  # deferred: the web app imports this module without torch

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"{path} holds objects other than tensors and plain containers, so it was not "
            "loaded (weights_only=True); resume only from checkpoints this trainer wrote "
            f"({str(exc).splitlines()[0]})"
        ) from exc


def rng_states() -> dict[str, Any]:
    """Return the torch, Python and NumPy RNG states as tensors and plain containers.

    NumPy's own state holds an array, which ``weights_only`` loading refuses; its 624 words are
    kept as a list of ints instead.
    """
    import torch  # deferred: the web app imports this module without torch

    state = np.random.get_state(legacy=True)
    assert isinstance(state, tuple)  # the global generator is MT19937: legacy form
    name, keys, pos, has_gauss, cached_gaussian = state
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached_gaussian)],
    }


def restore_rng_states(state: dict[str, Any]) -> None:
    """Restore the RNG states saved by :func:`rng_states`."""
    import torch  # deferred: the web app imports this module without torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))


def _per_rank(state: dict[str, Any], change: Callable[..., dict[str, Any]], *others: Any) -> Any:
    """Apply ``change`` to a worker state, or to each rank's state of a sharded one."""
    if state.get("format") == "fsdp2_sharded":
        ranks = [
            change(rank, *(o["ranks"][i] for o in others)) for i, rank in enumerate(state["ranks"])
        ]
        return {**state, "ranks": ranks}
    return change(state, *others)


def select_contents(state: dict[str, Any], contents: list[str]) -> dict[str, Any]:
    """Return the worker ``state`` with only the keys ``contents`` names, plus its list.

    Keys no content covers (a sharded state's rank and world size) are kept.
    """
    dropped = {key for name, keys in CONTENT_KEYS.items() if name not in contents for key in keys}

    def keep(rank_state: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rank_state.items() if k not in dropped}

    saved = [name for name in CONTENT_KEYS if name in contents]
    return {**_per_rank(state, keep), "contents": saved}


def saved_contents(folder: Path, state: dict[str, Any]) -> list[str]:
    """Return what the worker checkpoint in ``folder`` (``actor/``, ``critic/``) holds."""
    contents = list(state.get("contents", LEGACY_CONTENTS))
    if (folder / HF_FOLDER).is_dir():
        contents.append("hf_model")
    return contents


def merge_contents(
    current: dict[str, Any], saved: dict[str, Any], contents: list[str]
) -> dict[str, Any]:
    """Return ``current`` (a worker's live state) with the saved parts ``contents`` names.

    What is not loaded keeps the worker's live value: a fresh optimizer, the schedule and RNG
    it started with, or the weights it loaded from the model path.
    """
    sharded = saved.get("format") == "fsdp2_sharded"
    if sharded != (current.get("format") == "fsdp2_sharded") or (
        sharded and len(current["ranks"]) != len(saved["ranks"])
    ):
        return saved  # the worker's load refuses a checkpoint of another layout, with the fix
    taken = {key for name in contents for key in CONTENT_KEYS.get(name, ())}

    def merge(live: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
        return {**live, **{k: v for k, v in stored.items() if k in taken}}

    merged = _per_rank(current, merge, saved)
    merged.pop("contents", None)
    return merged


# -- the trainer's policy: what a checkpoint holds, which one a run resumes from ---------------
def checkpointed_roles(
    config: PPOConfig, actor: Any, critic: Any
) -> list[tuple[str, Any, CheckpointConfig]]:
    """Return ``(folder, worker, checkpoint settings)`` for each role a checkpoint holds."""
    roles: list[tuple[str, Any, CheckpointConfig]] = [
        ("actor", actor, config.actor_rollout_ref.actor.checkpoint)
    ]
    if critic is not None:
        roles.append(("critic", critic, config.critic.checkpoint))
    return roles


def trainer_state(step: int, train_loader: Any, kl_ctrl: KLController | None) -> dict[str, Any]:
    """Return the controller's state: step, data position, KL coefficient and RNG."""
    return {
        "global_step": step,
        "dataloader": train_loader.state_dict(),
        "kl_coef": kl_ctrl.value if kl_ctrl is not None else None,
        "kl_ctrl": getattr(kl_ctrl, "__dict__", None),
        "rng": rng_states(),
    }


def save_checkpoint(
    folder: Path,
    step: int,
    roles: list[tuple[str, Any, CheckpointConfig]],
    state: dict[str, Any],
    trainer_config: TrainerConfig,
) -> Path:
    """Write ``global_step_<step>/`` (each role, the trainer ``state``), mark it the latest and
    prune older ones to ``trainer.max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep``.

    Each worker's file holds what its ``checkpoint.save_contents`` lists; ``hf_model`` adds
    a Hugging Face folder ``<role>/huggingface/``. The trainer state is always written.
    """
    parts: dict[str, Any] = {}
    for role, worker, settings in roles:
        contents = list(settings.save_contents)
        parts[f"{role}/state.pt"] = partial(
            save_state, select_contents(worker.state_dict(), contents)
        )
        if "hf_model" in contents:
            parts[f"{role}/{HF_FOLDER}"] = worker.export_hf
    parts[STATE_FILE] = partial(save_state, state)
    target = write_checkpoint(folder, step, parts)
    prune(folder, trainer_config.max_actor_ckpt_to_keep, trainer_config.max_critic_ckpt_to_keep)
    return target


def resume_dir(mode: str, resume_from_path: str | None, folder: Path) -> Path | None:
    """Return the checkpoint to resume from, as ``trainer.resume_mode`` says: none
    (``disable``), ``resume_from_path`` (``resume_path``), else the newest in ``folder``."""
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = Path(resume_from_path or "")
        if not is_complete(path):
            raise FileNotFoundError(
                f"trainer.resume_from_path={str(path)!r} is not a checkpoint folder "
                f"(no {STATE_FILE}); point it at .../global_step_<N>"
            )
        return path
    return latest_checkpoint(folder)


def load_checkpoint(
    path: Path,
    roles: list[tuple[str, Any, CheckpointConfig]],
    train_loader: Any,
    kl_ctrl: KLController | None,
) -> dict[str, Any]:
    """Restore each role's worker and the controller's state from ``path``; return that state
    (``global_step`` among it)."""
    for role, worker, settings in roles:
        load_worker(path / role, worker, settings, role)
    state = load_state(path / STATE_FILE)
    train_loader.load_state_dict(state["dataloader"])
    if kl_ctrl is not None and state.get("kl_ctrl"):
        kl_ctrl.__dict__.update(state["kl_ctrl"])
    restore_rng_states(state["rng"])
    return state


def load_worker(folder: Path, worker: Any, settings: CheckpointConfig, role: str) -> None:
    """Restore one worker from ``folder`` with only its ``checkpoint.load_contents``.

    A content the checkpoint lacks is refused; one left out keeps the worker's live value
    (a fresh optimizer, the starting schedule and RNG, the model path's weights), with a
    warning. ``hf_model`` loads nothing (the weights are ``model``): it only asks that the
    checkpoint has the Hugging Face folder.
    """
    key = "actor_rollout_ref.actor.checkpoint" if role == "actor" else f"{role}.checkpoint"
    contents = list(
        settings.save_contents if settings.load_contents is None else settings.load_contents
    )
    if not (folder / "state.pt").is_file():
        raise FileNotFoundError(
            f"the checkpoint {folder.parent} holds no {role} state ({role}/state.pt): "
            f"trainer.max_{role}_ckpt_to_keep pruned it from this older step; resume from a "
            "newer step (trainer.resume_mode=auto takes the newest)"
        )
    saved = load_state(folder / "state.pt")
    held = saved_contents(folder, saved)
    lacking = [name for name in contents if name not in held]
    if lacking:
        raise ValueError(
            f"{key}.load_contents asks for {lacking} but the checkpoint {folder} holds only "
            f"{held}; drop them from {key}.load_contents (what is not loaded starts fresh) "
            "or resume from a checkpoint saved with them"
        )
    skipped = [name for name in CONTENT_KEYS if name not in contents]
    if skipped:
        warnings.warn(
            f"resuming {role} from {folder} without {skipped} ({key}.load_contents="
            f"{contents}): {'; '.join(FRESH[name] for name in skipped)}",
            UserWarning,
            stacklevel=2,
        )
        saved = merge_contents(worker.state_dict(), saved, contents)
    worker.load_state_dict(saved)
