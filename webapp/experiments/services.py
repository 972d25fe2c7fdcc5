"""Write operations on experiments: create, archive, delete. Every config passes ``config_check``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction

from engine.config import ConfigFieldError, ConfigValidationError, PPOConfig, config_to_dict
from webapp.experiments.configs import as_config, config_check
from webapp.experiments.models import Experiment
from webapp.experiments.tags import clean_tags
from webapp.runs.models import ACTIVE_STATUSES
from webapp.runs.services import run_delete


def experiment_create(
    *,
    owner: Any,
    name: str,
    config: PPOConfig | dict[str, Any],
    description: str = "",
    tags: Sequence[str] | str = (),
    preset: str = "",
) -> Experiment:
    """Validate ``config`` and store it as a new experiment of ``owner``.

    Raise ``ConfigValidationError`` (nothing is created) when the engine or the studio rejects it.
    """
    cfg = as_config(config)
    config_check(owner=owner, config=cfg)
    name = name.strip()
    if not name:
        raise ConfigValidationError([ConfigFieldError("name", name, "give the experiment a name")])
    return Experiment.objects.create(
        owner=owner,
        name=name,
        description=description.strip(),
        tags=clean_tags(tags),
        preset=preset,
        config=config_to_dict(cfg),
    )


def experiment_set_archived(*, experiment: Experiment, archived: bool) -> Experiment:
    """Hide the experiment from the default list (``archived=True``) or show it again."""
    experiment.archived = archived
    experiment.save(update_fields=["archived", "updated_at"])
    return experiment


class ExperimentBusy(Exception):
    """The experiment still has runs that are queued or running."""


@transaction.atomic
def experiment_delete(*, experiment: Experiment) -> None:
    """Delete the experiment with its runs, metrics and samples.

    Raise ``ExperimentBusy`` while one of its runs is active: cancel those first.
    """
    locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
    active = locked.runs.filter(status__in=ACTIVE_STATUSES).count()
    if active:
        raise ExperimentBusy(
            f"{active} run(s) of this experiment are still active; cancel them, then delete it"
        )
    for run in locked.runs.all():
        run_delete(run=run)
    locked.delete()
