"""The default reward: pick the scoring function from the sample's ``data_source``, as verl does.

Sources with the same name as in verl's ``default_compute_score`` score the same way. A score
function may return a number (returned as a float) or a dict with a ``score`` key and extra
parts, which is returned as it is.
"""

from __future__ import annotations

from typing import Any

from engine.rewards import (
    arithmetic,
    code_exec,
    exact_match,
    gsm8k,
    math,
    sql_safety,
    tiny_calculator,
)
from engine.rewards.names import (
    CODE_SOURCES,
    DATA_SOURCE_SCORERS,
    GSM8K_SOURCES,
    MATH_SOURCES,
    TOOL_ANSWER_SOURCES,
)

KNOWN_DATA_SOURCES = tuple(DATA_SOURCE_SCORERS)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    sandbox_fusion: dict[str, Any] | None = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """Score one response with the reward function for its ``data_source``.

    ``sandbox_fusion`` (``reward_model.sandbox_fusion``) reaches the code sources only, as verl's
    ``default_compute_score`` hands its ``sandbox_fusion_url`` to them alone.
    """
    if data_source in GSM8K_SOURCES:
        res: Any = gsm8k.compute_score(solution_str, ground_truth, **kwargs)
    elif data_source in MATH_SOURCES:
        res = math.compute_score(solution_str, ground_truth, **kwargs)
    elif data_source == arithmetic.DATA_SOURCE:
        res = arithmetic.compute_score(solution_str, ground_truth, **kwargs)
    elif data_source in TOOL_ANSWER_SOURCES:
        res = tiny_calculator.compute_score(
            data_source, solution_str, ground_truth, extra_info, **kwargs
        )
    elif data_source == "exact_match":
        res = exact_match.compute_score(solution_str, ground_truth, **kwargs)
    elif data_source == "sql_safety":
        res = sql_safety.compute_score(solution_str, ground_truth, extra_info, **kwargs)
    elif data_source in CODE_SOURCES:
        res = code_exec.compute_score(
            solution_str, ground_truth, extra_info, sandbox_fusion=sandbox_fusion, **kwargs
        )
    else:
        raise NotImplementedError(
            f"Reward function is not implemented for data_source={data_source!r}. Known data "
            f"sources: {', '.join(KNOWN_DATA_SOURCES)}. For another source set "
            "custom_reward_function.path (and custom_reward_function.name) to a Python file "
            "defining compute_score(data_source, solution_str, ground_truth, extra_info=None)."
        )
    if isinstance(res, dict):
        return res
    if isinstance(res, int | float | bool):
        return float(res)
    return float(res[0])
