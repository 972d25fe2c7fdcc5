"""Score many samples with one reward function, in this process or in a process pool.

A function that raises for one sample fails only that sample: its outcome carries
``"ExceptionType: message"`` instead of a result, and the others are scored as usual. So does a
result that is neither a number nor a dict with a ``score`` key. Outcomes keep the input order.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from itertools import repeat
from typing import Any, NamedTuple

from engine.rewards.sandbox import SandboxUnavailable


class RewardInput(NamedTuple):
    """The arguments of a uniform reward function for one sample."""

    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] | None


class RewardOutcome(NamedTuple):
    """A float or ``{"score": ..., ...}`` result, or the error that replaced it."""

    result: float | dict[str, Any] | None
    error: str | None


def describe_error(exc: BaseException) -> str:
    """Return ``"ExceptionType: message"``."""
    return f"{type(exc).__name__}: {exc}"


def check_result(result: Any) -> float | dict[str, Any]:
    """Return a reward result as a float or a dict with a float ``score``; raise if it is neither."""
    if isinstance(result, dict):
        if "score" not in result:
            raise TypeError(
                f"reward function returned a dict without a 'score' key (keys: {sorted(result)}); "
                "put the total reward under 'score'"
            )
        return {**result, "score": float(result["score"])}
    if isinstance(result, int | float):  # bool is an int
        return float(result)
    raise TypeError(
        f"reward function returned {type(result).__name__}; return a float or a dict with a "
        "'score' key"
    )


def score_one(fn: Callable[..., Any], sample: RewardInput) -> RewardOutcome:
    """Return the outcome of ``fn`` on one sample, catching what it raises."""
    try:
        return RewardOutcome(check_result(fn(*sample)), None)
    except SandboxUnavailable:  # concerns every sample: fails the run with its one sentence
        raise
    except Exception as exc:
        return RewardOutcome(None, describe_error(exc))


def check_picklable(fn: object) -> None:
    """Raise TypeError unless ``fn`` can be sent to a worker process."""
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise TypeError(
            f"reward function {fn!r} cannot be sent to worker processes ({exc}); with "
            "num_workers > 1 use a function defined at module level of an importable module "
            "(or a registered or custom_reward_function one), or set num_workers=1"
        ) from exc


def score_samples(
    fn: Callable[..., Any], samples: Sequence[RewardInput], executor: Executor | None = None
) -> list[RewardOutcome]:
    """Return the outcome of ``fn`` on each sample, in order, using ``executor`` when given."""
    if executor is None:
        return [score_one(fn, sample) for sample in samples]
    return list(executor.map(score_one, repeat(fn), samples))
