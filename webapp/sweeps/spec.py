"""A sweep's spec and its members: a grid over value lists, random draws, or a TPE search.

The spec is plain JSON, the same from the builder, the API and the database::

    {"mode": "grid", "params": {"actor_rollout_ref.actor.optim.lr": [1e-6, 3e-6, 1e-5]}}
    {"mode": "random", "count": 8, "seed": 0, "params": {
        "actor_rollout_ref.actor.optim.lr": {"log_uniform": [1e-6, 1e-4]},
        "algorithm.kl_ctrl.kl_coef": {"uniform": [0.0, 0.01]},
        "actor_rollout_ref.rollout.n": {"int": [2, 8]},
        "algorithm.adv_estimator": {"choice": ["grpo", "rloo"]}}}

A grid is the product of the lists, the first key varying slowest (``itertools.product``). Random
draws come from one ``random.Random(seed)``, key by key in the spec's order, so the same spec
gives the same members; ``int`` ranges include both ends, ``log_uniform`` draws uniformly in
``log(value)`` (Bergstra and Bengio, JMLR 2012, on why a learning rate is searched that way). A
plain list in random mode is a choice. ``parse_spec`` refuses anything else with a
``ConfigFieldError`` naming the key; whether a value suits its key is the config validator's job.

A ``tpe`` sweep searches the same spaces as a random one, but draws each member when a slot frees,
from what the members before it scored (``webapp.sweeps.search``, Optuna's TPE sampler)::

    {"mode": "tpe", "count": 16, "seed": 0, "n_startup_trials": 4, "params": {...},
     "objective": {"metric": "val-core/tiny_arith/reward/mean@1", "direction": "maximize"},
     "pruner": {"type": "median", "n_startup_trials": 3, "n_warmup_steps": 10}}

``objective`` (the metric a member is judged by, and whether higher is better) is required by a
``tpe`` sweep and by a ``pruner``, which any mode may have: ``median`` or ``successive_halving``
with Optuna's settings (``PRUNERS``), which stops members whose validation score falls behind.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from engine.config import ConfigFieldError, ConfigValidationError
from engine.config.keys import schema_keys
from webapp.experiments.configs import STUDIO_MANAGED_KEYS

# More members than this is a mistake in the spec (a grid too fine), not a sweep to run.
MAX_MEMBERS = 256
DISTRIBUTIONS = ("uniform", "log_uniform", "int", "choice")
MODES = ("grid", "random", "tpe")
DIRECTIONS = ("maximize", "minimize")
# Each pruner's settings, Optuna's names and defaults: whole numbers from their low bound.
PRUNERS: dict[str, dict[str, tuple[int, int]]] = {
    # optuna.pruners.MedianPruner: stop a member whose best value so far is worse than the median
    # of the finished members' values at the same step.
    "median": {"n_startup_trials": (5, 0), "n_warmup_steps": (0, 0), "interval_steps": (1, 1)},
    # optuna.pruners.SuccessiveHalvingPruner (Li et al., "A System for Massively Parallel
    # Hyperparameter Tuning", MLSys 2020; the rung schedule of W&B's Hyperband): at step
    # min_resource * reduction_factor ** (min_early_stopping_rate + rung) a member goes on only
    # if it is in the best 1/reduction_factor of the members that reached that rung.
    "successive_halving": {
        "min_resource": (1, 1),
        "reduction_factor": (3, 2),
        "min_early_stopping_rate": (0, 0),
    },
}
MAX_SETTING = 1_000_000
# Members TPE draws at random before it models the scores (Optuna's default).
TPE_STARTUP_TRIALS = 10


def _number(key: str, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigFieldError(key, value, f"{what} must be a finite number")
    return value


def _range(key: str, name: str, value: Any) -> dict[str, Any]:
    if name == "choice":
        if not isinstance(value, list) or not value:
            raise ConfigFieldError(key, value, "choice takes a non-empty list of values")
        return {"choice": value}
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigFieldError(key, value, f"{name} takes [low, high], e.g. {{{name}: [1, 4]}}")
    low, high = (_number(key, v, f"{name}'s bounds") for v in value)
    if name == "int" and not all(isinstance(v, int) for v in value):
        raise ConfigFieldError(key, value, "int takes whole-number bounds, e.g. {int: [2, 8]}")
    if low > high:
        raise ConfigFieldError(key, value, f"{name}'s low {low} is above its high {high}")
    if name == "log_uniform" and low <= 0:
        raise ConfigFieldError(
            key, value, "log_uniform needs bounds above 0; use uniform for a range from 0"
        )
    return {name: [low, high]}


def _param(key: str, value: Any, mode: str) -> Any:
    """Return one key's entry in canonical form: a list (grid, or random choice) or a range."""
    if key not in schema_keys():
        raise ConfigFieldError(key, value, "not a config key; sweep keys are dotted config keys")
    if key in STUDIO_MANAGED_KEYS:
        raise ConfigFieldError(key, value, "the server sets this key for each run; sweep another")
    if isinstance(value, list):
        if not value:
            raise ConfigFieldError(key, value, "give at least one value to sweep")
        return value if mode == "grid" else {"choice": value}
    if mode == "grid":
        raise ConfigFieldError(
            key, value, "a grid sweeps a list of values, e.g. [1e-6, 3e-6]; ranges are random"
        )
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in DISTRIBUTIONS:
        raise ConfigFieldError(
            key,
            value,
            f"a random sweep takes a list of values or one of {', '.join(DISTRIBUTIONS)} "
            "with its range, e.g. {log_uniform: [1e-6, 1e-4]}",
        )
    name, bounds = next(iter(value.items()))
    return _range(key, name, bounds)


def _whole(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigFieldError(field, value, f"give a whole number from {low} to {high}")
    return value


SPEC_FIELDS = ("mode", "params", "count", "seed", "n_startup_trials", "objective", "pruner")


def _objective(value: Any, mode: Any) -> tuple[dict[str, str] | None, list[ConfigFieldError]]:
    """Return the canonical ``{"metric", "direction"}`` (None when not given) and its errors.

    Whether a run reports the metric is the service's check (``objective_metric_errors``).
    """
    if value is None:
        return None, []
    if not isinstance(value, dict):
        return None, [
            ConfigFieldError(
                "objective", value, 'give {"metric": "<name>", "direction": "maximize"}'
            )
        ]
    errors = []
    unknown = set(value) - {"metric", "direction"}
    if unknown:
        errors.append(
            ConfigFieldError(
                "objective", sorted(unknown), "an objective has only metric and direction"
            )
        )
    metric = value.get("metric")
    if not isinstance(metric, str) or not metric.strip() or len(metric) > 200:
        errors.append(
            ConfigFieldError(
                "objective.metric",
                metric,
                "name the metric that scores a member, e.g. val-core/<data source>/reward/mean@1",
            )
        )
    direction = value.get("direction", "maximize")
    if direction not in DIRECTIONS:
        errors.append(
            ConfigFieldError(
                "objective.direction", direction, "choose maximize (higher is better) or minimize"
            )
        )
    if errors or not isinstance(metric, str):
        return None, errors
    return {"metric": metric.strip(), "direction": direction}, []


def _pruner(value: Any) -> tuple[dict[str, Any] | None, list[ConfigFieldError]]:
    """Return the canonical pruner (its type and every setting, defaults filled) and its errors."""
    if value is None:
        return None, []
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str) or kind not in PRUNERS:
        return None, [
            ConfigFieldError(
                "pruner.type",
                kind if isinstance(value, dict) else value,
                f"choose a pruner: {' or '.join(PRUNERS)} (or none: leave the pruner out)",
            )
        ]
    settings = PRUNERS[kind]
    errors = []
    unknown = set(value) - {"type", *settings}
    if unknown:
        errors.append(
            ConfigFieldError(
                "pruner",
                sorted(unknown),
                f"the {kind} pruner takes only {', '.join(settings)}",
            )
        )
    out: dict[str, Any] = {"type": kind}
    for name, (default, low) in settings.items():
        given = value.get(name)
        try:
            out[name] = (
                default if given is None else _whole(f"pruner.{name}", given, low, MAX_SETTING)
            )
        except ConfigFieldError as exc:
            errors.append(exc)
    return (None if errors else out), errors


def parse_spec(spec: Any) -> dict[str, Any]:
    """Return ``spec`` checked and in canonical form; raise ``ConfigValidationError`` otherwise.

    Every problem is reported, each naming its key (``mode``, ``count``, ``seed``, ``params``,
    ``objective.metric``, ``pruner.n_warmup_steps``... or the swept config key).
    """
    if not isinstance(spec, dict):
        raise ConfigValidationError([ConfigFieldError("spec", spec, "a sweep spec is an object")])
    errors: list[ConfigFieldError] = []
    unknown = set(spec) - {*SPEC_FIELDS}
    if unknown:
        errors.append(
            ConfigFieldError("spec", sorted(unknown), f"a spec has only {', '.join(SPEC_FIELDS)}")
        )
    mode = spec.get("mode")
    if mode not in MODES:
        errors.append(ConfigFieldError("mode", mode, "choose grid, random or tpe"))
    out: dict[str, Any] = {"mode": mode, "params": {}}
    if mode in ("random", "tpe"):
        for field, high in (("count", MAX_MEMBERS), ("seed", 2**32 - 1)):
            try:
                out[field] = _whole(field, spec.get(field), 1 if field == "count" else 0, high)
            except ConfigFieldError as exc:
                errors.append(exc)
    elif mode == "grid":
        for field in ("count", "seed"):
            if spec.get(field) is not None:
                errors.append(
                    ConfigFieldError(field, spec[field], f"a grid has no {field}; leave it empty")
                )
    if mode == "tpe":
        startup = spec.get("n_startup_trials")
        try:
            out["n_startup_trials"] = (
                TPE_STARTUP_TRIALS
                if startup is None
                else _whole("n_startup_trials", startup, 1, MAX_MEMBERS)
            )
        except ConfigFieldError as exc:
            errors.append(exc)
    elif spec.get("n_startup_trials") is not None:
        errors.append(
            ConfigFieldError(
                "n_startup_trials", spec["n_startup_trials"], "only a tpe sweep has startup trials"
            )
        )
    objective, objective_errors = _objective(spec.get("objective"), mode)
    pruner, pruner_errors = _pruner(spec.get("pruner"))
    errors += objective_errors + pruner_errors
    if objective is None and (mode == "tpe" or pruner is not None) and not objective_errors:
        why = "a tpe sweep" if mode == "tpe" else "a pruner"
        errors.append(
            ConfigFieldError(
                "objective.metric",
                None,
                f"{why} needs the metric that scores a member, e.g. "
                '{"metric": "val-core/<data source>/reward/mean@1", "direction": "maximize"}',
            )
        )
    if objective is not None:
        out["objective"] = objective
    if pruner is not None:
        out["pruner"] = pruner
    params = spec.get("params")
    if not isinstance(params, dict) or not params:
        errors.append(ConfigFieldError("params", params, "mark at least one config key to sweep"))
        params = {}
    for key, value in params.items():
        try:
            shape = "grid" if mode not in MODES else "random" if mode == "tpe" else mode
            out["params"][key] = _param(key, value, shape)
        except ConfigFieldError as exc:
            errors.append(exc)
    if mode == "grid" and not errors:
        size = math.prod(len(values) for values in out["params"].values())
        if size > MAX_MEMBERS:
            errors.append(
                ConfigFieldError(
                    "params",
                    size,
                    f"the grid has {size} members, over {MAX_MEMBERS}; "
                    "sweep fewer values or use a random sweep with a count",
                )
            )
    if errors:
        raise ConfigValidationError(errors)
    return out


def _draw(rng: random.Random, entry: dict[str, Any]) -> Any:
    name, bounds = next(iter(entry.items()))
    if name == "choice":
        return bounds[rng.randrange(len(bounds))]
    low, high = bounds
    if name == "int":
        return rng.randint(low, high)
    if name == "log_uniform":
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    return rng.uniform(low, high)


def expand_spec(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Return each member's values ``{key: value}`` of a spec from ``parse_spec``, in order.

    A ``tpe`` sweep's members are not known in advance (``webapp.sweeps.search`` draws each from
    the scores before it): return the values that probe its space's edges instead, one key at a
    time (each bound, each choice), for the service to check against the config validator.
    """
    params = spec["params"]
    if spec["mode"] == "tpe":
        return space_probes(params)
    if spec["mode"] == "grid":
        keys = list(params)
        return [
            dict(zip(keys, values, strict=True)) for values in itertools.product(*params.values())
        ]
    rng = random.Random(spec["seed"])
    return [{key: _draw(rng, entry) for key, entry in params.items()} for _ in range(spec["count"])]


def space_probes(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Return members that together take every bound and every choice of ``params``.

    The first probe takes each key's first bound or choice; each next one changes one key to
    another bound or choice, so a value the config refuses is named with its key.
    """
    options = {key: next(iter(entry.values())) for key, entry in params.items()}
    base = {key: values[0] for key, values in options.items()}
    probes = [base]
    for key, values in options.items():
        for value in values[1:]:
            if value != base[key]:
                probes.append({**base, key: value})
    return probes
