"""Write operations on external runs: create, attach the config, append steps, samples and log
lines, beat the heartbeat, finish.

An external run is written through the same functions as a studio run's driver writes its own
(``webapp.runs.driver_writes``): a step lands in one transaction (``run_record_step``: metrics,
health checks, heartbeat), samples go in by COPY (``samples_write``), and the same live events go
to the run's group (``webapp.runs.events.step_events``). So the charts, the inspector, the health
checks, the runs table, compare and diff read an external run as any other.

Every append is idempotent. A step is keyed by (run, step): sending it again merges into it
(its values replace those of the same names), and a late step (sent after later ones) is stored
without moving the run's latest step back. A sample
is keyed by (run, step, split, prompt_index, sample_index): a batch sent again replaces its own
rows only, so a large step may come in several batches. Log lines carry their position: lines
the studio has are skipped, a gap is refused.

An external run's config is data to show: it is stored as sent (made storable: NaN as null, no
NUL) and is never read by ``engine.config``'s loader, queued for a driver, resumed or cloned
(``webapp.runs.services.refuse_external``). Its unknown keys are marked for display only
(:func:`external_unknown_keys`).

A run whose client went quiet is marked lost by the usual sweep (its heartbeat is stale); the
client's next append or heartbeat makes it running again, so a restart of the client or of the
studio loses nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Avg, Count, Max, Q
from django.utils import timezone

from engine.config import ConfigFieldError
from engine.data.preview import display_text
from engine.trainer.reporting import SampleRecord
from webapp.experiments.models import Experiment
from webapp.external.models import ExternalRun, ExternalSource
from webapp.runs.driver_writes import (
    publish_status_on_commit,
    run_finish,
    run_record_step,
    samples_write,
    transition,
)
from webapp.runs.events import publish_run_event, run_event, samples_event, step_events
from webapp.runs.models import (
    ACTIVE_STATUSES,
    EXTERNAL_DRIVER_PREFIX,
    MetricPoint,
    Run,
    RunStatus,
)
from webapp.runs.selectors import flatten_config
from webapp.runs.services import LAUNCH_KEY_PATTERN, run_dir

# What one request may carry; the API answers past these with the limit and the fix.
# The largest step, index or count a report may carry: the database's integer columns hold no more.
MAX_COUNT = 2_147_483_647
MAX_STEPS_PER_REQUEST = 1000
MAX_SAMPLES_PER_REQUEST = 5000
MAX_METRICS_PER_STEP = 2000
MAX_NAME_CHARS = 200
MAX_TEXT_CHARS = 1_000_000
MAX_TOKENS = 131_072
MAX_LOG_LINES_PER_REQUEST = 5000
MAX_LOG_LINE_CHARS = 16_384
MAX_CONFIG_BYTES = 1_000_000
MAX_JSON_DEPTH = 32
LOG_FILE = "driver.log"
LOG_MAX_BYTES = 64 * 1024**2


class ExternalRunError(Exception):
    """The request cannot be applied to the run; the message says why and what to do."""

    status = 409


class ExternalInputError(ExternalRunError):
    """A value the studio cannot store; ``key`` names it."""

    status = 400

    def __init__(self, key: str | None, message: str, status: int = 400) -> None:
        self.key = key
        self.status = status
        super().__init__(message)


# -- what is stored ---------------------------------------------------------------------------


def storable(value: Any, key: str = "config", depth: int = 0) -> Any:
    """Return JSON ``value`` as PostgreSQL stores it: NaN and inf as null, NUL and lone
    surrogates replaced; ExternalInputError past ``MAX_JSON_DEPTH`` levels."""
    if depth > MAX_JSON_DEPTH:
        raise ExternalInputError(
            key, f"nested deeper than {MAX_JSON_DEPTH} levels; send a flatter value"
        )
    if isinstance(value, str):
        return display_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {display_text(str(k)): storable(v, key, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v, key, depth + 1) for v in value]
    return value


def config_for_display(config: Mapping[str, Any], key: str = "config") -> dict[str, Any]:
    """Return an external run's config as stored: storable, at most ``MAX_CONFIG_BYTES`` of JSON."""
    clean = storable(dict(config), key)
    size = len(json.dumps(clean))
    if size > MAX_CONFIG_BYTES:
        raise ExternalInputError(
            key,
            f"the config is {size:,} bytes of JSON, over the {MAX_CONFIG_BYTES:,} the studio "
            "keeps; leave out large values (datasets, prompts) and send the rest",
            status=413,
        )
    return clean


def external_unknown_keys(config: Mapping[str, Any]) -> list[str]:
    """Return the dotted keys of ``config`` that the engine's schema does not know, sorted.

    Only the key is looked up (``engine.config.loader.resolve_key``): nothing is loaded or
    checked, and an unknown key is shown marked, never refused. verl's newer keys and a
    trainer's own extras land here.
    """
    from engine.config.keys import resolve_key

    unknown = []
    for key in flatten_config(dict(config)):
        try:
            resolve_key(key)
        except ConfigFieldError:
            unknown.append(key)
    return sorted(unknown)


def prompt_index_of(prompt: str) -> int:
    """Return the prompt's index when its client sends none: 31 bits of its BLAKE2b digest.

    The same text gets the same index at every step and in every run, so the inspector's group,
    across-steps and across-runs views find it (an index is an ``integer`` column).
    """
    digest = hashlib.blake2b(prompt.encode("utf-8", "replace"), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _floats(values: Sequence[float | None] | None) -> list[float] | None:
    # A null entry (JSON has no NaN) is stored as NaN, which the token view shows as missing.
    return None if values is None else [math.nan if v is None else float(v) for v in values]


def external_sample(
    *,
    step: int,
    prompt: str,
    response: str,
    reward: float | None,
    sample_index: int,
    split: str = "train",
    prompt_index: int | None = None,
    reward_parts: Mapping[str, Any] | None = None,
    ground_truth: Any = None,
    data_source: str = "",
    group_id: str = "",
    advantage: float | None = None,
    response_length: int | None = None,
    truncated: bool = False,
    tokens: Sequence[str] | None = None,
    token_ids: Sequence[int] | None = None,
    token_logprobs: Sequence[float | None] | None = None,
    token_ref_logprobs: Sequence[float | None] | None = None,
    token_advantages: Sequence[float | None] | None = None,
    key: str = "sample",
) -> SampleRecord:
    """Return the ``SampleRecord`` of one sample an external client sent.

    ``prompt_index`` defaults to :func:`prompt_index_of` the prompt. Without ``tokens``, the
    ``token_ids`` are shown as their numbers (the studio has no tokenizer of the run's model:
    send ``tokens`` for readable text). The per-token arrays must match the tokens in length;
    ``response_length`` defaults to their count. A ground truth that is not text (verl allows
    lists and numbers) is stored as its JSON. ExternalInputError names the bad field.
    """
    if tokens is None and token_ids is not None:
        tokens = [str(t) for t in token_ids]
    elif tokens is not None and token_ids is not None and len(token_ids) != len(tokens):
        raise ExternalInputError(
            f"{key}.token_ids", f"{len(token_ids)} ids for {len(tokens)} tokens; send as many"
        )
    arrays = {
        "token_logprobs": token_logprobs,
        "token_ref_logprobs": token_ref_logprobs,
        "token_advantages": token_advantages,
    }
    for name, values in arrays.items():
        if values is None:
            continue
        if tokens is None:
            raise ExternalInputError(
                f"{key}.{name}", f"{name} needs the tokens they belong to: send tokens or token_ids"
            )
        if len(values) != len(tokens):
            raise ExternalInputError(
                f"{key}.{name}",
                f"{len(values)} values for {len(tokens)} tokens; send one per response token",
            )
    if ground_truth is not None and not isinstance(ground_truth, str):
        ground_truth = json.dumps(storable(ground_truth, f"{key}.ground_truth"))
    prompt = display_text(prompt)
    return SampleRecord(
        step=step,
        split=split,
        prompt_index=prompt_index_of(prompt) if prompt_index is None else prompt_index,
        sample_index=sample_index,
        group_id=display_text(group_id),
        data_source=display_text(data_source),
        prompt_text=prompt,
        response_text=display_text(response),
        ground_truth=None if ground_truth is None else display_text(ground_truth),
        reward=math.nan if reward is None else float(reward),
        reward_parts=storable(dict(reward_parts or {}), f"{key}.reward_parts"),
        advantage=_finite(advantage),
        response_length=(
            response_length
            if response_length is not None
            else len(tokens)
            if tokens is not None
            else 0
        ),
        truncated=truncated,
        tokens=[display_text(t) for t in tokens or ()],
        token_logprobs=_floats(token_logprobs) or [],
        token_ref_logprobs=_floats(token_ref_logprobs),
        token_advantages=_floats(token_advantages),
    )


# -- the run ----------------------------------------------------------------------------------


def external_experiment(*, owner: Any, name: str, source: str) -> Experiment:
    """Return the owner's external experiment called ``name``, made on first use.

    An external experiment only groups runs: its config stays empty and it never launches.
    """
    found = (
        Experiment.objects.filter(owner=owner, name=name, external=True, archived=False)
        .order_by("-updated_at")
        .first()
    )
    if found is not None:
        return found
    return Experiment.objects.create(
        owner=owner,
        name=name,
        external=True,
        config={},
        description=f"Runs reported by {ExternalSource(source).label}; the studio did not "
        "launch them and cannot launch them.",
    )


def _active_external_runs(owner_id: int) -> int:
    return Run.objects.filter(
        owner_id=owner_id, experiment__external=True, status__in=ACTIVE_STATUSES
    ).count()


def external_run_create(
    *,
    owner: Any,
    key: str,
    name: str,
    source: str,
    location: str = "",
    client: str = "",
    cancel_honoured: bool = False,
    config: Mapping[str, Any] | None = None,
    total_steps: int | None = None,
    tags: Sequence[str] = (),
) -> tuple[Run, bool]:
    """Create a running external run of ``owner``; return it and whether it is new.

    ``key`` (16-64 letters, digits, ``-``, ``_``) makes the call idempotent: the same key again
    returns the run it made. The run joins the owner's external experiment ``name``. Refused
    (ExternalRunError, 429) when the owner already has ``POSTTRAIN_MAX_ACTIVE_EXTERNAL_RUNS``
    active external runs.
    """
    from webapp.experiments.services import clean_tags

    if not LAUNCH_KEY_PATTERN.fullmatch(key):
        raise ExternalInputError(
            "key", "the key must be 16 to 64 letters, digits, '-' or '_' (a random id the client "
            "keeps, so a retried create finds its run)"
        )  # fmt: skip
    name = display_text(name.strip())[:200]
    if not name:
        raise ExternalInputError("name", "name the experiment the run belongs to")
    stored_config = config_for_display(config or {})
    stored_tags = clean_tags(list(tags))
    with transaction.atomic():
        # One create of a user at a time: the key lookup and the count stay true until written.
        get_user_model().objects.select_for_update(no_key=True).filter(pk=owner.pk).first()
        found = ExternalRun.objects.filter(owner=owner, key=key).select_related("run").first()
        if found is not None:
            return found.run, False
        limit = settings.POSTTRAIN_MAX_ACTIVE_EXTERNAL_RUNS
        active = _active_external_runs(owner.pk)
        if active >= limit:
            error = ExternalRunError(
                f"POSTTRAIN_MAX_ACTIVE_EXTERNAL_RUNS allows {limit} active external runs per "
                f"user and you have {active}; finish the ones that ended (or let them go lost) "
                "before reporting another"
            )
            error.status = 429
            raise error
        experiment = external_experiment(owner=owner, name=name, source=source)
        Experiment.objects.select_for_update().filter(pk=experiment.pk).first()
        last = experiment.runs.aggregate(last=Max("number"))["last"] or 0
        now = timezone.now()
        run = Run.objects.create(
            experiment=experiment,
            owner=owner,
            number=last + 1,
            status=RunStatus.RUNNING,
            config=stored_config,
            started_at=now,
            heartbeat_at=now,
            total_steps=total_steps,
            driver=f"{EXTERNAL_DRIVER_PREFIX}{source}",
            tags=stored_tags,
        )
        ExternalRun.objects.create(
            run=run,
            owner=owner,
            key=key,
            source=source,
            location=display_text(location)[:500],
            client=display_text(client)[:100],
            cancel_honoured=cancel_honoured,
        )
        Experiment.objects.filter(pk=experiment.pk).update(updated_at=now)
        publish_status_on_commit(run.pk)
    return run, True


def external_config_attach(*, run: Run, config: Mapping[str, Any]) -> Run:
    """Replace the run's config (shown on its page and in diffs; never run)."""
    run.config = config_for_display(config)
    Run.objects.filter(pk=run.pk).update(config=run.config)
    return run


def _writable(run: Run) -> None:
    """Refuse a write to a run that ended; make a lost run (its client came back) running."""
    status = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if status == RunStatus.LOST:
        transition(
            run.pk,
            [RunStatus.LOST],
            RunStatus.RUNNING,
            finished_at=None,
            error="",
            heartbeat_at=timezone.now(),
        )
    elif status != RunStatus.RUNNING:
        raise ExternalRunError(
            f"run #{run.pk} has ended ({status}); it takes no more steps, samples or log "
            "lines. Report a new run to go on"
        )


@dataclass(frozen=True)
class StepIn:
    """One step an external client sent: its metrics under verl's names."""

    step: int
    metrics: Mapping[str, float | None]
    wall_time: datetime | None = None


def external_steps_append(*, run: Run, steps: Sequence[StepIn]) -> int:
    """Store ``steps`` (each in its own transaction, oldest first); return how many.

    A step already stored is merged with: the new values replace those of the same names, the
    names the new one lacks are kept. So a retry changes nothing, and a trainer that logs one
    step in several calls (TRL's train and summary logs, verl's validation before a resumed
    run's first step) keeps every value. One ``metrics`` event goes out for the newest: a page
    that missed the others reads them from PostgreSQL, where they landed first.
    """
    _writable(run)
    point = None
    newest = None
    for item in sorted(steps, key=lambda s: s.step):
        metrics = {display_text(name): value for name, value in item.metrics.items()}
        with transaction.atomic():
            _lock_run_writes(run.pk)
            stored = (
                MetricPoint.objects.filter(run_id=run.pk, step=item.step)
                .values_list("metrics", flat=True)
                .first()
            )
            point = run_record_step(
                run_id=run.pk,
                step=item.step,
                metrics={**(stored or {}), **metrics},
                wall_time=item.wall_time,
            )
        newest = item.step
    if point is not None and newest is not None:
        for message in step_events(run.pk, newest, point=point):
            publish_run_event(message)
    return len(steps)


def _lock_run_writes(run_id: int) -> None:
    # Two requests with the same sample keys (a client's retry racing its first try) take
    # turns, so a key's delete-then-insert never interleaves with another's.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [0x65787472, run_id])


def external_samples_append(*, run: Run, samples: Sequence[SampleRecord]) -> int:
    """Store ``samples`` by COPY, one transaction per step; return how many.

    A sample already stored under the same (step, split, prompt_index, sample_index) is
    replaced, so a batch sent again never doubles. One ``samples`` event per step and split.
    """
    _writable(run)
    by_step: dict[int, list[SampleRecord]] = {}
    for sample in samples:
        by_step.setdefault(sample.step, []).append(sample)
    for step in sorted(by_step):
        batch = by_step[step]
        with transaction.atomic():
            _lock_run_writes(run.pk)
            samples_write(run_id=run.pk, samples=batch, replace="keys")
        # A step may come in parts: each event carries what its (step, split) holds so far, so
        # a page that keeps the last count per (step, split) shows the whole.
        for split in sorted({s.split for s in batch}):
            totals = run.samples.filter(step=step, split=split).aggregate(
                count=Count("pk"),
                mean=Avg("reward", filter=Q(reward__gt=-math.inf, reward__lt=math.inf)),
            )
            publish_run_event(samples_event(run.pk, step, split, totals["count"], totals["mean"]))
    Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(heartbeat_at=timezone.now())
    return len(samples)


def external_samples_delete(*, run: Run, step: int, split: str) -> int:
    """Delete the run's samples of one step and split (a client re-sends a step that changed)."""
    _writable(run)
    deleted, _ = run.samples.filter(step=step, split=split).delete()
    return deleted


def external_logs_append(*, run: Run, offset: int, lines: Sequence[str]) -> int:
    """Append log lines ``offset, offset + 1, ...`` to the run's log; return the lines it holds.

    Lines the studio already has are skipped, so a batch sent again is not doubled; an
    ``offset`` past them is a gap, refused. The log is ``driver.log`` in the run's folder, as a
    studio run's, and holds at most ``LOG_MAX_BYTES``.
    """
    _writable(run)
    with transaction.atomic():
        external = ExternalRun.objects.select_for_update().get(run=run)
        held = external.log_lines
        if offset > held:
            raise ExternalRunError(
                f"the studio holds {held} log lines of run #{run.pk} and these start at "
                f"line {offset}; send from line {held}"
            )
        new = [display_text(line.rstrip("\n")) for line in lines[held - offset :]]
        if not new:
            return held
        path = run_dir(run.pk) / LOG_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(line + "\n" for line in new).encode()
        size = path.stat().st_size if path.exists() else 0
        if size + len(data) > LOG_MAX_BYTES:
            raise ExternalInputError(
                "lines",
                f"the run's log would pass {LOG_MAX_BYTES // 1024**2} MiB, the most the studio "
                "keeps; later lines are not stored (keep the full log where the run lives)",
                status=413,
            )
        with open(path, "ab") as f:
            f.write(data)
        external.log_lines = held + len(new)
        external.save(update_fields=["log_lines"])
    return external.log_lines


def external_heartbeat(*, run: Run) -> Run:
    """Beat the run's heartbeat (making a lost run running again); return it as stored."""
    _writable(run)
    Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(heartbeat_at=timezone.now())
    publish_run_event(run_event(run.pk, "heartbeat"))
    run.refresh_from_db()
    return run


FINISH_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


def external_run_finish(*, run: Run, status: str | None, error: str = "") -> Run:
    """End the run with ``status``; finishing again with the same status changes nothing."""
    if status not in FINISH_STATUSES:
        raise ExternalInputError(
            "status", f"status={status!r}: a run finishes as succeeded, failed or cancelled"
        )
    if not run_finish(run_id=run.pk, status=status, error=display_text(error)):
        current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
        if current != status:
            raise ExternalRunError(f"run #{run.pk} has already ended as {current}")
    run.refresh_from_db()
    return run


def external_runs_of(runs: Iterable[Run]) -> dict[int, ExternalRun]:
    """Return the ``ExternalRun`` rows of those of ``runs`` that are external, by run id."""
    ids = [run.pk for run in runs]
    return {e.run_id: e for e in ExternalRun.objects.filter(run_id__in=ids)}
