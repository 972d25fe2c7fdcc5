"""The search and the pruners on hand-made member histories: TPE's draws are a function of the
seed and the history (in this process and in a fresh one), the pruners stop exactly the members
their rules say, and the reason's threshold is the one the pruner compared with."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.conf import settings

from webapp.sweeps.search import member_values, prune_decision, rung_attrs, suggest, trial_params
from webapp.sweeps.spec import parse_spec
from webapp.sweeps.trials import COMPLETE, FAILED, PRUNED, RUNNING, MemberHistory

LR = "actor_rollout_ref.actor.optim.lr"
N = "actor_rollout_ref.rollout.n"
ADV = "algorithm.adv_estimator"
KL = "algorithm.kl_ctrl.kl_coef"
METRIC = "val-core/tiny_arithmetic/reward/mean@1"


def tpe_spec(seed=3, pruner=None, direction="maximize", startup=2):
    return parse_spec(
        {
            "mode": "tpe",
            "count": 20,
            "seed": seed,
            "n_startup_trials": startup,
            "params": {
                LR: {"log_uniform": [1e-6, 1e-4]},
                KL: {"uniform": [0.0, 0.01]},
                N: {"int": [2, 8]},
                ADV: ["grpo", "rloo", ["a", "list"]],  # a choice may be any JSON value
            },
            "objective": {"metric": METRIC, "direction": direction},
            **({"pruner": pruner} if pruner else {}),
        }
    )


def history(spec, scores: list[float]) -> list[MemberHistory]:
    """Return finished members drawn one after another, the i-th scoring ``scores[i]``."""
    members: list[MemberHistory] = []
    for index, score in enumerate(scores, start=1):
        values = suggest(spec, members)
        members.append(
            MemberHistory(
                index=index, values=values, state=COMPLETE, scores={5: score / 2, 10: score}
            )
        )
    return members


def inside(spec, values) -> bool:
    return (
        1e-6 <= values[LR] <= 1e-4
        and 0.0 <= values[KL] <= 0.01
        and values[N] in range(2, 9)
        and isinstance(values[N], int)
        and values[ADV] in spec["params"][ADV]["choice"]
    )


def test_tpe_draws_are_a_function_of_the_seed_and_the_history():
    spec = tpe_spec()
    members = history(spec, [0.1, 0.5, 0.3, 0.7, 0.2, 0.6])
    assert members == history(spec, [0.1, 0.5, 0.3, 0.7, 0.2, 0.6])
    assert all(inside(spec, m.values) for m in members)
    assert len({m.values[LR] for m in members}) == 6  # each member draws with its own state
    after = suggest(spec, members)
    assert suggest(spec, members) == after and inside(spec, after)
    # Another seed, or another score in the history (past the random start-up), draws otherwise.
    assert suggest(tpe_spec(seed=4), members) != after
    changed = [*members[:-1], MemberHistory(6, members[-1].values, COMPLETE, {5: 0.5, 10: 0.99})]
    assert suggest(spec, changed) != after
    # A member still running counts (constant liar): the next draw is not the same point.
    running = [*members, MemberHistory(7, after, RUNNING, {5: 0.1})]
    assert suggest(spec, running) != after


def test_a_choice_is_searched_as_its_index_and_comes_back_as_its_value():
    params = tpe_spec()["params"]
    values = {LR: 1e-5, KL: 0.0, N: 4, ADV: ["a", "list"]}
    assert trial_params(params, values)[ADV] == 2
    assert member_values(params, trial_params(params, values)) == values


SUGGEST_IN_A_NEW_PROCESS = """
import json, sys
from webapp.sweeps.search import suggest
from webapp.sweeps.trials import MemberHistory
spec, members = json.loads(sys.stdin.read())
members = [
    MemberHistory(m["index"], m["values"], m["state"], {int(k): v for k, v in m["scores"].items()})
    for m in members
]
print(json.dumps(suggest(spec, members)))
"""


def test_a_fresh_process_rebuilds_the_study_and_draws_the_same_next_member():
    spec = tpe_spec()
    members = history(spec, [0.1, 0.5, 0.3, 0.7])
    members += [
        MemberHistory(5, suggest(spec, members), FAILED),
        MemberHistory(6, {LR: 2e-6, KL: 0.001, N: 3, ADV: "rloo"}, PRUNED, {5: 0.01}),
        MemberHistory(7, {LR: 5e-5, KL: 0.002, N: 6, ADV: "grpo"}, RUNNING, {5: 0.4}),
    ]
    sent = json.dumps(
        [spec, [{**m.__dict__, "scores": m.scores} for m in members]],
    )
    out = subprocess.run(
        [sys.executable, "-c", SUGGEST_IN_A_NEW_PROCESS],
        input=sent,
        capture_output=True,
        text=True,
        check=True,
        cwd=settings.BASE_DIR,
        timeout=120,
    )
    assert json.loads(out.stdout) == json.loads(json.dumps(suggest(spec, members)))


MEDIAN = {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 0}


def finished(scores: dict[int, float], index: int = 1) -> MemberHistory:
    return MemberHistory(index, {LR: 1e-5, KL: 0.0, N: 4, ADV: "grpo"}, COMPLETE, scores)


def judged(spec, others, scores):
    current = MemberHistory(
        len(others) + 1, {LR: 2e-5, KL: 0.0, N: 4, ADV: "grpo"}, RUNNING, scores
    )
    return prune_decision(spec, [*others, current], current.index)


def test_the_median_pruner_stops_a_member_whose_best_value_is_below_the_finished_median():
    spec = tpe_spec(pruner=MEDIAN)
    others = [
        finished({5: 0.2, 10: 0.4}, 1),
        finished({5: 0.4, 10: 0.5}, 2),
        finished({5: 0.6, 10: 0.7}, 3),
    ]
    decision = judged(spec, others, {5: 0.3})
    assert decision is not None
    assert decision.as_dict() == {
        "metric": METRIC,
        "step": 5,
        "value": 0.3,
        "threshold": 0.4,
        "pruner": "median",
        "rung": None,
        "compared": 3,
        "text": f"best {METRIC} so far = 0.3 at step 5, below the median 0.4 of 3 finished member(s)",
    }
    assert judged(spec, others, {5: 0.45}) is None  # above the median
    # The member's best value so far is compared with the median at the step judged: 0.45 < 0.5.
    later = judged(spec, others, {5: 0.45, 10: 0.3})
    assert later is not None and (later.value, later.threshold) == (0.45, 0.5)
    # Two finished members are needed (n_startup_trials=2); a running or pruned one does not count.
    few = [finished({5: 0.9}, 1), MemberHistory(2, others[0].values, PRUNED, {5: 0.9})]
    assert judged(spec, few, {5: 0.1}) is None
    # No decision during the warm-up steps.
    warm = tpe_spec(pruner={**MEDIAN, "n_warmup_steps": 6})
    assert judged(warm, others, {5: 0.0}) is None
    assert judged(warm, others, {5: 0.0, 10: 0.0}).step == 10


def test_the_median_pruner_minimizing_stops_a_member_above_the_median():
    spec = tpe_spec(pruner=MEDIAN, direction="minimize")
    others = [finished({5: 1.0}, 1), finished({5: 2.0}, 2), finished({5: 3.0}, 3)]
    decision = judged(spec, others, {5: 2.5})
    assert decision is not None and (decision.value, decision.threshold) == (2.5, 2.0)
    assert "above the median 2" in decision.text()
    assert judged(spec, others, {5: 1.5}) is None


HALVING = {"type": "successive_halving", "min_resource": 2, "reduction_factor": 2}


def test_rungs_are_recomputed_from_a_history_as_successive_halving_wrote_them():
    pruner = parse_spec(
        {"mode": "grid", "params": {LR: [1e-6]}, "pruner": HALVING,
         "objective": {"metric": METRIC}}
    )["pruner"]  # fmt: skip
    assert pruner == {**HALVING, "min_early_stopping_rate": 0}
    # Rungs at steps 2, 4, 8: the value of the first recorded step at or past each.
    scores = {1: 0.1, 3: 0.3, 5: 0.5, 9: 0.9}
    assert rung_attrs(pruner, scores) == {
        "completed_rung_0": 0.3,
        "completed_rung_1": 0.5,
        "completed_rung_2": 0.9,
    }
    # A member pruned at rung 1 wrote rung 1 and none after.
    assert rung_attrs(pruner, {1: 0.1, 3: 0.3, 5: 0.5}, failed_rung=1) == {
        "completed_rung_0": 0.3,
        "completed_rung_1": 0.5,
    }
    assert rung_attrs(None, scores) == {} and rung_attrs(MEDIAN, scores) == {}


def test_successive_halving_keeps_the_best_half_at_each_rung():
    spec = tpe_spec(pruner=HALVING)
    others = [
        finished({2: 0.2, 4: 0.3}, 1),
        finished({2: 0.5, 4: 0.6}, 2),
        finished({2: 0.7, 4: 0.9}, 3),
    ]
    # Rung 0 (step 2): four values 0.2, 0.5, 0.7 and its own; the best two go on.
    decision = judged(spec, others, {2: 0.4})
    assert decision is not None
    assert (decision.rung, decision.threshold, decision.compared) == (0, 0.5, 4)
    assert decision.text() == (
        f"{METRIC} = 0.4 at step 2, below the cutoff 0.5 of rung 0 (4 member(s) reached it)"
    )
    assert judged(spec, others, {2: 0.6}) is None
    # Past rung 0 at step 2, judged again at rung 1 (step 4) against 0.3, 0.6, 0.9 and its own.
    at_rung_1 = judged(spec, others, {2: 0.6, 4: 0.5})
    assert at_rung_1 is not None and (at_rung_1.rung, at_rung_1.threshold) == (1, 0.6)
    # The first member to reach a rung goes on: nobody to compare with.
    assert judged(spec, [], {2: 0.0}) is None


@pytest.mark.parametrize("pruner", [MEDIAN, HALVING])
def test_no_pruner_no_value_or_a_pruned_members_later_steps_decide_nothing(pruner):
    spec = tpe_spec(pruner=pruner)
    assert judged(tpe_spec(), [finished({2: 0.9, 5: 0.9})], {2: 0.0, 5: 0.0}) is None
    assert judged(spec, [finished({2: 0.9, 5: 0.9})], {}) is None


def test_the_draws_do_not_depend_on_the_order_the_database_keeps_the_keys_in():
    spec = tpe_spec()
    members = history(spec, [0.1, 0.5, 0.3])
    shuffled = {**spec, "params": dict(reversed(list(spec["params"].items())))}
    assert suggest(shuffled, members) == suggest(spec, members)
