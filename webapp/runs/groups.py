"""Run groups: runs whose resolved configs differ only by their seeds, or only by a chosen key.

Five runs of one config with ``trainer.seed`` 1 to 5 are one experiment repeated; their curves
read best as one mean with a band (``webapp.runs.bands``). The grouping is computed from each
run's stored resolved config (``Run.config``), flattened to dotted keys: runs with equal values on
every key except the ignored ones fall in one group. Grouping ``by="seed"`` ignores every seed key
of the engine's schema (``is_seed_key``: a key named ``seed`` or ``*_seed``, such as
``trainer.seed``, ``data.seed`` and ``actor_rollout_ref.actor.data_loader_seed``), so it holds
without a list to keep up to date; grouping by a key ignores that key alone. Keys that differ
between any two runs by construction (``RUN_SPECIFIC_KEYS``, the resume settings) are always
ignored.

A run that another run resumed is left out: its resumption's history holds its steps
(``webapp.runs.history``), so the chain is counted once. Groups are formed only from the runs the
caller passes in, which the views take from ``run_list_for_user``: a group never holds a run its
viewer may not see.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db.models import Exists, OuterRef, QuerySet

from webapp.runs.models import Run
from webapp.runs.selectors import RUN_SPECIFIC_KEYS, flatten_config, run_list_for_user

T = TypeVar("T")
BY_SEED = "seed"
# Keys that differ between a run and its resumption by construction (``services.run_resume``).
RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path")
IGNORED_KEYS = frozenset(RUN_SPECIFIC_KEYS + RESUME_KEYS)
_SEED_KEY = re.compile(r"(^|[._])seed$")
_KEY = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
# A group's band reads at most this many members (the newest first, as the runs come).
GROUP_MAX_MEMBERS = 50
# A group's label names at most this many of the keys that tell it from the others.
LABEL_KEYS = 3


class GroupByError(ValueError):
    """A grouping the runs cannot be grouped by; the message says what to pass instead."""


@functools.lru_cache(maxsize=4096)
def is_seed_key(key: str) -> bool:
    """Return whether a dotted config key is a seed (its last part is ``seed`` or ``*_seed``)."""
    return bool(_SEED_KEY.search(key.rpartition(".")[2]))


@dataclass
class RunGroup:
    """Runs with one config apart from the ``by`` keys: ``token`` names it in links."""

    by: str
    token: str
    runs: list[Run]
    shared: dict[str, Any] = field(repr=False)
    varied: dict[str, list[Any]] = field(default_factory=dict)
    label: str = ""
    flats: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)  # run id: config

    @property
    def run_ids(self) -> list[int]:
        return [run.pk for run in self.runs]

    @property
    def drawn_ids(self) -> str:
        """Return the ids of the members the band reads, comma-separated (the page's data)."""
        return ",".join(str(pk) for pk in self.run_ids[:GROUP_MAX_MEMBERS])

    @property
    def active_ids(self) -> str:
        """Return the ids of the drawn members still queued or running, with their last steps."""
        drawn = self.runs[:GROUP_MAX_MEMBERS]
        return ",".join(f"{run.pk}:{run.latest_step}" for run in drawn if run.is_active)

    @property
    def members_text(self) -> str:
        """Return the members as the hover lists them: ``#3 (seed 1), #4 (seed 2)``."""
        ordered = sorted(self.runs, key=lambda run: run.pk)
        return ", ".join(f"#{run.pk}{_varied_text(self, run)}" for run in ordered)


def _varied_text(group: RunGroup, run: Run) -> str:
    values = group.flats[run.pk]
    parts = [f"{key.rpartition('.')[2]} {values.get(key)}" for key in group.varied]
    return f" ({', '.join(parts)})" if parts else ""


def check_group_by(by: str) -> str:
    """Return ``by`` stripped if it is ``seed``, empty (no grouping) or a dotted key; else raise."""
    by = by.strip()
    if by and by != BY_SEED and not _KEY.fullmatch(by):
        raise GroupByError(
            f"group={by[:80]!r} is not a config key; group by seed, by a dotted key such as "
            "actor_rollout_ref.actor.optim.lr, or leave it empty"
        )
    return by


def _ignored(by: str, keys: Iterable[str]) -> set[str]:
    if by == BY_SEED:
        return {key for key in keys if is_seed_key(key)} | IGNORED_KEYS
    return {by} | IGNORED_KEYS


def _token(by: str, signature: str) -> str:
    return f"{by}:{hashlib.sha256(signature.encode()).hexdigest()[:16]}"


def group_runs(runs: Sequence[Run], *, by: str = BY_SEED) -> list[RunGroup]:
    """Return ``runs`` grouped by config apart from ``by``'s keys, in the order they came.

    Each group keeps its runs in the order given and comes where its first run came. ``by`` is
    ``"seed"`` (every seed key ignored) or a dotted key that some run's config holds (else
    ``GroupByError``). Single runs make groups of one.
    """
    by = check_group_by(by)
    if not by:
        raise GroupByError("say what to group by: seed or a dotted config key")
    flat = [flatten_config(run.config or {}) for run in runs]
    if by != BY_SEED and runs and not any(by in values for values in flat):
        raise GroupByError(
            f"group={by!r}: no run here has that config key; pick one from the config columns"
        )
    groups: dict[str, RunGroup] = {}
    for run, values in zip(runs, flat, strict=True):
        ignored = _ignored(by, values)
        shared = {key: value for key, value in values.items() if key not in ignored}
        signature = json.dumps(shared, sort_keys=True, default=str)
        token = _token(by, signature)
        if token not in groups:
            groups[token] = RunGroup(by=by, token=token, runs=[], shared=shared)
        groups[token].runs.append(run)
        groups[token].flats[run.pk] = values
    result = list(groups.values())
    for group, values in zip(result, (_member_values(g) for g in result), strict=True):
        group.varied = {key: v for key, v in values.items() if _differ(v)}
    _label(result)
    return result


_UNSET = object()


def _differ(values: Sequence[Any]) -> bool:
    """Return whether ``values`` (config values, or ``_UNSET``) are not all equal."""
    return any(value != values[0] for value in values[1:])


def _member_values(group: RunGroup) -> dict[str, list[Any]]:
    """Return the ignored keys' values across the group's runs (what varies inside it)."""
    flats = [group.flats[run.pk] for run in group.runs]
    keys = sorted(
        {k for values in flats for k in _ignored(group.by, values) if k not in IGNORED_KEYS}
    )
    return {key: [values.get(key) for values in flats] for key in keys}


def _label(groups: list[RunGroup]) -> None:
    """Label each group by its experiment and the keys whose values tell the groups apart."""
    keys = sorted({k for group in groups for k in group.shared})
    telling = [key for key in keys if _differ([g.shared.get(key, _UNSET) for g in groups])]
    for group in groups:
        first = group.runs[0]
        parts = [f"{key.rpartition('.')[2]}={group.shared.get(key)}" for key in telling]
        shown = ", ".join(parts[:LABEL_KEYS]) + (", …" if len(parts) > LABEL_KEYS else "")
        count = len(group.runs)
        what = "seeds" if group.by == BY_SEED else f"values of {group.by.rpartition('.')[2]}"
        head = f"{first.experiment.name}" + (f" · {shown}" if shown else "")
        group.label = f"{head} · {count} {what}" if count > 1 else f"{head} · run #{first.pk}"


def groupable_runs(runs: QuerySet[Run]) -> QuerySet[Run]:
    """Return ``runs`` less those another run resumed (their resumption draws their steps)."""
    return runs.exclude(Exists(Run.objects.filter(parent=OuterRef("pk"))))


def run_groups_by_token(*, user: Any, tokens: Sequence[str]) -> list[RunGroup]:
    """Return the groups ``tokens`` (``"<by>:<hash>"``) among the runs ``user`` may see, in order.

    The runs are grouped once per ``by`` the tokens name. Raise ``GroupByError`` for a malformed
    token and ``Run.DoesNotExist`` for one no visible run belongs to (the group is gone, or it
    was never one of this user's).
    """
    wanted: dict[str, list[str]] = {}
    for token in tokens:
        by, _, digest = token.rpartition(":")
        if not re.fullmatch(r"[0-9a-f]{16}", digest):
            raise GroupByError(f"group {token[:80]!r} is malformed; pick a group from the list")
        wanted.setdefault(by, []).append(token)
    runs = list(groupable_runs(run_list_for_user(user=user))) if wanted else []
    found: dict[str, RunGroup] = {}
    for by in wanted:
        try:
            found.update((g.token, g) for g in group_runs(runs, by=by))
        except GroupByError:
            continue
    missing = [token for token in tokens if token not in found]
    if missing:
        raise Run.DoesNotExist(f"no group {missing[0]}")
    return [found[token] for token in tokens]


def run_group_for_user(*, user: Any, token: str) -> RunGroup:
    """Return the group ``token`` among the runs ``user`` may see (``run_groups_by_token``)."""
    return run_groups_by_token(user=user, tokens=[token])[0]


def run_groups_for_user(*, user: Any, by: str = BY_SEED, limit: int = 200) -> list[RunGroup]:
    """Return ``user``'s groups of two runs or more among their newest ``limit`` runs."""
    runs = list(groupable_runs(run_list_for_user(user=user))[:limit])
    return [group for group in group_runs(runs, by=by) if len(group.runs) > 1] if runs else []


def group_rows(
    rows: Sequence[T], *, by: str, run_of: Callable[[T], Run]
) -> list[tuple[RunGroup | None, list[T]]]:
    """Return ``rows`` (a table's, each holding a run) as ``(group, its rows)`` in table order.

    A group comes where its first row came, its rows after it in their order; a row alone in
    its group comes as ``(None, [row])``.
    """
    groups = group_runs([run_of(row) for row in rows], by=by)
    by_run = {run.pk: group for group in groups for run in group.runs}
    placed: dict[str, list[T]] = {}
    result: list[tuple[RunGroup | None, list[T]]] = []
    for row in rows:
        group = by_run[run_of(row).pk]
        if len(group.runs) == 1:
            result.append((None, [row]))
        elif group.token in placed:
            placed[group.token].append(row)
        else:
            placed[group.token] = [row]
            result.append((group, placed[group.token]))
    return result


def split_groups(groups: Sequence[RunGroup]) -> tuple[list[RunGroup], list[Run]]:
    """Return the groups of two runs or more, and the runs alone in theirs."""
    several = [group for group in groups if len(group.runs) > 1]
    alone = [group.runs[0] for group in groups if len(group.runs) == 1]
    return several, alone
