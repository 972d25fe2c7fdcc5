"""Write operations on sweeps: create (validate every member, then launch them all) and cancel.

A sweep that would take the owner past a run-count quota is refused first, from two counts,
before any member is built or validated (a 256-member sweep used to validate every member before
it was refused). Every member's config then passes the builder's check (``config_check``) and
the per-run caps (``run_size_errors``) before anything is written; the members are launched by
``run_create`` inside one transaction, which checks the quota again under the owner's lock, so
a refused launch leaves nothing behind. Members start through the usual start task;
``webapp.sweeps.slots`` holds them to the sweep's concurrency.
"""

from __future__ import annotations

import copy
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from engine.config import ConfigFieldError, ConfigValidationError, PPOConfig, set_value
from webapp.experiments.configs import as_config, config_check
from webapp.experiments.models import Experiment
from webapp.runs.models import ACTIVE_STATUSES, Run
from webapp.runs.quotas import LaunchRefused, run_count_check, run_size_errors
from webapp.runs.services import LAUNCH_KEY_PATTERN, run_cancel, run_create
from webapp.sweeps.models import Sweep, SweepMember
from webapp.sweeps.spec import expand_spec, parse_spec

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


def _member_errors(
    *, owner: Any, base: dict[str, Any], members: list[dict[str, Any]]
) -> tuple[list[PPOConfig], list[ConfigFieldError]]:
    configs, errors = [], []
    for index, values in enumerate(members, start=1):
        label = member_label(index, len(members), values)
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

    Raise ``SweepInvalid`` for a bad spec, concurrency or member config (every problem, each
    naming its key and member), ``LaunchRefused`` when the members would take the owner past a
    run-count limit (checked before any member is built or validated), and
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
    members = expand_spec(canonical)
    try:
        run_count_check(owner_id=owner.pk, runs=len(members))
    except LaunchRefused as exc:
        raise LaunchRefused(
            f"this sweep has {len(members)} members: {exc} (a sweep launches all its members at "
            "once; sweep fewer values)"
        ) from None
    configs, member_errors = _member_errors(owner=owner, base=experiment.config, members=members)
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
