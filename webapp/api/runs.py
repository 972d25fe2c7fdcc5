"""``/api/runs``: list (by status and experiment), read, status, cancel, resume, and the metric
series, downsampled by ``webapp.runs.metrics`` exactly as the charts draw them."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.http import HttpRequest, QueryDict
from ninja import Field, Query, Router, Schema, Status
from ninja.pagination import paginate

from webapp.api.errors import ApiError, ErrorOut, field_error
from webapp.api.pagination import Pages
from webapp.projects.access import EDIT, VIEW, run_for
from webapp.runs.metrics import DEFAULT_MAX_POINTS, run_metric_series, run_metrics_json
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import LAUNCH_KEY_PATTERN, AlreadyLaunched, run_cancel, run_resume
from webapp.runs.table import RunTableQueryError, parse_run_table_query, run_table_runs

router = Router(tags=["runs"])
ERRORS: dict[int | tuple[int, ...], Any] = {(400, 403, 404, 409, 422, 429): ErrorOut}


class RunOut(Schema):
    id: int
    experiment_id: int
    experiment_name: str = Field(alias="experiment.name")
    number: int = Field(
        description="1, 2, ... within its experiment; the pages name a run by its id (run #<id>)."
    )
    parent_id: int | None
    status: RunStatus
    active: bool = Field(alias="is_active")
    can_resume: bool
    external: bool = Field(
        alias="is_external", description="Reported by a trainer the studio did not launch."
    )
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    stalled_since: datetime | None
    start_step: int
    latest_step: int
    total_steps: int | None
    error: str = Field(description="Why the run failed, with the traceback.")
    tags: list[str]
    notes: str


class RunDetail(RunOut):
    config: dict[str, Any] = Field(description="The resolved config the run was launched with.")


class RunStatusOut(Schema):
    id: int
    status: RunStatus
    active: bool = Field(alias="is_active")
    cancel_requested: bool
    latest_step: int
    total_steps: int | None
    error: str


class RunFilters(Schema):
    """The runs table's filters (``webapp.runs.table``), and one experiment."""

    status: list[RunStatus] = Field([], description="Repeat: runs with any of them.")
    tag: list[str] = Field([], description="Repeat: runs with every one.")
    config: list[str] = Field([], description="Repeat: '<dotted key>=<value>', every one holds.")
    experiment: int | None = Field(None, description="Only the runs of this experiment.")


class LaunchKeyIn(Schema):
    """The body of a launch or a resume: both take an optional idempotency key."""

    launch_key: str = Field(
        "",
        pattern=f"^(?:{LAUNCH_KEY_PATTERN.pattern})?$",
        description="Optional: the same key again returns the run it made, not a new one.",
    )


class Series(Schema):
    step: list[int]
    time: list[float] = Field(description="Unix seconds.")
    value: list[float]


class MetricSeriesOut(Schema):
    run_id: int
    series: dict[str, Series]
    last_step: int | None
    points: int = Field(description="The steps in the range.")
    downsampled: bool


class MetricTableOut(Schema):
    run_id: int
    names: list[str]
    step: list[int]
    time: list[float]
    values: dict[str, list[float | None]] = Field(description="values[name][i] is at step[i].")


def owned_run(request: HttpRequest, run_id: int, need: str = VIEW) -> Run:
    """Return the run if the user holds ``need`` on it: 404 without a view right, else 403."""
    return run_for(request.user, run_id, need)


def launch_answer(launch: Callable[[str], Run], payload: LaunchKeyIn | None) -> Status:
    """Queue a run with ``launch(launch_key)`` and answer as every launch route does.

    201 with the run as stored once its start was handed to the broker (without a broker
    ``run_create`` ends it failed, the reason in ``error``); a repeated ``launch_key`` is 200
    with the run the first request made.
    """
    try:
        run = launch((payload or LaunchKeyIn()).launch_key)
    except AlreadyLaunched as exc:
        return Status(200, exc.run)
    run.refresh_from_db()
    return Status(201, run)


@router.get("", response=list[RunOut])
@paginate(Pages)
def list_runs(request: HttpRequest, filters: Query[RunFilters]) -> Any:
    """List your runs, newest first."""
    params = QueryDict(mutable=True)
    for name in ("status", "tag", "config"):
        params.setlist(name, [str(value) for value in getattr(filters, name)])
    try:
        query = parse_run_table_query(params)
    except RunTableQueryError as exc:
        raise ApiError(400, [(None, error) for error in exc.errors]) from None
    runs = run_table_runs(user=request.user, query=query).defer(None).defer("config")
    if filters.experiment is not None:
        runs = runs.filter(experiment_id=filters.experiment)
    return runs


@router.get("/{int:run_id}", response={200: RunDetail, **ERRORS})
def read_run(request: HttpRequest, run_id: int) -> Any:
    """Read one run with its resolved config."""
    return owned_run(request, run_id)


@router.get("/{int:run_id}/status", response={200: RunStatusOut, **ERRORS})
def run_status(request: HttpRequest, run_id: int) -> Any:
    """Read a run's status and progress (small: poll it)."""
    return owned_run(request, run_id)


@router.post("/{int:run_id}/cancel", response={200: RunOut, **ERRORS})
def cancel_run(request: HttpRequest, run_id: int) -> Any:
    """Cancel: a queued run ends now, a running one after its current step."""
    return run_cancel(run=owned_run(request, run_id, EDIT))


@router.post("/{int:run_id}/resume", response={200: RunOut, 201: RunOut, **ERRORS})
def resume_run(request: HttpRequest, run_id: int, payload: LaunchKeyIn | None = None) -> Any:
    """Queue a new run that continues this one from its last checkpoint (201); no body needed."""
    run = owned_run(request, run_id, EDIT)
    return launch_answer(
        lambda key: run_resume(run=run, launch_key=key, launcher=request.user), payload
    )


class MetricQuery(Schema):
    name: list[str] = Field([], description="Repeat for several; none: every metric.")
    step_min: int | None = Field(None, alias="from", ge=0, description="First step.")
    step_max: int | None = Field(None, alias="to", ge=0, description="Last step.")
    points: int = Field(DEFAULT_MAX_POINTS, description="Points per series (min/max buckets).")


@router.get("/{int:run_id}/metrics", response={200: MetricSeriesOut, **ERRORS})
def metric_series(request: HttpRequest, run_id: int, query: Query[MetricQuery]) -> Any:
    """Return the metric series downsampled to ``points`` each, as the run page's charts."""
    run = owned_run(request, run_id)
    try:
        result = run_metric_series(
            run_id=run.pk,
            names=query.name or None,
            step_min=query.step_min,
            step_max=query.step_max,
            max_points=query.points,
        )
    except ValueError as exc:  # the message starts with the parameter: "max_points=..."
        parameter = str(exc).partition("=")[0]
        raise field_error({"max_points": "points"}.get(parameter, parameter), str(exc)) from None
    return {"run_id": run.pk, **result}


@router.get("/{int:run_id}/metrics/all", response={200: MetricTableOut, **ERRORS})
def metric_table(request: HttpRequest, run_id: int) -> Any:
    """Return every recorded step of every metric, as the JSON export of the run page."""
    return run_metrics_json(run_id=owned_run(request, run_id).pk)
