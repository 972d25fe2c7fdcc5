"""A sweep's spec and its members: a grid over value lists, or random draws over ranges.

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
MODES = ("grid", "random")


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


def parse_spec(spec: Any) -> dict[str, Any]:
    """Return ``spec`` checked and in canonical form; raise ``ConfigValidationError`` otherwise.

    Every problem is reported, each naming its key (``mode``, ``count``, ``seed``, ``params``
    or the swept config key).
    """
    if not isinstance(spec, dict):
        raise ConfigValidationError([ConfigFieldError("spec", spec, "a sweep spec is an object")])
    errors: list[ConfigFieldError] = []
    unknown = set(spec) - {"mode", "params", "count", "seed"}
    if unknown:
        errors.append(
            ConfigFieldError(
                "spec", sorted(unknown), "a spec has only mode, params, count and seed"
            )
        )
    mode = spec.get("mode")
    if mode not in MODES:
        errors.append(ConfigFieldError("mode", mode, "choose grid or random"))
    out: dict[str, Any] = {"mode": mode, "params": {}}
    if mode == "random":
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
    params = spec.get("params")
    if not isinstance(params, dict) or not params:
        errors.append(ConfigFieldError("params", params, "mark at least one config key to sweep"))
        params = {}
    for key, value in params.items():
        try:
            out["params"][key] = _param(key, value, mode if mode in MODES else "grid")
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
    """Return each member's values ``{key: value}`` of a spec from ``parse_spec``, in order."""
    params = spec["params"]
    if spec["mode"] == "grid":
        keys = list(params)
        return [
            dict(zip(keys, values, strict=True)) for values in itertools.product(*params.values())
        ]
    rng = random.Random(spec["seed"])
    return [{key: _draw(rng, entry) for key, entry in params.items()} for _ in range(spec["count"])]
