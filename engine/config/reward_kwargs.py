"""What each reward manager reads from ``reward_model.reward_kwargs`` (verl's
``+reward_model.reward_kwargs.*``), checked without torch: by the config validator and by the
managers as they start, so both give the same error.

naive takes nothing; dapo takes ``max_resp_len`` and ``overlong_buffer_cfg`` (DAPO's overlong
penalty, ``engine.rewards.overlong``); prime takes ``timeout``; batch passes every other key on to
its batch function, as verl's BatchRewardManager does; remote takes its service (``endpoint``, an
entry of the administrator's ``POSTTRAIN_REWARD_ENDPOINTS``) and how it is called
(``engine.rewards.remote``).
"""

from __future__ import annotations

import math
from typing import Any

from engine.rewards.endpoints import endpoint_problem
from engine.rewards.names import BATCH_ARGUMENTS, BUFFER_KEYS, MANAGER_KWARGS

# What each manager's own keys are for, in the fix of a key given to another manager.
_KWARGS_USE = {
    "dapo": "for the overlong buffer",
    "prime": "for its per-sample timeout",
    "remote": "to score with a reward service",
}
_KWARGS = "reward_model.reward_kwargs"


def reward_kwargs_problems(manager: str, kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """Return ``(key, message)`` for each problem of ``reward_model.reward_kwargs``."""
    if manager == "batch":
        return [
            (
                f"{_KWARGS}.{key}",
                "is an argument the batch manager passes its function itself (one entry per "
                f"response: {', '.join(BATCH_ARGUMENTS)}); give this keyword another name",
            )
            for key in kwargs
            if key in BATCH_ARGUMENTS
        ]
    accepted = MANAGER_KWARGS.get(manager)
    if accepted is None:
        return []  # the manager's own name is reported by the choices check
    problems = []
    for key in kwargs:
        if key not in accepted:
            takes = f"takes only {', '.join(accepted)}" if accepted else "takes no arguments"
            owner = next((m for m, keys in MANAGER_KWARGS.items() if key in keys), None)
            fix = (
                f"; set reward_model.reward_manager={owner} {_KWARGS_USE[owner]}"
                if owner
                else "; a reward function's own keyword arguments go in "
                "custom_reward_function.reward_kwargs"
            )
            problems.append(
                (f"{_KWARGS}.{key}", f"reward_model.reward_manager={manager} {takes}{fix}")
            )
    if manager == "prime" and not is_timeout(kwargs.get("timeout", 300)):
        problems.append(
            (
                f"{_KWARGS}.timeout",
                "must be a finite number of seconds > 0 that each response may take to score "
                "(verl's PRIME manager waits 300)",
            )
        )
    if manager == "remote":
        return problems + _remote_problems(kwargs)
    if problems or manager != "dapo":
        return problems
    cfg = kwargs.get("overlong_buffer_cfg")
    if cfg is None:
        return []
    where = f"{_KWARGS}.overlong_buffer_cfg"
    if not isinstance(cfg, dict):
        return [(where, f"must be a mapping of {', '.join(BUFFER_KEYS)}")]
    problems += [
        (f"{where}.{key}", f"not a key of the overlong buffer; its keys: {', '.join(BUFFER_KEYS)}")
        for key in cfg
        if key not in BUFFER_KEYS
    ]
    for key in ("enable", "log"):
        if not isinstance(cfg.get(key, False), bool):
            problems.append((f"{where}.{key}", "must be True or False"))
    length, factor = cfg.get("len", 0), cfg.get("penalty_factor", 0.0)
    if not _is_int(length) or length < 0:
        problems.append((f"{where}.len", "must be a whole number of tokens >= 0"))
    if not _is_number(factor) or factor < 0:
        problems.append((f"{where}.penalty_factor", "must be a number >= 0"))
    if problems or cfg.get("enable") is not True:
        return problems
    max_len = kwargs.get("max_resp_len")
    if length <= 0:
        problems.append((f"{where}.len", "must be > 0 when the buffer is enabled (it divides)"))
    if max_len is None:
        problems.append(
            (
                f"{_KWARGS}.max_resp_len",
                "the overlong buffer needs the response limit it counts back from; set "
                "+reward_model.reward_kwargs.max_resp_len (normally data.max_response_length)",
            )
        )
    elif not _is_int(max_len) or max_len < length:
        problems.append(
            (
                f"{_KWARGS}.max_resp_len",
                f"must be a whole number >= overlong_buffer_cfg.len={length}",
            )
        )
    return problems


# The remote manager's bounds: (lowest, highest, what the number is).
_REMOTE_NUMBERS = {
    "max_retries": (0, 20, "tries after the first, a whole number"),
    "max_concurrent": (1, 256, "requests in flight, a whole number"),
    "batch_size": (1, 1 << 20, "responses per request, a whole number"),
}


def _remote_problems(kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """Return the problems of the remote manager's keys: an allowed service and sane numbers."""
    problems = []
    if kwargs.get("endpoint") is None:
        problems.append(
            (
                f"{_KWARGS}.endpoint",
                "reward_model.reward_manager=remote needs the reward service to post to; set "
                "+reward_model.reward_kwargs.endpoint to the name of an entry of "
                "POSTTRAIN_REWARD_ENDPOINTS",
            )
        )
    elif (why := endpoint_problem(kwargs["endpoint"])) is not None:
        problems.append((f"{_KWARGS}.endpoint", why))
    for key, (low, high, what) in _REMOTE_NUMBERS.items():
        value = kwargs.get(key, low)
        if not _is_int(value) or not low <= value <= high:
            problems.append((f"{_KWARGS}.{key}", f"must be {what} from {low} to {high}"))
    if not is_timeout(kwargs.get("timeout", 30.0)):
        problems.append(
            (f"{_KWARGS}.timeout", "must be a finite number of seconds > 0 each request may take")
        )
    backoff = kwargs.get("backoff_s", 0.5)
    if not (_is_number(backoff) and math.isfinite(backoff) and backoff >= 0):
        problems.append((f"{_KWARGS}.backoff_s", "must be a finite number of seconds >= 0"))
    rpm = kwargs.get("max_rpm")
    if rpm is not None and not is_timeout(rpm):
        problems.append(
            (f"{_KWARGS}.max_rpm", "must be a finite number > 0 of requests a minute, or null")
        )
    if kwargs.get("on_error", "reward_error") not in ("reward_error", "fail"):
        problems.append(
            (
                f"{_KWARGS}.on_error",
                "must be reward_error (a bad answer fails its responses, which score 0 and "
                "count in reward/failed) or fail (a bad answer stops the run)",
            )
        )
    return problems


def is_timeout(value: Any) -> bool:
    """Return whether ``value`` is a finite number of seconds > 0."""
    return _is_number(value) and math.isfinite(value) and value > 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
