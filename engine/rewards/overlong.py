"""DAPO's overlong reward shaping (arXiv 2503.14476, section 3.4), as verl's DAPO reward manager.

A response longer than ``max_resp_len - len`` tokens (``len``: the buffer) loses reward linearly,
up to ``penalty_factor`` at ``max_resp_len``:

    expected = max_resp_len - len
    exceed = L - expected
    penalty = min(-exceed / len * penalty_factor, 0)

so a response that ends before the buffer keeps its score and one cut off at the limit loses
``penalty_factor``. The settings arrive as verl's ``+reward_model.reward_kwargs.max_resp_len``
and ``+reward_model.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor,log}``; this
module reads and checks them without torch, so the config validator can use it, together with
the other managers' ``reward_kwargs``: prime's ``timeout`` and the keyword arguments that batch
hands to its batch function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# The keyword arguments each reward manager takes (reward_model.reward_kwargs); batch takes any
# other key and passes it on to its batch function, as verl's BatchRewardManager does.
MANAGER_KWARGS = {
    "naive": (),
    "dapo": ("max_resp_len", "overlong_buffer_cfg"),
    "prime": ("timeout",),
}
# What each manager's own keys are for, in the fix of a key given to another manager.
_KWARGS_USE = {"dapo": "for the overlong buffer", "prime": "for its per-sample timeout"}
# The arguments the batch manager passes its function itself.
BATCH_ARGUMENTS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")
_KWARGS = "reward_model.reward_kwargs"


@dataclass(frozen=True)
class OverlongBuffer:
    """verl's ``overlong_buffer_cfg`` with ``max_resp_len``: the penalty's settings."""

    max_resp_len: int
    len: int
    penalty_factor: float
    log: bool = False

    def penalty(self, length: int) -> float:
        """Return the (non-positive) reward added to a response of ``length`` tokens."""
        expected = self.max_resp_len - self.len
        exceed = length - expected
        return min(-exceed / self.len * self.penalty_factor, 0.0)


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


def overlong_buffer(kwargs: dict[str, Any]) -> OverlongBuffer | None:
    """Return the penalty's settings from checked ``reward_kwargs``; None when it is off."""
    cfg = kwargs.get("overlong_buffer_cfg") or {}
    if not cfg.get("enable"):
        return None
    return OverlongBuffer(
        max_resp_len=int(kwargs["max_resp_len"]),
        len=int(cfg["len"]),
        penalty_factor=float(cfg.get("penalty_factor", 0.0)),
        log=bool(cfg.get("log", False)),
    )


def is_timeout(value: Any) -> bool:
    """Return whether ``value`` is a finite number of seconds > 0."""
    return _is_number(value) and math.isfinite(value) and value > 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
