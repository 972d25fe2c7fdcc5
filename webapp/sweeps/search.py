"""The search and the early stop of a sweep's members, decided by Optuna from the members' rows.

Optuna (Akiba et al., KDD 2019) is a maintained library made for this: its TPE sampler
(Bergstra et al., NeurIPS 2011) draws the next member from the scores of those before it, and its
pruners stop a member whose validation score falls behind. We keep no Optuna storage: each
decision builds an in-memory study from the sweep's members as PostgreSQL holds them (their
values, states and every recorded value of the objective metric) and asks Optuna once. So:

- the search survives a restart of the web app and of every worker with nothing to recover: the
  rows are the only state, as they are for runs (Optuna's RDB storage would be a second copy in
  tables of its own, outside Django's migrations, that a deleted, resumed or lost run would
  silently contradict);
- the same rows give the same decision in any process: TPE's random state is seeded per member,
  from the sweep's seed and the member's number, not carried from one call to the next.

A member is an Optuna trial numbered ``index - 1``: ``complete`` with its last value of the
objective metric, ``pruned``, ``running`` (queued, starting or running: TPE's constant liar keeps
concurrent members apart) or ``failed`` (ignored by both). The successive-halving pruner keeps
its rungs in trial attributes; :func:`rung_attrs` recomputes them from the history as the pruner
wrote them, step by step (every recorded value was judged when it was recorded).

Choices are searched as their indexes, so a choice may be any JSON value (a list, null).
"""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from webapp.sweeps.trials import COMPLETE, FAILED, PRUNED, RUNNING, MemberHistory, PruneDecision

# Optuna logs each trial a study gains at INFO; every decision here rebuilds a whole study.
optuna.logging.set_verbosity(optuna.logging.WARNING)

_STATES = {
    COMPLETE: TrialState.COMPLETE,
    PRUNED: TrialState.PRUNED,
    RUNNING: TrialState.RUNNING,
    FAILED: TrialState.FAIL,
}


def _entries(params: dict[str, Any]) -> list[tuple[str, str, list[Any]]]:
    """Return ``(key, distribution name, bounds or choices)`` in key order; a grid's list is a
    choice. The order is the keys' own, not the spec's: a jsonb column keeps no key order, and
    TPE draws the keys one after another from one random state."""
    out = []
    for key, entry in sorted(params.items()):
        name, bounds = ("choice", entry) if isinstance(entry, list) else next(iter(entry.items()))
        out.append((key, name, bounds))
    return out


def distributions(params: dict[str, Any]) -> dict[str, BaseDistribution]:
    """Return Optuna's distribution of each swept key of a canonical spec's ``params``."""
    out: dict[str, BaseDistribution] = {}
    for key, name, bounds in _entries(params):
        if name == "choice":
            out[key] = CategoricalDistribution(list(range(len(bounds))))
        elif name == "int":
            out[key] = IntDistribution(bounds[0], bounds[1])
        else:
            low, high = float(bounds[0]), float(bounds[1])
            out[key] = FloatDistribution(low, high, log=name == "log_uniform")
    return out


def _index_of(choices: list[Any], value: Any) -> int:
    for i, choice in enumerate(choices):
        if choice == value and type(choice) is type(value):
            return i
    return choices.index(value)  # 1 == 1.0: the member's value came from this list


def trial_params(params: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Return a member's values as Optuna's parameters (a choice as its index)."""
    out = {}
    for key, name, bounds in _entries(params):
        out[key] = _index_of(bounds, values[key]) if name == "choice" else values[key]
    return out


def member_values(params: dict[str, Any], suggested: dict[str, Any]) -> dict[str, Any]:
    """Return Optuna's parameters as a member's values, in the spec's key order."""
    out = {}
    for key, name, bounds in _entries(params):
        out[key] = bounds[suggested[key]] if name == "choice" else suggested[key]
    return out


def _direction(spec: dict[str, Any]) -> StudyDirection:
    return (
        StudyDirection.MINIMIZE
        if spec["objective"]["direction"] == "minimize"
        else StudyDirection.MAXIMIZE
    )


def make_pruner(spec: dict[str, Any]) -> optuna.pruners.BasePruner:
    """Return the spec's Optuna pruner (``NopPruner`` when it has none)."""
    pruner = spec.get("pruner")
    if pruner is None:
        return optuna.pruners.NopPruner()
    settings = {k: v for k, v in pruner.items() if k != "type"}
    if pruner["type"] == "median":
        return optuna.pruners.MedianPruner(**settings)
    return optuna.pruners.SuccessiveHalvingPruner(**settings)


def rung_step(pruner: dict[str, Any], rung: int) -> int:
    """Return the step at which successive halving judges ``rung``."""
    return pruner["min_resource"] * pruner["reduction_factor"] ** (
        pruner["min_early_stopping_rate"] + rung
    )


def rung_attrs(
    pruner: dict[str, Any] | None, scores: dict[int, float], failed_rung: int | None = None
) -> dict[str, float]:
    """Return the ``completed_rung_<r>`` attributes successive halving wrote for ``scores``.

    At each recorded step the pruner gives every rung whose step it has reached the value of
    that step, rung by rung, until one is failed (``failed_rung``, of a pruned member) or a rung
    lies ahead. Empty for any other pruner.
    """
    if pruner is None or pruner["type"] != "successive_halving":
        return {}
    attrs: dict[str, float] = {}
    rung = 0
    for step in sorted(scores):
        while step >= rung_step(pruner, rung):
            attrs[f"completed_rung_{rung}"] = scores[step]
            if rung == failed_rung:
                return attrs
            rung += 1
    return attrs


def _trial(spec: dict[str, Any], member: MemberHistory) -> FrozenTrial:
    state = member.state
    if state == COMPLETE and member.final is None:
        state = FAILED  # it ended without the metric: nothing to learn from
    return optuna.trial.create_trial(
        state=_STATES[state],
        params=trial_params(spec["params"], member.values),
        distributions=distributions(spec["params"]),
        value=member.final if state == COMPLETE else None,
        intermediate_values=dict(member.scores),
        system_attrs=rung_attrs(spec.get("pruner"), member.scores, member.pruned_rung),
    )


def build_study(
    spec: dict[str, Any],
    members: list[MemberHistory],
    sampler: optuna.samplers.BaseSampler | None = None,
) -> optuna.Study:
    """Return an in-memory study holding ``members`` as trials, in their order."""
    study = optuna.create_study(
        direction=_direction(spec), pruner=make_pruner(spec), sampler=sampler
    )
    for member in sorted(members, key=lambda m: m.index):
        study.add_trial(_trial(spec, member))
    return study


def trial_seed(seed: int, number: int) -> int:
    """Return the seed of TPE's random state for trial ``number`` of a sweep seeded ``seed``."""
    return (seed * 1_000_003 + number * 7919) % 2**32


def suggest(spec: dict[str, Any], members: list[MemberHistory]) -> dict[str, Any]:
    """Return the next member's values, drawn by TPE from ``members`` (the sweep's so far).

    The same spec and history give the same values in any process.
    """
    number = len(members)
    sampler = optuna.samplers.TPESampler(
        seed=trial_seed(spec["seed"], number),
        n_startup_trials=spec["n_startup_trials"],
        constant_liar=True,
    )
    study = build_study(spec, members, sampler)
    trial = study.ask(distributions(spec["params"]))
    return member_values(spec["params"], trial.params)


def _median_threshold(study: optuna.Study, step: int) -> tuple[float, int]:
    """Return the median of the finished members' values at ``step`` and how many there are.

    As ``optuna.pruners.PercentilePruner`` computes it (numpy's ``nanpercentile``, 50th).
    """
    values = [
        t.intermediate_values[step]
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if step in t.intermediate_values
    ]
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan, 0
    middle = len(finite) // 2
    median = finite[middle] if len(finite) % 2 else (finite[middle - 1] + finite[middle]) / 2
    return median, len(finite)


def _rung_threshold(
    study: optuna.Study, trial: FrozenTrial, rung: int, value: float, factor: int
) -> tuple[float, int]:
    """Return successive halving's cutoff at ``rung`` and how many members compete there.

    As ``optuna.pruners._successive_halving._is_trial_promotable_to_next_rung``: a member goes
    on when it is in the best ``len // reduction_factor`` (at least the best one).
    """
    key = f"completed_rung_{rung}"
    competing = [
        t.system_attrs[key]
        for t in study.get_trials(deepcopy=False)
        if t.number != trial.number and key in t.system_attrs
    ]
    competing.append(value)
    keep = max(len(competing) // factor, 1)
    ordered = sorted(competing, reverse=study.direction == StudyDirection.MAXIMIZE)
    return ordered[keep - 1], len(competing)


def prune_decision(
    spec: dict[str, Any], members: list[MemberHistory], index: int
) -> PruneDecision | None:
    """Return why member ``index`` (running, its scores up to now) stops, or None to go on.

    Optuna's pruner decides; the threshold in the reason is computed as that pruner computes it.
    """
    pruner = spec.get("pruner")
    current = next(m for m in members if m.index == index)
    if pruner is None or not current.scores:
        return None
    step = max(current.scores)
    earlier = {s: v for s, v in current.scores.items() if s < step}
    others = [m for m in members if m.index != index]
    study = build_study(
        spec,
        [
            *others,
            MemberHistory(index=index, values=current.values, state=RUNNING, scores=earlier),
        ],
    )
    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == index - 1)
    # Optuna's own path is Trial.report(value, step), then Trial.should_prune(); a rebuilt study
    # holds frozen trials, so the value goes through the study's storage as report writes it, and
    # the pruner is asked with the trial as should_prune asks it (it may write rung attributes).
    study._storage.set_trial_intermediate_value(trial._trial_id, step, current.scores[step])
    trial = study._storage.get_trial(trial._trial_id)
    if not study.pruner.prune(study, trial):
        return None
    metric = spec["objective"]["metric"]
    value = current.scores[step]
    if pruner["type"] == "median":
        best = (max if study.direction == StudyDirection.MAXIMIZE else min)(
            v for v in trial.intermediate_values.values() if not math.isnan(v)
        )
        threshold, compared = _median_threshold(study, step)
        return PruneDecision(metric, step, best, threshold, "median", compared=compared)
    attrs = study._storage.get_trial(trial._trial_id).system_attrs
    rung = max(int(k.rsplit("_", 1)[1]) for k in attrs if k.startswith("completed_rung_"))
    threshold, compared = _rung_threshold(study, trial, rung, value, pruner["reduction_factor"])
    return PruneDecision(
        metric, step, value, threshold, "successive_halving", rung=rung, compared=compared
    )
