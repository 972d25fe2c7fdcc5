"""Named reward functions, as the web form and the config select them.

Every registered function has the uniform signature
``fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict``,
where a dict carries ``score`` and extra parts. Keyword arguments from the experiment config
(``reward_kwargs``) reach the underlying scorer, e.g. ``method="flexible"`` for ``gsm8k``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.rewards import arithmetic, code_exec, exact_match, gsm8k, keyword, math, sql_safety
from engine.rewards import format as format_reward
from engine.rewards.default import default_compute_score
from engine.rewards.names import REWARD_FN_NAMES

RewardFn = Callable[..., float | dict[str, Any]]
Extra = dict[str, Any] | None

_REWARD_FNS: dict[str, RewardFn] = {}


def register_reward_fn(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register the decorated function under ``name``, one of ``names.REWARD_FN_NAMES``."""
    if name not in REWARD_FN_NAMES:
        raise ValueError(
            f"reward function {name!r} is not listed; add it to "
            "engine.rewards.names.REWARD_FN_NAMES so the config accepts it"
        )

    def decorator(fn: RewardFn) -> RewardFn:
        if name in _REWARD_FNS and _REWARD_FNS[name] is not fn:
            raise ValueError(f"a reward function is already registered as {name!r}")
        _REWARD_FNS[name] = fn
        return fn

    return decorator


def get_reward_fn(name: str) -> RewardFn:
    """Return the reward function registered as ``name``."""
    try:
        return _REWARD_FNS[name]
    except KeyError:
        raise KeyError(
            f"no reward function named {name!r}; registered: {', '.join(list_reward_fns())}. "
            "Register one with @register_reward_fn(name) or use custom_reward_function.path."
        ) from None


def list_reward_fns() -> list[str]:
    """Return the registered names, in registration order."""
    return list(_REWARD_FNS)


register_reward_fn("default")(default_compute_score)


@register_reward_fn("tiny_arithmetic")
def tiny_arithmetic_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Extra = None, **kwargs: Any
) -> float:
    """Score the first integer of the response against the ground truth."""
    return arithmetic.compute_score(solution_str, ground_truth, **kwargs)


@register_reward_fn("gsm8k")
def gsm8k_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Extra = None, **kwargs: Any
) -> float:
    """Score a GSM8K ``#### <number>`` answer."""
    return float(gsm8k.compute_score(solution_str, ground_truth, **kwargs))


@register_reward_fn("math")
def math_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Extra = None, **kwargs: Any
) -> float:
    """Score the last ``\\boxed{}`` answer against the ground truth."""
    return math.compute_score(solution_str, ground_truth, **kwargs)


@register_reward_fn("exact_match")
def exact_match_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Extra = None, **kwargs: Any
) -> float:
    """Score a response equal to the ground truth."""
    return exact_match.compute_score(solution_str, ground_truth, **kwargs)


@register_reward_fn("format")
def format_reward_fn(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Extra = None, **kwargs: Any
) -> float:
    """Score a response that matches a format regex."""
    return format_reward.compute_score(solution_str, ground_truth, **kwargs)


@register_reward_fn("keyword")
def keyword_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Extra = None, **kwargs: Any
) -> float:
    """Score the weighted share of required keywords present and forbidden ones absent."""
    return keyword.compute_score(solution_str, ground_truth, **kwargs)


@register_reward_fn("sql_safety")
def sql_safety_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Extra = None, **kwargs: Any
) -> dict[str, Any]:
    """Score a generated SQL query's safety, whitelist and match with the reference."""
    return sql_safety.compute_score(solution_str, ground_truth, extra_info, **kwargs)


@register_reward_fn("code_exec")
def code_exec_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Extra = None, **kwargs: Any
) -> dict[str, Any]:
    """Score a program by the fraction of its tests it passes in the sandbox."""
    return code_exec.compute_score(solution_str, ground_truth, extra_info, **kwargs)
