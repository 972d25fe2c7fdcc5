"""``/api/sweeps``: create a sweep over one of your experiments, list, read (members with their
values and headline metrics, pruned members and why, the best member so far), cancel. The spec is
``webapp.sweeps.spec``'s JSON (grid, random or tpe; an objective; a pruner); every member (of a
tpe sweep: every bound and choice of its space) is checked by ``sweep_create`` before anything is
created, each error keyed by its config key or spec field (``pruner.n_warmup_steps``)."""

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from ninja.pagination import paginate

from webapp.api.errors import ErrorOut
from webapp.api.pagination import Pages
from webapp.experiments.selectors import experiment_list_for_user
from webapp.projects.access import EDIT, VIEW, experiment_to_sweep, sweep_for
from webapp.runs.models import RunStatus
from webapp.runs.services import LAUNCH_KEY_PATTERN
from webapp.sweeps.models import Sweep, SweepStatus
from webapp.sweeps.selectors import (
    best_member,
    member_histories,
    strategy_text,
    sweep_list_for_user,
    sweep_member_rows,
)
from webapp.sweeps.services import SweepAlreadyCreated, sweep_cancel, sweep_create

router = Router(tags=["sweeps"])
ERRORS: dict[int | tuple[int, ...], Any] = {(400, 403, 404, 409, 422, 429): ErrorOut}


class SweepOut(Schema):
    id: int
    name: str
    experiment_id: int
    spec: dict[str, Any] = Field(
        description="mode, params; for random and tpe count and seed; objective and pruner."
    )
    strategy: str = Field(description="How it searches and stops, in words.")
    stop_reason: str = Field(description="Why a tpe sweep drew no more members; empty if none.")
    keys: list[str] = Field(description="The swept config keys in the spec's order.")
    concurrency: int
    status: SweepStatus
    member_count: int
    active_count: int
    created_at: datetime
    cancelled_at: datetime | None

    @staticmethod
    def resolve_strategy(obj: Sweep) -> str:
        return strategy_text(obj.spec)


class MemberOut(Schema):
    index: int
    run_id: int
    run_number: int
    status: RunStatus
    values: dict[str, Any]
    reward_final: float | None = Field(description="critic/score/mean at its last step.")
    reward_best: float | None
    validation_final: float | None = Field(description="Mean of val-core/.../mean@n.")
    validation_best: float | None
    objective_final: float | None = Field(
        description="The objective metric at its last recorded step (a sweep with an objective)."
    )
    pruned: dict[str, Any] | None = Field(
        description="Why the pruner stopped it: metric, step, value, threshold, pruner, text."
    )


class BestOut(Schema):
    index: int
    run_id: int
    value: float
    values: dict[str, Any]


class SweepDetail(SweepOut):
    members: list[MemberOut] = Field(alias="member_rows")
    best: BestOut | None = Field(
        None,
        alias="best_member",
        description="The finished member with the best objective so far (a sweep with one).",
    )


class SweepIn(Schema):
    experiment: int = Field(description="The experiment whose config every member starts from.")
    name: str = Field("", max_length=200, description="Default: the experiment's name.")
    spec: dict[str, Any] = Field(
        description='e.g. {"mode": "grid", "params": {"actor_rollout_ref.actor.optim.lr": '
        '[1e-6, 1e-5]}} or {"mode": "random" | "tpe", "count": 8, "seed": 0, "params": {key: '
        '{"log_uniform": [lo, hi]} | {"uniform": ...} | {"int": ...} | [choices]}}; tpe also '
        '"n_startup_trials" (10) and "objective": {"metric": "val-core/<source>/reward/mean@1", '
        '"direction": "maximize" | "minimize"}; any mode "pruner": {"type": "median", '
        '"n_startup_trials": 5, "n_warmup_steps": 0, "interval_steps": 1} | {"type": '
        '"successive_halving", "min_resource": 1, "reduction_factor": 3, '
        '"min_early_stopping_rate": 0} (with an objective)'
    )
    concurrency: int = Field(1, ge=1, le=1000, description="Members running at once.")
    launch_key: str = Field(
        "",
        pattern=f"^(?:{LAUNCH_KEY_PATTERN.pattern})?$",
        description="Optional: the same key again returns the sweep it made, not a new one.",
    )


def owned_sweep(request: HttpRequest, sweep_id: int, need: str = VIEW) -> Sweep:
    """Return the sweep (annotated as the list is) if the user holds ``need`` on it: 404
    without a view right, 403 without ``need`` (``webapp.projects.access``)."""
    return sweep_for(request.user, sweep_id, need, queryset=sweep_list_for_user(user=request.user))


def detail(sweep: Sweep) -> Sweep:
    """Return ``sweep`` holding its members' rows and its best member for ``SweepDetail``."""
    histories = member_histories(sweep=sweep) if "objective" in sweep.spec else []
    finals = {h.index: h.final for h in histories}
    best = best_member(sweep=sweep, histories=histories)
    rows = sweep_member_rows(sweep=sweep)
    sweep.best_member = (  # type: ignore[attr-defined]
        None
        if best is None
        else {
            "index": best.index,
            "run_id": next(r.run.pk for r in rows if r.member.index == best.index),
            "value": best.final,
            "values": best.values,
        }
    )
    sweep.member_rows = [  # type: ignore[attr-defined]
        {
            "index": row.member.index,
            "run_id": row.run.pk,
            "run_number": row.run.number,
            "status": row.run.status,
            "values": row.member.values,
            "reward_final": row.reward.final,
            "reward_best": row.reward.best,
            "validation_final": row.validation.final,
            "validation_best": row.validation.best,
            "objective_final": finals.get(row.member.index),
            "pruned": row.member.pruned,
        }
        for row in rows
    ]
    return sweep


@router.get("", response=list[SweepOut])
@paginate(Pages)
def list_sweeps(request: HttpRequest) -> Any:
    """List your sweeps, newest first."""
    return sweep_list_for_user(user=request.user)


@router.post("", response={200: SweepDetail, 201: SweepDetail, **ERRORS})
def create_sweep(request: HttpRequest, payload: SweepIn) -> Any:
    """Create a sweep and queue its members (201); a repeated ``launch_key`` returns it (200)."""
    experiment = experiment_to_sweep(
        request.user,
        payload.experiment,
        queryset=experiment_list_for_user(user=request.user, archived=None),
    )
    try:
        sweep = sweep_create(
            experiment=experiment,
            name=payload.name or experiment.name,
            spec=payload.spec,
            concurrency=payload.concurrency,
            launch_key=payload.launch_key,
        )
    except SweepAlreadyCreated as exc:
        return Status(200, detail(owned_sweep(request, exc.sweep.pk)))
    return Status(201, detail(owned_sweep(request, sweep.pk)))


@router.get("/{int:sweep_id}", response={200: SweepDetail, **ERRORS})
def read_sweep(request: HttpRequest, sweep_id: int) -> Any:
    """Read a sweep with each member's swept values, status and headline metrics."""
    return detail(owned_sweep(request, sweep_id))


@router.post("/{int:sweep_id}/cancel", response={200: SweepDetail, **ERRORS})
def cancel_sweep(request: HttpRequest, sweep_id: int) -> Any:
    """Cancel: queued members end now and never start, running ones after their step."""
    sweep_cancel(sweep=owned_sweep(request, sweep_id, EDIT))
    return detail(owned_sweep(request, sweep_id))
