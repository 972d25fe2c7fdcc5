"""Sweep specs: the grid's product, reproducible random draws inside their bounds, refusals."""

from __future__ import annotations

import math

import pytest

from engine.config import ConfigValidationError
from webapp.sweeps.spec import MAX_MEMBERS, expand_spec, parse_spec

LR = "actor_rollout_ref.actor.optim.lr"
N = "actor_rollout_ref.rollout.n"
ADV = "algorithm.adv_estimator"
KL = "algorithm.kl_ctrl.kl_coef"


def errors(spec) -> dict[str, str]:
    with pytest.raises(ConfigValidationError) as info:
        parse_spec(spec)
    return {e.key: e.message for e in info.value.errors}


def test_a_grid_is_the_product_of_the_lists_the_first_key_slowest():
    spec = parse_spec({"mode": "grid", "params": {LR: [1e-6, 3e-6, 1e-5], N: [2, 4]}})
    members = expand_spec(spec)
    assert members == [
        {LR: 1e-6, N: 2},
        {LR: 1e-6, N: 4},
        {LR: 3e-6, N: 2},
        {LR: 3e-6, N: 4},
        {LR: 1e-5, N: 2},
        {LR: 1e-5, N: 4},
    ]


def random_spec(seed=7, count=200):
    return parse_spec(
        {
            "mode": "random",
            "count": count,
            "seed": seed,
            "params": {
                LR: {"log_uniform": [1e-6, 1e-4]},
                KL: {"uniform": [0.0, 0.01]},
                N: {"int": [2, 4]},
                ADV: ["grpo", "rloo"],  # a plain list is a choice
            },
        }
    )


def test_random_draws_are_reproducible_from_the_seed_and_stay_inside_their_bounds():
    members = expand_spec(random_spec())
    assert members == expand_spec(random_spec())
    assert members != expand_spec(random_spec(seed=8))
    assert len(members) == 200
    assert all(1e-6 <= m[LR] <= 1e-4 for m in members)
    assert all(0.0 <= m[KL] <= 0.01 for m in members)
    assert {m[N] for m in members} == {2, 3, 4}  # both ends of an int range are drawn
    assert all(isinstance(m[N], int) for m in members)
    assert {m[ADV] for m in members} == {"grpo", "rloo"}


def test_log_uniform_is_uniform_in_the_logarithm():
    spec = {**random_spec(), "count": 2000}  # past the member limit: the statistics need it
    members = expand_spec(spec)
    logs = [math.log10(m[LR]) for m in members]
    # Uniform over decades: each of the two decades gets about half; a plain uniform draw
    # would put 99% of its values in the upper decade.
    lower = sum(1 for x in logs if x < -5) / len(logs)
    assert 0.45 < lower < 0.55
    assert abs(sum(logs) / len(logs) - (-5)) < 0.05
    kls = [m[KL] for m in members]
    assert abs(sum(kls) / len(kls) - 0.005) < 0.0005


def test_the_first_draws_do_not_depend_on_the_count():
    assert expand_spec(random_spec(count=3)) == expand_spec(random_spec(count=10))[:3]


def test_refusals_name_the_key_and_the_fix():
    assert "not a config key" in errors({"mode": "grid", "params": {"actor.lr": [1]}})["actor.lr"]
    resume = "trainer.resume_mode"
    assert "the server sets" in errors({"mode": "grid", "params": {resume: ["auto"]}})[resume]
    assert "list of values" in errors({"mode": "grid", "params": {LR: {"uniform": [0, 1]}}})[LR]
    assert "at least one value" in errors({"mode": "grid", "params": {LR: []}})[LR]
    assert (
        "above 0"
        in errors(
            {"mode": "random", "count": 2, "seed": 0, "params": {LR: {"log_uniform": [0, 1e-4]}}}
        )[LR]
    )
    assert (
        "above its high"
        in errors(
            {"mode": "random", "count": 2, "seed": 0, "params": {LR: {"uniform": [1e-4, 1e-6]}}}
        )[LR]
    )
    assert (
        "whole-number"
        in errors({"mode": "random", "count": 2, "seed": 0, "params": {N: {"int": [1.5, 4]}}})[N]
    )
    assert (
        "one of uniform, log_uniform, int, choice"
        in errors({"mode": "random", "count": 2, "seed": 0, "params": {LR: {"normal": [0, 1]}}})[LR]
    )
    found = errors({"mode": "random", "params": {LR: [1]}})
    assert "whole number" in found["count"] and "whole number" in found["seed"]
    assert "choose grid, random or tpe" in errors({"mode": "bayes", "params": {LR: [1]}})["mode"]
    assert "no count" in errors({"mode": "grid", "count": 3, "params": {LR: [1]}})["count"]
    assert "at least one" in errors({"mode": "grid", "params": {}})["params"]


def test_a_grid_over_the_member_limit_is_refused_before_it_is_expanded():
    values = list(range(MAX_MEMBERS // 2 + 1))
    found = errors({"mode": "grid", "params": {N: values, ADV: ["grpo", "rloo"]}})
    assert f"over {MAX_MEMBERS}" in found["params"]
