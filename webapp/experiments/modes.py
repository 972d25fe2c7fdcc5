"""The builder's training mode: synchronous, one step off-policy or fully asynchronous.

The engine picks its trainer from two settings (``engine.trainer.run``):
``actor_rollout_ref.hybrid_engine=False`` moves the rollout into a worker process that generates
the next batch while this one trains (one-step-off, verl's ``one_step_off_policy``), and with any
of ``async_training.staleness_threshold``, ``trigger_parameter_sync_step`` or ``require_batches``
set as well, the trainer streams from a bounded queue that process fills (fully-async, verl's
``fully_async_policy``; ``engine.config.async_training``). ``TRAINING_MODES`` is the one mapping
from a mode to the keys it writes; the staleness keys are the fully-async mode's settings and are
written only in that mode (elsewhere the engine refuses them). The engine's validator judges the
result, so a setting it cannot honour shows its error next to the field.

The fully-async mode's panel also offers ``async_training.partial_rollout`` (a sync interrupts
the chunk in flight); it does not select the mode, and like the staleness keys it is written in
that mode only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from engine.config import PPOConfig, get_value
from engine.config.async_training import FULLY_ASYNC_DEFAULTS

SYNC = "sync"
ONE_STEP_OFF = "one_step_off"
FULLY_ASYNC = "fully_async"

HYBRID_ENGINE = "actor_rollout_ref.hybrid_engine"
# verl's fully_async_ppo_trainer.yaml values, as the engine takes them for a key left null: what
# an empty staleness box means, and what the mode writes when every box is empty (with all
# three null the engine would run one-step-off).
VERL_STALENESS_DEFAULTS: dict[str, Any] = {
    f"async_training.{key}": value for key, value in FULLY_ASYNC_DEFAULTS.items()
}
STALENESS_KEYS = tuple(VERL_STALENESS_DEFAULTS)
PARTIAL_ROLLOUT = "async_training.partial_rollout"
# The fully-async mode's panel, in the page's order.
FULLY_ASYNC_KEYS = (*STALENESS_KEYS, PARTIAL_ROLLOUT)


class TrainingMode(NamedTuple):
    """A mode as the builder offers it: its label, the keys it writes, whether it reads the
    fully-async panel (the staleness settings and partial rollout)."""

    label: str
    keys: dict[str, Any]
    staleness: bool


TRAINING_MODES: dict[str, TrainingMode] = {
    SYNC: TrainingMode(
        "Synchronous: each batch is generated, then trained on", {HYBRID_ENGINE: True}, False
    ),
    ONE_STEP_OFF: TrainingMode(
        "One step off-policy: the next batch generates while this one trains",
        {HYBRID_ENGINE: False},
        False,
    ),
    FULLY_ASYNC: TrainingMode(
        "Fully asynchronous: a rollout worker streams samples into a queue; weights sync "
        "every few steps",
        {HYBRID_ENGINE: False},
        True,
    ),
}


def training_mode_of(config: PPOConfig) -> str:
    """Return the mode ``config`` runs in, as the engine chooses its trainer."""
    if get_value(config, HYBRID_ENGINE):
        return SYNC
    if any(get_value(config, key) is not None for key in STALENESS_KEYS):
        return FULLY_ASYNC
    return ONE_STEP_OFF


def training_mode_values(mode: str, panel: Mapping[str, Any]) -> dict[str, Any]:
    """Return the config keys and values ``mode`` writes (``panel``: the fully-async panel's
    text by key, read in the fully-async mode only; every staleness box empty takes verl's
    values)."""
    chosen = TRAINING_MODES[mode]
    if not chosen.staleness:
        return {**chosen.keys, **dict.fromkeys(FULLY_ASYNC_KEYS)}
    typed = {key: panel.get(key) for key in FULLY_ASYNC_KEYS}
    if not any(str(typed[key] or "").strip() for key in STALENESS_KEYS):
        typed.update(VERL_STALENESS_DEFAULTS)
    return {**chosen.keys, **typed}
