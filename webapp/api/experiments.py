"""``/api/experiments``: create from a YAML or JSON config, list, read, clone, archive, delete,
launch. The config passes ``experiment_create``'s checks, a launch ``run_create``'s quotas."""

import json
from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from ninja.pagination import paginate

from engine.config import ConfigError, PPOConfig
from webapp.api.errors import ApiError, ErrorOut, config_error
from webapp.api.pagination import Pages
from webapp.api.runs import LaunchKeyIn, RunOut, launch_answer
from webapp.experiments.configs import config_import_yaml
from webapp.experiments.models import Experiment
from webapp.experiments.selectors import experiment_list_for_user
from webapp.experiments.services import (
    experiment_create,
    experiment_delete,
    experiment_set_archived,
)
from webapp.projects.access import EDIT, OWN, VIEW, experiment_for
from webapp.runs.models import RunStatus
from webapp.runs.services import refuse_external, run_create

router = Router(tags=["experiments"])
ERRORS: dict[int | tuple[int, ...], Any] = {(400, 403, 404, 409, 422, 429): ErrorOut}


class ExperimentOut(Schema):
    id: int
    name: str
    description: str
    tags: list[str]
    preset: str
    archived: bool
    created_at: datetime
    updated_at: datetime
    run_count: int = 0
    latest_status: str | None = None


class ExperimentDetail(ExperimentOut):
    config: dict[str, Any] = Field(description="The validated engine config.")


class ExperimentIn(Schema):
    name: str = Field(max_length=200)
    description: str = ""
    tags: list[str] | str = Field(default_factory=list, description="A list or 'a, b'.")
    config: dict[str, Any] | None = Field(
        None, description="The engine config as JSON (verl's layout); or give config_yaml."
    )
    config_yaml: str | None = Field(
        None, description="The engine config as YAML; 'defaults:' may name the presets."
    )


class CloneIn(Schema):
    name: str | None = Field(None, max_length=200, description="Default: '<name> (copy)'.")


class ArchiveIn(Schema):
    archived: bool = True


class ExperimentFilters(Schema):
    q: str = Field("", max_length=200, description="Matches name, description and tags.")
    tag: str = Field("", max_length=50)
    status: RunStatus | None = Field(None, description="The newest run's status.")
    archived: bool | None = Field(False, description="null: archived and active together.")


def owned_experiment(request: HttpRequest, experiment_id: int, need: str = VIEW) -> Experiment:
    """Return the experiment (annotated as the list is) if the user holds ``need`` on it: 404
    without a view right, 403 without ``need`` (``webapp.projects.access``)."""
    experiments = experiment_list_for_user(user=request.user, archived=None)
    return experiment_for(request.user, experiment_id, need, queryset=experiments)


def parse_config(payload: ExperimentIn) -> PPOConfig:
    """Return the config of a create request, read as the builder's YAML import reads it."""
    if (payload.config is None) == (payload.config_yaml is None):
        raise ApiError(400, [("config", "give the config as either config (JSON) or config_yaml")])
    key = "config" if payload.config is not None else "config_yaml"
    # JSON is YAML: one reader, with its size bounds and its rule that defaults name presets.
    text = json.dumps(payload.config) if payload.config is not None else payload.config_yaml
    try:
        return config_import_yaml(text or "")
    except ConfigError as exc:
        raise config_error(exc, key) from None


@router.get("", response=list[ExperimentOut])
@paginate(Pages)
def list_experiments(request: HttpRequest, filters: Query[ExperimentFilters]) -> Any:
    """List your experiments, newest first (filters as on the experiments page)."""
    return experiment_list_for_user(
        user=request.user,
        search=filters.q,
        tag=filters.tag,
        status=filters.status or "",
        archived=filters.archived,
    )


@router.post("", response={201: ExperimentDetail, **ERRORS})
def create_experiment(request: HttpRequest, payload: ExperimentIn) -> Any:
    """Create an experiment from a config; every problem comes back keyed by its config key."""
    experiment = experiment_create(
        owner=request.user,
        name=payload.name,
        config=parse_config(payload),
        description=payload.description,
        tags=payload.tags,
    )
    return Status(201, owned_experiment(request, experiment.pk))


@router.get("/{int:experiment_id}", response={200: ExperimentDetail, **ERRORS})
def read_experiment(request: HttpRequest, experiment_id: int) -> Any:
    """Read one experiment with its config."""
    return owned_experiment(request, experiment_id)


@router.post("/{int:experiment_id}/clone", response={201: ExperimentDetail, **ERRORS})
def clone_experiment(
    request: HttpRequest, experiment_id: int, payload: CloneIn | None = None
) -> Any:
    """Create a new experiment with this one's config (checked again, as a new one is)."""
    payload = payload or CloneIn()
    source = owned_experiment(request, experiment_id)
    refuse_external(experiment=source, action="clone")
    clone = experiment_create(
        owner=request.user,
        name=payload.name if payload.name is not None else f"{source.name} (copy)",
        config=source.config,
        description=source.description,
        tags=source.tags,
        preset=source.preset,
    )
    return Status(201, owned_experiment(request, clone.pk))


@router.post("/{int:experiment_id}/archive", response={200: ExperimentDetail, **ERRORS})
def archive_experiment(
    request: HttpRequest, experiment_id: int, payload: ArchiveIn | None = None
) -> Any:
    """Archive an experiment (``archived: false`` restores it; no body archives)."""
    experiment = owned_experiment(request, experiment_id, OWN)
    experiment_set_archived(experiment=experiment, archived=(payload or ArchiveIn()).archived)
    return owned_experiment(request, experiment_id)


@router.delete("/{int:experiment_id}", response={204: None, **ERRORS})
def delete_experiment(request: HttpRequest, experiment_id: int) -> Any:
    """Delete an experiment with its runs (409 while one is active: cancel it first)."""
    experiment_delete(experiment=owned_experiment(request, experiment_id, OWN))
    return Status(204, None)


@router.post("/{int:experiment_id}/launch", response={200: RunOut, 201: RunOut, **ERRORS})
def launch_experiment(
    request: HttpRequest, experiment_id: int, payload: LaunchKeyIn | None = None
) -> Any:
    """Queue a run (201; no body needed); a repeated ``launch_key`` returns its run (200)."""
    experiment = owned_experiment(request, experiment_id, EDIT)
    return launch_answer(
        lambda key: run_create(experiment=experiment, launch_key=key, launcher=request.user),
        payload,
    )
