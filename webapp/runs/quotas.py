"""What one user may launch on a shared server: per-user run counts and per-run size caps.

``run_create`` applies both. The size caps (ranks, reward processes, training steps) are
problems of the config, reported as ``ConfigFieldError`` so the builder shows each next to its
field. The counts are checked inside the launch's transaction after it locks the owner's row,
so two launches at the same instant cannot both pass a limit that only one of them fits under.

Every queued run starts as soon as a worker takes it (nothing holds it back for a free slot),
so the active limit counts queued and starting runs as well as running ones; the queued limit
bounds the runs still waiting for a worker, which pile up when the Celery worker is down. The
limits are Django settings read at each launch (``POSTTRAIN_MAX_*``, set from the environment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Count, Q

from engine.config import ConfigFieldError, PPOConfig
from engine.config.reward_model import own_reward_pool
from webapp.runs.models import ACTIVE_STATUSES, Run, RunStatus

WAITING_STATUSES = (RunStatus.QUEUED, RunStatus.STARTING)


class LaunchRefused(Exception):
    """The launch is over one of the owner's limits; the message names it and the way out."""


def _train_rows(*, owner: Any, config: PPOConfig) -> int | None:
    """Return the rows of the training files if all are the owner's datasets of known length."""
    from webapp.datasets.models import Dataset

    value = config.data.train_files
    paths = [value] if isinstance(value, str) else list(value or [])
    uploads = Path(settings.MEDIA_ROOT).expanduser().resolve()
    total = 0
    for path in paths:
        resolved = Path(path).expanduser().resolve()
        if uploads not in resolved.parents:
            return None
        dataset = Dataset.objects.filter(
            owner=owner, file=str(resolved.relative_to(uploads))
        ).first()
        if dataset is None or dataset.row_count is None:
            return None
        total += dataset.row_count
    return total if paths else None


def run_size_errors(*, owner: Any, config: PPOConfig) -> list[ConfigFieldError]:
    """Return a problem for each per-run cap ``config`` exceeds.

    The caps: ranks (``POSTTRAIN_MAX_RANKS``: the trainer's and, with
    ``reward_model.enable_resource_pool``, the reward model's own pool), reward processes (``POSTTRAIN_MAX_REWARD_WORKERS``)
    and training steps (``POSTTRAIN_MAX_TRAINING_STEPS``). The steps are
    ``trainer.total_training_steps`` when set, otherwise ``trainer.total_epochs`` times the
    batches of an epoch when the training files are datasets with a known row count (the
    trainer drops the last partial batch); a file of unknown length is not counted.
    """
    errors = []
    trainer = config.trainer
    max_ranks = settings.POSTTRAIN_MAX_RANKS
    ranks = trainer.n_gpus_per_node * trainer.nnodes
    if ranks > max_ranks:
        errors.append(
            ConfigFieldError(
                "trainer.n_gpus_per_node",
                trainer.n_gpus_per_node,
                f"{trainer.n_gpus_per_node} per node x trainer.nnodes={trainer.nnodes} is "
                f"{ranks} ranks and POSTTRAIN_MAX_RANKS allows {max_ranks} per run on this "
                "server; lower trainer.n_gpus_per_node or trainer.nnodes",
            )
        )
    rm = config.reward_model
    if own_reward_pool(config) and ranks <= max_ranks:
        # The reward model's own pool (verl's reward_pool) holds ranks of its own.
        reward_ranks = max(rm.n_gpus_per_node, 0) * max(rm.nnodes, 0)
        if ranks + reward_ranks > max_ranks:
            errors.append(
                ConfigFieldError(
                    "reward_model.n_gpus_per_node",
                    rm.n_gpus_per_node,
                    f"the reward model's own pool ({rm.n_gpus_per_node} per node x "
                    f"reward_model.nnodes={rm.nnodes}) adds {reward_ranks} ranks to the "
                    f"trainer's {ranks}, {ranks + reward_ranks} in all, and "
                    f"POSTTRAIN_MAX_RANKS allows {max_ranks} per run on this server; lower "
                    "reward_model.n_gpus_per_node or reward_model.nnodes, or set "
                    "reward_model.enable_resource_pool=False to share the trainer's ranks",
                )
            )
    workers, max_workers = config.reward.num_workers, settings.POSTTRAIN_MAX_REWARD_WORKERS
    if workers > max_workers:
        errors.append(
            ConfigFieldError(
                "reward.num_workers",
                workers,
                f"POSTTRAIN_MAX_REWARD_WORKERS allows {max_workers} reward processes per run on "
                f"this server; set reward.num_workers to {max_workers} or fewer",
            )
        )
    max_steps = settings.POSTTRAIN_MAX_TRAINING_STEPS
    if trainer.total_training_steps:
        if trainer.total_training_steps > max_steps:
            errors.append(
                ConfigFieldError(
                    "trainer.total_training_steps",
                    trainer.total_training_steps,
                    f"POSTTRAIN_MAX_TRAINING_STEPS allows {max_steps} steps per run on this "
                    f"server; set trainer.total_training_steps to {max_steps} or fewer",
                )
            )
        return errors
    rows = _train_rows(owner=owner, config=config)
    if rows is not None:
        per_epoch = rows // config.data.train_batch_size
        steps = trainer.total_epochs * per_epoch
        if steps > max_steps:
            errors.append(
                ConfigFieldError(
                    "trainer.total_epochs",
                    trainer.total_epochs,
                    f"{trainer.total_epochs} epochs of {per_epoch} steps ({rows} rows in "
                    f"batches of data.train_batch_size={config.data.train_batch_size}) is "
                    f"{steps} steps and POSTTRAIN_MAX_TRAINING_STEPS allows {max_steps} per run "
                    "on this server; lower trainer.total_epochs or set "
                    "trainer.total_training_steps",
                )
            )
    return errors


def run_count_check(*, owner_id: int, runs: int = 1) -> None:
    """Raise ``LaunchRefused`` when ``runs`` more runs would pass the owner's queued or active cap.

    Call it inside the launch's transaction with the owner's row locked, so the counts cannot
    change before the new run is written. Outside it (a sweep's check before it validates its
    members), a pass is only a forecast: each launch checks again under the lock.
    """
    # An external run runs on its own machine: it takes none of this server's slots.
    counts = Run.objects.filter(owner_id=owner_id, experiment__external=False).aggregate(
        waiting=Count("pk", filter=Q(status__in=WAITING_STATUSES)),
        active=Count("pk", filter=Q(status__in=ACTIVE_STATUSES)),
    )
    more = "another" if runs == 1 else f"{runs} more"
    max_waiting = settings.POSTTRAIN_MAX_QUEUED_RUNS_PER_USER
    if counts["waiting"] + runs > max_waiting:
        raise LaunchRefused(
            f"POSTTRAIN_MAX_QUEUED_RUNS_PER_USER allows {max_waiting} runs per user waiting for "
            f"a worker and you have {counts['waiting']} queued or starting, so {more} would "
            f"make {counts['waiting'] + runs}; wait until they start (if none does, the Celery "
            "worker is down) or cancel one"
        )
    max_active = settings.POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER
    if counts["active"] + runs > max_active:
        raise LaunchRefused(
            f"POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER allows {max_active} active runs per user and "
            f"you have {counts['active']} queued, starting or running, so {more} would make "
            f"{counts['active'] + runs}; wait for one to end or cancel one"
        )
