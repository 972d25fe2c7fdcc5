"""Inspector selectors on a real PostgreSQL, against hand-computed values (see ``sampled_run``)."""

from __future__ import annotations

import math

import pytest

from tests.webapp.samples.conftest import finished_run, records
from webapp.runs.driver_writes import samples_write
from webapp.samples.selectors import (
    SampleFilter,
    reward_stats,
    sample_across_runs,
    sample_export_rows,
    sample_group,
    sample_neighbour_prompts,
    sample_page,
    sample_prompt_history,
    sample_step_summary,
    sample_steps,
    token_rows,
)

pytestmark = pytest.mark.django_db


def positions(page_or_samples) -> list[tuple[int, int]]:
    samples = getattr(page_or_samples, "samples", page_or_samples)
    return [(s.prompt_index, s.sample_index) for s in samples]


def page(run, user, **filters):
    per_page = filters.pop("per_page", 50)
    number = filters.pop("page", 1)
    return sample_page(
        user=user,
        run_id=run.pk,
        filters=SampleFilter(**{"step": 2, **filters}),
        page=number,
        per_page=per_page,
    )


def test_reward_stats_are_the_mean_and_unbiased_std_of_the_finite_rewards():
    mean, std = reward_stats([1.0, 1.25, 1.5, 1.75, float("nan"), None])
    assert mean == 1.375
    assert std == pytest.approx(math.sqrt(0.3125 / 3))
    assert reward_stats([2.0]) == (2.0, None)
    assert reward_stats([float("nan")]) == (None, None)


def test_steps_are_listed_per_split(sampled_run, owner):
    assert sample_steps(user=owner, run_id=sampled_run.pk, split="train") == [1, 2, 3]
    assert sample_steps(user=owner, run_id=sampled_run.pk, split="val") == [0, 3]


def test_the_step_view_reads_one_step_in_prompt_and_sample_order(sampled_run, owner):
    result = page(sampled_run, owner)
    assert result.count == 12
    assert positions(result) == [(p, i) for p in range(3) for i in range(4)]
    assert {s.step for s in result.samples} == {2}
    assert "tokens" in result.samples[0].get_deferred_fields()


def test_a_reward_range_keeps_finite_rewards_inside_it(sampled_run, owner):
    assert positions(page(sampled_run, owner, reward_min=2.5, reward_max=2.75)) == [
        (0, 2),
        (0, 3),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
    ]
    # PostgreSQL orders NaN above every number: a lower bound alone must still drop it.
    assert positions(page(sampled_run, owner, reward_min=2.9)) == [(1, 3), (2, 2)]


def test_text_search_looks_in_prompt_and_response_ignoring_case(sampled_run, owner):
    assert positions(page(sampled_run, owner, text="ANSWER 1-2")) == [(1, 2)]
    assert positions(page(sampled_run, owner, text="what is 2 +")) == [(2, i) for i in range(4)]


def test_truncated_only(sampled_run, owner):
    assert positions(page(sampled_run, owner, truncated_only=True)) == [(0, 3), (1, 3), (2, 3)]


def test_sort_by_reward_puts_nan_last_in_both_directions(sampled_run, owner):
    highest = positions(page(sampled_run, owner, sort="-reward"))
    assert highest[:5] == [(1, 3), (2, 2), (0, 3), (1, 2), (2, 1)]
    assert highest[-1] == (2, 3)
    lowest = positions(page(sampled_run, owner, sort="reward"))
    assert lowest[:3] == [(0, 0), (0, 1), (1, 0)]
    assert lowest[-1] == (2, 3)


def test_sort_by_advantage_and_length(sampled_run, owner):
    by_advantage = page(sampled_run, owner, step=3, sort="advantage")
    assert [s.advantage for s in by_advantage.samples[:2]] == [-1.0, -1.0]
    assert positions(by_advantage)[-1] == (0, 0)  # its advantage is null
    longest = page(sampled_run, owner, sort="-length")
    assert [s.response_length for s in longest.samples[:3]] == [6, 6, 6]
    assert positions(longest)[:3] == [(0, 3), (1, 3), (2, 3)]


def test_pages_count_and_clamp(sampled_run, owner):
    third = page(sampled_run, owner, per_page=5, page=3)
    assert (third.count, third.num_pages, third.number) == (12, 3, 3)
    assert positions(third) == [(2, 2), (2, 3)]
    assert (third.start_index, third.end_index, third.has_next, third.has_previous) == (
        11,
        12,
        False,
        True,
    )
    assert page(sampled_run, owner, per_page=5, page=9).number == 3
    with pytest.raises(ValueError, match="page=0"):
        page(sampled_run, owner, page=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "test"}, "split='test' is unknown; use one of"),
        ({"sort": "reward desc"}, "sort='reward desc' is unknown"),
        ({"step": -1}, "step=-1 is negative"),
        ({"reward_min": 2, "reward_max": 1}, "reward_min=2 is above reward_max=1; swap them"),
    ],
)
def test_bad_filters_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SampleFilter(**kwargs)


def test_the_step_summary(sampled_run, owner):
    summary = sample_step_summary(user=owner, run_id=sampled_run.pk, split="train", step=2)
    assert summary.count == 12
    assert summary.reward_mean == pytest.approx(28.25 / 11)  # the NaN reward left out
    assert summary.response_length_mean == 4.5
    assert summary.truncated == 3


def test_a_group_has_its_statistics_and_grpo_normalized_rewards(sampled_run, owner):
    group = sample_group(user=owner, run_id=sampled_run.pk, split="train", step=1, prompt_index=0)
    assert [m.sample.sample_index for m in group.members] == [0, 1, 2, 3]
    assert group.reward_mean == 1.375
    std = math.sqrt(0.3125 / 3)
    assert group.reward_std == pytest.approx(std)
    assert group.members[0].normalized == pytest.approx(-0.375 / (std + 1e-6))
    assert group.first.tokens == ["Ġ4", "2", "</s>"]

    with_nan = sample_group(
        user=owner, run_id=sampled_run.pk, split="train", step=2, prompt_index=2
    )
    assert (with_nan.reward_mean, with_nan.reward_std) == (2.75, 0.25)
    assert with_nan.members[3].normalized is None
    assert with_nan.members[0].normalized == pytest.approx(-0.25 / 0.250001)
    assert (
        sample_group(user=owner, run_id=sampled_run.pk, split="val", step=1, prompt_index=0) is None
    )


def test_neighbour_prompts_are_those_sampled_at_the_same_step(sampled_run, owner):
    def neighbours(split, step, prompt):
        return sample_neighbour_prompts(
            user=owner, run_id=sampled_run.pk, split=split, step=step, prompt_index=prompt
        )

    assert neighbours("train", 1, 1) == (0, 2)
    assert neighbours("train", 1, 0) == (None, 1)
    assert neighbours("val", 3, 1) == (0, None)


def test_token_rows_give_log_prob_minus_reference_and_drop_non_finite_values(sampled_run, owner):
    group = sample_group(user=owner, run_id=sampled_run.pk, split="train", step=1, prompt_index=0)
    first = group.first
    first.token_logprobs = [-0.25, float("-inf"), -0.125]
    rows = token_rows([first, group.members[1].sample])
    assert rows[0]["tokens"] == ["Ġ4", "2", "</s>"]
    assert rows[0]["logprob"] == [-0.25, None, -0.125]
    assert rows[0]["kl"] == [0.25, None, 0.0]
    assert rows[1]["kl"] == [0.25, -0.5, 0.0]
    assert rows[1]["advantage"] == [0.0, 0.0, 0.0]
    first.token_ref_logprobs = None
    assert token_rows([first])[0]["kl"] is None


def test_a_prompt_followed_across_steps(sampled_run, owner):
    history = sample_prompt_history(
        user=owner, run_id=sampled_run.pk, split="train", prompt_index=1, steps_per_page=2
    )
    assert [(p.step, p.reward_mean, p.count) for p in history.trend] == [
        (1, 1.625, 4),
        (2, 2.625, 4),
        (3, 3.625, 4),
    ]
    assert (history.number, history.num_pages) == (1, 2)
    assert [g.step for g in history.groups] == [1, 2]
    assert [s.reward for s in history.groups[1].samples] == [2.25, 2.5, 2.75, 3.0]
    assert history.prompt_text == "What is 1 + 1?"
    last = sample_prompt_history(
        user=owner, run_id=sampled_run.pk, split="train", prompt_index=1, steps_per_page=2, page=7
    )
    assert last.number == 2 and [g.step for g in last.groups] == [3]
    val = sample_prompt_history(user=owner, run_id=sampled_run.pk, split="val", prompt_index=0)
    assert [(p.step, p.reward_mean) for p in val.trend] == [(0, 0.0), (3, 1.0)]
    assert (
        sample_prompt_history(user=owner, run_id=sampled_run.pk, split="val", prompt_index=5)
        is None
    )


@pytest.fixture
def other_runs(owner):
    """Runs to compare with ``sampled_run``'s train prompt 1 ("What is 1 + 1?")."""
    same_data = finished_run(owner, "ppo")
    samples_write(
        run_id=same_data.pk,
        samples=records(2, 1, [3.0] * 4) + records(6, 1, [4.0] * 4) + records(6, 0, [9.0] * 4),
    )
    shuffled = finished_run(owner, "shuffled data")
    samples_write(
        run_id=shuffled.pk, samples=records(4, 9, [0.0, 1.0], prompt_text="What is 1 + 1?")
    )
    empty = finished_run(owner, "never sampled")
    return same_data, shuffled, empty


def test_the_same_prompt_across_runs_with_deltas_against_the_reference(
    sampled_run, owner, other_runs
):
    same_data, shuffled, empty = other_runs
    result = sample_across_runs(
        user=owner,
        reference_run_id=sampled_run.pk,
        run_ids=[same_data.pk, shuffled.pk, empty.pk, sampled_run.pk],
        split="train",
        prompt_index=1,
    )
    assert result.prompt_text == "What is 1 + 1?"
    rows = [(r.run.pk, r.step, r.reward_mean, r.delta, r.is_reference) for r in result.runs]
    assert rows == [
        (sampled_run.pk, 3, 3.625, 0.0, True),
        (same_data.pk, 6, 4.0, 0.375, False),
        (shuffled.pk, 4, 0.5, -3.125, False),  # matched by text at another prompt index
        (empty.pk, None, None, None, False),
    ]
    assert [s.response_text for s in result.runs[2].samples] == [
        "answer 9-0 at 4",
        "answer 9-1 at 4",
    ]


def test_across_runs_at_a_step_takes_each_runs_latest_group_not_after_it(
    sampled_run, owner, other_runs
):
    same_data, _, _ = other_runs
    result = sample_across_runs(
        user=owner,
        reference_run_id=same_data.pk,
        run_ids=[sampled_run.pk],
        split="train",
        prompt_index=1,
        step=5,
    )
    assert [(r.run.pk, r.step, r.reward_mean, r.delta) for r in result.runs] == [
        (same_data.pk, 2, 3.0, 0.0),
        (sampled_run.pk, 3, 3.625, 0.625),
    ]


def test_exports_select_what_the_filters_select(sampled_run, owner):
    rows = sample_export_rows(
        user=owner,
        run_id=sampled_run.pk,
        filters=SampleFilter(step=2, truncated_only=True),
        with_tokens=False,
    )
    assert [(r[1], r[3], r[4]) for r in rows] == [(2, 0, 3), (2, 1, 3), (2, 2, 3)]
    every_step = sample_export_rows(
        user=owner, run_id=sampled_run.pk, filters=SampleFilter(split="val"), with_tokens=True
    )
    assert [(r[1], r[3]) for r in every_step] == [(0, 0), (0, 1), (3, 0), (3, 1)]
    assert list(every_step)[0][-4] == ["Ġ4", "2", "</s>"]
