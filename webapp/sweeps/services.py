"""Write operations on sweeps: create (validate every member, then launch them all) and cancel.

A sweep that would take the owner past a run-count quota is refused first, from two counts,
before any member is built or validated (a 256-member sweep used to validate every member before
it was refused). Every member's config then passes the builder's check (``config_check``) and
the per-run caps (``run_size_errors``) before anything is written; the members are launched by
``run_create`` inside one transaction, which checks the quota again under the owner's lock, so
a refused launch leaves nothing behind. Members start through the usual start task;
``webapp.sweeps.slots`` holds them to the sweep's concurrency.

A ``tpe`` sweep launches only as many members as its concurrency; :func:`sweep_advance` draws
each next one (``webapp.sweeps.search``) when a member ends, called by the dispatch task every few
seconds. It holds the sweep's row lock (the lock ``slots`` takes) while it reads the members and
writes the new one, so two workers never launch the same slot twice. Before the sweep is created,
the config is checked at every bound and choice of the space (``spec.space_probes``); a drawn
member the config validator still refuses (two values that do not go together) stops the search
with the reason in ``Sweep.stop_reason``. The search keeps no state but the rows: each draw
rebuilds Optuna's study from the members (``webapp.sweeps.search`` says why not Optuna's RDB
storage), so a restart of the web app or the workers loses and repeats nothing.

A member the sweep's pruner stops (``webapp.sweeps.pruning``) ends cancelled; its slot goes to the
next member.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, IntegerField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from engine.config import ConfigFieldError, ConfigValidationError, PPOConfig, set_value
from webapp.experiments.configs import as_config, config_check
from webapp.experiments.datachecks import validation_data_sources
from webapp.experiments.models import Experiment
from webapp.runs.models import ACTIVE_STATUSES, Run
from webapp.runs.quotas import LaunchRefused, run_count_check, run_size_errors
from webapp.runs.services import LAUNCH_KEY_PATTERN, run_cancel, run_create
from webapp.sweeps.models import Sweep, SweepMember
from webapp.sweeps.search import suggest
from webapp.sweeps.selectors import REWARD_METRIC, member_histories
from webapp.sweeps.spec import expand_spec, parse_spec
from webapp.sweeps.trials import RUNNING, MemberHistory

logger = logging.getLogger(__name__)

# A sweep whose members all fail the same way says so this many times, then counts the rest.
MAX_REPORTED_ERRORS = 20


class SweepInvalid(ConfigValidationError):
    """The spec or a member's config is refused; each error names the key (and the member)."""


class SweepAlreadyCreated(Exception):
    """The launch key made a sweep before: ``sweep`` is that sweep."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        super().__init__(f"sweep {sweep.name!r} was already created from this form")


def member_label(index: int, total: int, values: dict[str, Any]) -> str:
    """Return ``member 2 of 9 (actor_rollout_ref.actor.optim.lr=3e-06)`` for an error message."""
    shown = ", ".join(f"{key}={value!r}" for key, value in values.items())
    return f"member {index} of {total} ({shown})"


def member_config(base: PPOConfig | dict[str, Any], values: dict[str, Any]) -> PPOConfig:
    """Return a copy of ``base`` with ``values`` set; ``ConfigFieldError`` for a value it refuses."""
    config = copy.deepcopy(as_config(base))
    for key, value in values.items():
        set_value(config, key, value)
    # As run_create does for a fresh run: the member is checked as it will be launched.
    set_value(config, "trainer.resume_mode", "disable")
    set_value(config, "trainer.resume_from_path", None)
    return config


def probe_label(values: dict[str, Any]) -> str:
    """Return ``the search space at (lr=1e-06, n=8)`` for an error of a tpe sweep's probe."""
    shown = ", ".join(f"{key}={value!r}" for key, value in values.items())
    return f"the search space at ({shown})"


VALIDATION_METRIC = re.compile(r"^val-(core|aux)/([^/]+)/([^/]+)/([^/]+)$")


def objective_metric_errors(*, config: PPOConfig, metric: str) -> list[ConfigFieldError]:
    """Return why no member of ``config`` would report ``metric`` (empty when one would).

    A member reports ``critic/score/mean`` at every step and verl's validation metrics
    (``val-core/<data source>/<variable>/<statistic>``) every ``trainer.test_freq`` steps, for the
    data sources of ``data.val_files``.
    """
    if metric == REWARD_METRIC:
        return []
    n = config.actor_rollout_ref.rollout.val_kwargs.n
    example = f"val-core/<data source>/reward/mean@{n}"
    found = VALIDATION_METRIC.match(metric)
    if found is None:
        return [
            ConfigFieldError(
                "objective.metric",
                metric,
                f"no member reports this metric: score members by a validation metric such as "
                f"{example} (or by {REWARD_METRIC}, the training reward)",
            )
        ]
    if config.trainer.test_freq <= 0 or not config.data.val_files:
        return [
            ConfigFieldError(
                "objective.metric",
                metric,
                f"no member reports it: the experiment never validates "
                f"(trainer.test_freq={config.trainer.test_freq}); set trainer.test_freq and "
                "data.val_files, or score members by " + REWARD_METRIC,
            )
        ]
    sources = validation_data_sources(config)
    if sources is not None and found.group(2) not in sources:
        named = ", ".join(f"val-core/{source}/reward/mean@{n}" for source in sources)
        return [
            ConfigFieldError(
                "objective.metric",
                metric,
                f"no member reports it: the validation data's sources are "
                f"{', '.join(sources) or 'none'}; e.g. {named or example}",
            )
        ]
    return []


def _member_errors(
    *, owner: Any, base: dict[str, Any], members: list[dict[str, Any]], probes: bool = False
) -> tuple[list[PPOConfig], list[ConfigFieldError]]:
    configs, errors = [], []
    for index, values in enumerate(members, start=1):
        label = probe_label(values) if probes else member_label(index, len(members), values)
        try:
            config = member_config(base, values)
        except ConfigFieldError as exc:
            errors.append(ConfigFieldError(exc.key, exc.value, f"{label}: {exc.message}"))
            continue
        found = run_size_errors(owner=owner, config=config)
        try:
            config_check(owner=owner, config=config)
        except ConfigValidationError as exc:
            found = [*exc.errors, *found]
        errors += [ConfigFieldError(e.key, e.value, f"{label}: {e.message}") for e in found]
        configs.append(config)
    if len(errors) > MAX_REPORTED_ERRORS:
        more = len(errors) - MAX_REPORTED_ERRORS
        errors = [
            *errors[:MAX_REPORTED_ERRORS],
            ConfigFieldError("", None, f"... and {more} more problem(s) like these"),
        ]
    return configs, errors


def sweep_create(
    *,
    experiment: Experiment,
    name: str,
    spec: Any,
    concurrency: int,
    launch_key: str = "",
) -> Sweep:
    """Expand ``spec`` over ``experiment``'s config and queue one run of it per member.

    A tpe sweep queues its first ``concurrency`` members (TPE's draws from no history yet); the
    dispatch task draws the rest (:func:`sweep_advance`).

    Raise ``SweepInvalid`` for a bad spec, concurrency, objective or member config (every
    problem, each naming its key and member), ``LaunchRefused`` when the members would take the
    owner past a run-count limit (checked before any member is built or validated), and
    ``SweepAlreadyCreated`` when ``launch_key`` made a sweep before; then nothing is created.
    """
    owner = experiment.owner
    if experiment.external:
        raise SweepInvalid(
            [
                ConfigFieldError(
                    "experiment",
                    experiment.pk,
                    f"{experiment.name} holds runs the studio did not launch; its config is data "
                    "to show, not to run: sweep an experiment built in the studio",
                )
            ]
        )
    if launch_key and not LAUNCH_KEY_PATTERN.fullmatch(launch_key):
        raise LaunchRefused("launch_key is malformed; reload the page for a fresh form")
    if launch_key:
        used = Sweep.objects.filter(owner=owner, launch_key=launch_key).first()
        if used is not None:
            raise SweepAlreadyCreated(used)
    errors = []
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        errors.append(
            ConfigFieldError("concurrency", concurrency, "give a whole number of 1 or more")
        )
    name = name.strip()
    if not name:
        errors.append(ConfigFieldError("name", name, "give the sweep a name"))
    try:
        canonical = parse_spec(spec)
    except ConfigValidationError as exc:
        raise SweepInvalid([*errors, *exc.errors]) from None
    searched = canonical["mode"] == "tpe"
    members = expand_spec(canonical)  # a tpe sweep's: the probes of its space
    first = len(members)  # a tpe sweep launches its concurrency's worth, then one per freed slot
    if searched:
        first = min(concurrency, canonical["count"]) if not errors else 1
    try:
        run_count_check(owner_id=owner.pk, runs=first)
    except LaunchRefused as exc:
        if searched:
            raise LaunchRefused(
                f"this sweep starts {first} members at once: {exc} (lower its concurrency)"
            ) from None
        raise LaunchRefused(
            f"this sweep has {len(members)} members: {exc} (a sweep launches all its members at "
            "once; sweep fewer values)"
        ) from None
    configs, member_errors = _member_errors(
        owner=owner, base=experiment.config, members=members, probes=searched
    )
    objective = canonical.get("objective")
    if objective is not None:  # after the members: their checks read the validation files first
        errors += objective_metric_errors(
            config=as_config(experiment.config), metric=objective["metric"]
        )
    if errors or member_errors:
        raise SweepInvalid([*errors, *member_errors])
    try:
        with transaction.atomic():
            sweep = Sweep.objects.create(
                owner=owner,
                experiment=experiment,
                name=name,
                spec=canonical,
                keys=list(canonical["params"]),
                concurrency=concurrency,
                launch_key=launch_key,
            )
            if searched:
                _draw_members(sweep=sweep, histories=[], slots=first, at_create=True)
                members, configs = [], []
            for index, (values, config) in enumerate(zip(members, configs, strict=True), 1):
                try:
                    run = run_create(experiment=experiment, config=config)
                except LaunchRefused as exc:
                    label = member_label(index, len(members), values)
                    raise LaunchRefused(
                        f"{label}: {exc} (a sweep launches all its members at once; sweep "
                        "fewer values)"
                    ) from None
                SweepMember.objects.create(sweep=sweep, index=index, run=run, values=values)
    except IntegrityError:
        used = (
            Sweep.objects.filter(owner=owner, launch_key=launch_key).first() if launch_key else None
        )
        if used is None:
            raise
        raise SweepAlreadyCreated(used) from None
    return sweep


def _draw_members(
    *, sweep: Sweep, histories: list[MemberHistory], slots: int, at_create: bool = False
) -> list[int]:
    """Draw and launch up to ``slots`` members of a tpe sweep; return their runs' ids.

    Call it holding the sweep's row lock. A drawn member the config refuses raises
    ``SweepInvalid`` at create; later it stops the search with the reason in ``stop_reason``.
    A member the owner's run quota refuses raises ``LaunchRefused`` at create; later it waits
    for the next call.
    """
    launched = []
    for _ in range(slots):
        index = len(histories) + 1
        values = suggest(sweep.spec, histories)
        label = member_label(index, sweep.spec["count"], values)
        try:
            with transaction.atomic():
                run = run_create(
                    experiment=sweep.experiment,
                    config=member_config(sweep.experiment.config, values),
                )
                SweepMember.objects.create(sweep=sweep, index=index, run=run, values=values)
        except ConfigFieldError as exc:
            found = [exc]
        except ConfigValidationError as exc:
            found = list(exc.errors)
        except LaunchRefused as exc:
            if at_create:
                raise LaunchRefused(f"{label}: {exc}") from None
            logger.info("sweep %s waits to launch %s: %s", sweep.pk, label, exc)
            break  # the next call of the dispatch task tries again
        else:
            launched.append(run.pk)
            histories.append(MemberHistory(index=index, values=values, state=RUNNING))
            continue
        errors = [ConfigFieldError(e.key, e.value, f"{label}: {e.message}") for e in found]
        if at_create:
            raise SweepInvalid(errors)
        reason = "; ".join(str(e) for e in errors)
        Sweep.objects.filter(pk=sweep.pk).update(
            stop_reason=f"the search stopped: the config refused a drawn member: {reason}"
        )
        break
    return launched


def sweep_advance(*, sweep_id: int) -> list[int]:
    """Launch a tpe sweep's next members into its free slots; return the new runs' ids.

    A slot is free when fewer than ``concurrency`` members are queued, starting or running; a
    pruned member's slot frees when its run ends. Nothing for a cancelled or stopped sweep, one
    with all its members, or one of another mode. The sweep's row stays locked meanwhile, so a
    second worker calling it at once waits, then finds the slots taken.
    """
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().select_related("experiment").get(pk=sweep_id)
        spec = sweep.spec
        if spec["mode"] != "tpe" or sweep.cancelled_at is not None or sweep.stop_reason:
            return []
        histories = member_histories(sweep=sweep)
        # A pruned member holds its slot until its run ends.
        busy = Run.objects.filter(sweep_member__sweep=sweep, status__in=ACTIVE_STATUSES).count()
        slots = min(sweep.concurrency - busy, spec["count"] - len(histories))
        if slots <= 0:
            return []
        return _draw_members(sweep=sweep, histories=histories, slots=slots)


def sweeps_advance() -> list[int]:
    """Advance every tpe sweep that has members left to draw; return the new runs' ids.

    The dispatch task calls it before it starts queued runs. A sweep that fails is logged and
    skipped: the others still advance.
    """
    ids = (
        Sweep.objects.filter(spec__mode="tpe", cancelled_at__isnull=True, stop_reason="")
        .annotate(member_count=Count("members"))
        .filter(member_count__lt=Cast(KT("spec__count"), IntegerField()))
        .values_list("pk", flat=True)
    )
    launched = []
    for sweep_id in list(ids):
        try:
            launched += sweep_advance(sweep_id=sweep_id)
        except Exception:
            logger.exception("sweep %s could not launch its next member", sweep_id)
    return launched


def sweep_cancel(*, sweep: Sweep) -> Sweep:
    """Cancel ``sweep``: queued members end now and never start; running ones stop after a step.

    The cancel is stored first, so a member the dispatch sweep is claiming at this instant is
    refused its driver (``slots.sweep_member_may_start``); each member goes through ``run_cancel``.
    """
    Sweep.objects.filter(pk=sweep.pk, cancelled_at__isnull=True).update(cancelled_at=timezone.now())
    for run in Run.objects.filter(sweep_member__sweep=sweep, status__in=ACTIVE_STATUSES):
        run_cancel(run=run)
    sweep.refresh_from_db()
    return sweep
