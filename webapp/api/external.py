"""``/api/external-runs``: report a run the studio did not launch (verl, TRL, the engine's CLI,
any trainer): create it, attach its config, append steps, samples and log lines, beat its
heartbeat, finish it. ``posttrain_client`` (``posttrain watch``, the TRL callback, the engine's
``posttrain`` logger) speaks it; docs/api.md describes it for any other client.

Read an external run through ``/api/runs`` as any run. The token's owner is the run's owner: a
token writes only its owner's runs (another's is a 404). Sizes are bounded per request
(``webapp.external.services``: the limits and their errors); the whole body by Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413).
"""

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import BaseModel, ConfigDict

from engine.config import ConfigError
from webapp.api.errors import ErrorOut, config_error, field_error
from webapp.external import services as ext
from webapp.external.models import ExternalRun, ExternalSource
from webapp.projects.access import external_run_for
from webapp.runs.models import Run, RunStatus, SampleSplit
from webapp.runs.services import LAUNCH_KEY_PATTERN

router = Router(tags=["external runs"])
# The appends' bodies are plain pydantic models: ninja's ``Schema`` runs a root validator per
# object (it reads ORM rows), which took a third of a 2,000-sample request.
ERRORS: dict[int | tuple[int, ...], Any] = {(400, 403, 404, 409, 413, 422, 429): ErrorOut}
NAME = Field(max_length=ext.MAX_NAME_CHARS)
TEXT = Field(max_length=ext.MAX_TEXT_CHARS)


class ExternalRunIn(Schema):
    key: str = Field(
        pattern=f"^{LAUNCH_KEY_PATTERN.pattern}$",
        description="A random id the client keeps (16-64 letters, digits, - or _): creating "
        "with it again returns the run it made (200), so a retried create makes no second run.",
    )
    name: str = Field(max_length=200, description="The experiment the run joins (made on use).")
    source: ExternalSource = ExternalSource.OTHER
    location: str = Field(
        "", max_length=500, description="Where the run lives (host, folder, job id): shown."
    )
    client: str = Field("", max_length=100, description="The reporting program and version.")
    cancel_honoured: bool = Field(
        False, description="The client stops the job when the owner cancels the run."
    )
    config: dict[str, Any] | None = Field(None, description="The trainer's resolved config.")
    config_yaml: str | None = Field(None, description="Or the same as YAML text.")
    total_steps: int | None = Field(None, ge=1, le=ext.MAX_COUNT)
    tags: list[str] = Field([], max_length=20)


class ConfigIn(Schema):
    config: dict[str, Any] | None = None
    config_yaml: str | None = None


class ExternalRunOut(Schema):
    id: int = Field(alias="run.pk")
    experiment_id: int = Field(alias="run.experiment_id")
    experiment_name: str = Field(alias="run.experiment.name")
    number: int = Field(alias="run.number")
    status: RunStatus = Field(alias="run.status")
    cancel_requested: bool = Field(alias="run.cancel_requested")
    latest_step: int = Field(alias="run.latest_step")
    url: str = Field(description="The run's page.")
    source: ExternalSource
    location: str
    cancel_honoured: bool
    log_lines: int = Field(description="Log lines the studio holds: send the next from here.")
    unknown_keys: list[str] = Field(
        description="Config keys the studio's schema does not know: kept, shown marked."
    )

    @staticmethod
    def resolve_url(obj: ExternalRun) -> str:
        return obj.run.get_absolute_url()

    @staticmethod
    def resolve_unknown_keys(obj: ExternalRun) -> list[str]:
        if obj.source not in (ExternalSource.VERL, ExternalSource.ENGINE):
            return []  # another trainer's config is not verl's schema: nothing to mark
        return ext.external_unknown_keys(obj.run.config)


class StateOut(Schema):
    id: int
    status: RunStatus
    cancel_requested: bool
    latest_step: int


class StepIn(BaseModel):
    step: int = Field(ge=0, le=ext.MAX_COUNT)
    metrics: dict[str, float | None] = Field(
        max_length=ext.MAX_METRICS_PER_STEP, description="verl's names; null for NaN."
    )
    wall_time: datetime | None = Field(None, description="When the step ended (default: now).")


class StepsIn(BaseModel):
    steps: list[StepIn] = Field([], max_length=ext.MAX_STEPS_PER_REQUEST)


class SampleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0, le=ext.MAX_COUNT)
    split: SampleSplit = SampleSplit.TRAIN
    prompt: str = TEXT
    response: str = TEXT
    reward: float | None = Field(description="The sequence's score; null for none.")
    sample_index: int = Field(
        ge=0, le=ext.MAX_COUNT, description="The sample's place in its prompt's group."
    )
    prompt_index: int | None = Field(
        None, ge=0, le=ext.MAX_COUNT, description="Default: a hash of the prompt's text."
    )
    reward_parts: dict[str, Any] = Field({}, description="Reward components (verl's extras).")
    ground_truth: Any = None
    data_source: str = Field("", max_length=100)
    group_id: str = Field("", max_length=100)
    advantage: float | None = None
    response_length: int | None = Field(None, ge=0, le=ext.MAX_COUNT)
    truncated: bool = False
    tokens: list[str] | None = Field(None, max_length=ext.MAX_TOKENS)
    token_ids: list[int] | None = Field(None, max_length=ext.MAX_TOKENS)
    token_logprobs: list[float | None] | None = Field(None, max_length=ext.MAX_TOKENS)
    token_ref_logprobs: list[float | None] | None = Field(None, max_length=ext.MAX_TOKENS)
    token_advantages: list[float | None] | None = Field(None, max_length=ext.MAX_TOKENS)


class SamplesIn(BaseModel):
    samples: list[SampleIn] = Field([], max_length=ext.MAX_SAMPLES_PER_REQUEST)


class LogsIn(BaseModel):
    offset: int = Field(
        0, ge=0, le=ext.MAX_COUNT, description="The position of the first line in the run's log."
    )
    lines: list[str] = Field([], max_length=ext.MAX_LOG_LINES_PER_REQUEST)


class FinishIn(Schema):
    # Optional in the schema so that ownership answers first (a stranger's run is a 404 whatever
    # the body); the service refuses a missing status by name. Every body here has defaults so.
    status: Literal["succeeded", "failed", "cancelled"] | None = None
    error: str = Field("", max_length=ext.MAX_TEXT_CHARS)


class CountOut(Schema):
    stored: int


def _owned(request: HttpRequest, run_id: int) -> ExternalRun:
    """Return the user's external run: 404 for a studio run or one the user may not read, 403
    for a project member's (``webapp.projects.access.external_run_for``)."""
    return external_run_for(request.user, run_id)


def _config(config: dict[str, Any] | None, text: str | None) -> dict[str, Any] | None:
    if config is not None and text is not None:
        raise field_error("config_yaml", "send the config as config or as config_yaml, not both")
    if text is None:
        return config
    from engine.config.yaml_io import yaml_load  # the hardened YAML reader; nothing is validated

    try:
        parsed = yaml_load(text, "config_yaml")
    except ConfigError as exc:
        raise config_error(exc, "config_yaml") from None
    if not isinstance(parsed, dict):
        raise field_error("config_yaml", "the YAML must be a mapping (verl's resolved config)")
    return parsed


def _answer(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except ext.ExternalInputError as exc:
        raise field_error(exc.key, str(exc), exc.status) from None
    except ext.ExternalRunError as exc:
        raise field_error(None, str(exc), exc.status) from None


@router.post("", response={200: ExternalRunOut, 201: ExternalRunOut, **ERRORS})
def create_external_run(request: HttpRequest, payload: ExternalRunIn) -> Any:
    """Create a running external run (201); the same ``key`` again returns it (200)."""
    run, created = _answer(
        ext.external_run_create,
        owner=request.user,
        key=payload.key,
        name=payload.name,
        source=payload.source,
        location=payload.location,
        client=payload.client,
        cancel_honoured=payload.cancel_honoured,
        config=_config(payload.config, payload.config_yaml),
        total_steps=payload.total_steps,
        tags=payload.tags,
    )
    return Status(201 if created else 200, _owned(request, run.pk))


@router.get("/{int:run_id}", response={200: ExternalRunOut, **ERRORS})
def read_external_run(request: HttpRequest, run_id: int) -> Any:
    """Read what the studio holds of an external run (a client resuming reads ``log_lines``)."""
    return _owned(request, run_id)


@router.put("/{int:run_id}/config", response={200: ExternalRunOut, **ERRORS})
def attach_config(request: HttpRequest, run_id: int, payload: ConfigIn) -> Any:
    """Attach (or replace) the run's config: shown and compared, never run."""
    external = _owned(request, run_id)
    config = _config(payload.config, payload.config_yaml)
    if config is None:
        raise field_error("config", "send the config as config (JSON) or config_yaml (text)")
    _answer(ext.external_config_attach, run=external.run, config=config)
    return _owned(request, run_id)


@router.post("/{int:run_id}/steps", response={200: CountOut, **ERRORS})
def append_steps(request: HttpRequest, run_id: int, payload: StepsIn) -> Any:
    """Store steps' metrics; a step sent again replaces it, a late one is stored in its place."""
    run = _owned(request, run_id).run
    steps = [ext.StepIn(s.step, s.metrics, s.wall_time) for s in payload.steps]
    for i, step in enumerate(payload.steps):
        long = next((name for name in step.metrics if len(name) > ext.MAX_NAME_CHARS), None)
        if long is not None:
            raise field_error(
                f"steps.{i}.metrics",
                f"the metric name {long[:40]!r}… is over {ext.MAX_NAME_CHARS} characters",
            )
    return {"stored": _answer(ext.external_steps_append, run=run, steps=steps)}


@router.post("/{int:run_id}/samples", response={200: CountOut, **ERRORS})
def append_samples(request: HttpRequest, run_id: int, payload: SamplesIn) -> Any:
    """Store samples; one sent again (same step, split, prompt and sample index) replaces itself."""
    run = _owned(request, run_id).run
    records = [
        _answer(
            ext.external_sample,
            step=s.step,
            split=s.split,
            prompt=s.prompt,
            response=s.response,
            reward=s.reward,
            sample_index=s.sample_index,
            prompt_index=s.prompt_index,
            reward_parts=s.reward_parts,
            ground_truth=s.ground_truth,
            data_source=s.data_source,
            group_id=s.group_id,
            advantage=s.advantage,
            response_length=s.response_length,
            truncated=s.truncated,
            tokens=s.tokens,
            token_ids=s.token_ids,
            token_logprobs=s.token_logprobs,
            token_ref_logprobs=s.token_ref_logprobs,
            token_advantages=s.token_advantages,
            key=f"samples.{i}",
        )
        for i, s in enumerate(payload.samples)
    ]
    return {"stored": _answer(ext.external_samples_append, run=run, samples=records)}


@router.delete("/{int:run_id}/samples", response={200: CountOut, **ERRORS})
def delete_samples(
    request: HttpRequest, run_id: int, step: int, split: SampleSplit = SampleSplit.TRAIN
) -> Any:
    """Delete one step's samples of one split (before sending a step again that changed)."""
    run = _owned(request, run_id).run
    return {"stored": _answer(ext.external_samples_delete, run=run, step=step, split=split)}


@router.post("/{int:run_id}/logs", response={200: CountOut, **ERRORS})
def append_logs(request: HttpRequest, run_id: int, payload: LogsIn) -> Any:
    """Append log lines from ``offset`` (lines already held are skipped); answer the count held."""
    run = _owned(request, run_id).run
    long = next((i for i, line in enumerate(payload.lines) if len(line) > ext.MAX_LOG_LINE_CHARS), None)  # fmt: skip
    if long is not None:
        raise field_error(
            f"lines.{long}",
            f"a log line is over {ext.MAX_LOG_LINE_CHARS} characters; split it or cut it",
            413,
        )
    held = _answer(ext.external_logs_append, run=run, offset=payload.offset, lines=payload.lines)
    return {"stored": held}


@router.post("/{int:run_id}/heartbeat", response={200: StateOut, **ERRORS})
def heartbeat(request: HttpRequest, run_id: int) -> Any:
    """Say the run lives; the answer carries ``cancel_requested`` for a client that polls it."""
    run: Run = _answer(ext.external_heartbeat, run=_owned(request, run_id).run)
    return {
        "id": run.pk,
        "status": run.status,
        "cancel_requested": run.cancel_requested,
        "latest_step": run.latest_step,
    }


@router.post("/{int:run_id}/finish", response={200: ExternalRunOut, **ERRORS})
def finish(request: HttpRequest, run_id: int, payload: FinishIn) -> Any:
    """End the run as succeeded, failed or cancelled (again with the same status: no change)."""
    external = _owned(request, run_id)
    _answer(ext.external_run_finish, run=external.run, status=payload.status, error=payload.error)
    return _owned(request, run_id)
