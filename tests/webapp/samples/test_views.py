"""Inspector pages for their owner: what each shows, and the 400 that names a bad parameter."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from tests.webapp.samples.conftest import finished_run, records
from webapp.runs.driver_writes import samples_write

pytestmark = pytest.mark.django_db


def url(name: str, run, **query) -> str:
    base = reverse(f"samples:{name}", kwargs={"run_id": run.pk})
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def json_script(page: str, element_id: str):
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', page)
    return json.loads(match.group(1))


def test_the_run_page_links_to_the_inspector(client_in, sampled_run):
    page = client_in.get(sampled_run.get_absolute_url()).content.decode()
    assert f'href="{url("step", sampled_run)}"' in page


def test_the_step_view_opens_at_the_latest_step_with_a_slider(client_in, sampled_run):
    response = client_in.get(url("step", sampled_run))
    page = response.content.decode()
    assert response.context["step"] == 3
    assert page.count("<tr data-sample-id=") == 12
    assert json_script(page, "inspector-steps") == [1, 2, 3]
    assert 'id="step-slider" min="0" max="2" value="2"' in page
    assert "What is 2 + 1?" in page and "answer 2-3 at 3" in page


def test_the_step_view_filters_sorts_and_paginates_on_the_server(client_in, sampled_run):
    response = client_in.get(
        url("step", sampled_run, step=2, sort="-reward", reward_min=2.5, per_page=25)
    )
    rows = [(s.prompt_index, s.sample_index) for s in response.context["page"].samples]
    assert rows == [(1, 3), (2, 2), (0, 3), (1, 2), (2, 1), (0, 2), (1, 1), (2, 0)]
    page = response.content.decode()
    assert "rows 1–8 of 8" in page
    # The export links carry the same filters, for this step and for every step.
    assert re.search(r"export\.csv\?step=2&amp;sort=-reward&amp;reward_min=2\.5", page)
    assert re.search(r'export\.csv\?sort=-reward&amp;reward_min=2\.5&amp;per_page=25"', page)
    second = client_in.get(url("step", sampled_run, step=2, per_page=25, page=2))
    assert second.context["page"].number == 1  # clamped: 12 rows fit on one page


def test_validation_samples_are_apart_from_training_samples(client_in, sampled_run):
    response = client_in.get(url("step", sampled_run, split="val"))
    assert response.context["steps"] == [0, 3]
    assert [s.split for s in response.context["page"].samples] == ["val", "val"]


def test_a_step_without_samples_shows_the_nearest_one(client_in, sampled_run):
    response = client_in.get(url("step", sampled_run, split="val", step=2))
    assert response.context["step"] == 3
    assert "No val samples at step 2; showing step 3" in response.content.decode()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"step": -1}, "step: Ensure this value is greater than or equal to 0."),
        ({"step": "ten"}, "step: Enter a whole number."),
        ({"reward_min": 2, "reward_max": 1}, "swap the two bounds or clear one"),
        ({"sort": "best"}, "sort: Select a valid choice. best is not one of the available"),
        ({"reward_min": "nan"}, "reward_min: Enter a number."),
    ],
)
def test_bad_parameters_answer_400_naming_them(client_in, sampled_run, query, message):
    response = client_in.get(url("step", sampled_run, **query))
    assert response.status_code == 400
    assert message in response.content.decode()


def test_a_run_without_samples_says_so(client_in, owner):
    run = finished_run(owner)
    page = client_in.get(url("step", run)).content.decode()
    assert "No train samples recorded yet." in page


def test_the_group_view_shows_the_group_and_its_tokens(client_in, sampled_run):
    response = client_in.get(url("group", sampled_run, step=1, prompt=0, sample=2))
    page = response.content.decode()
    assert page.count('<article class="response-card') == 4
    assert 'class="group-mean">1.375<' in page and 'class="group-std">0.3227<' in page
    assert 'class="response-card selected" id="sample-2"' in page
    assert 'prompt=1" rel="next">prompt 1 →' in page and 'rel="prev"' not in page
    tokens = json_script(page, "inspector-tokens")
    assert [row["sample_index"] for row in tokens] == [0, 1, 2, 3]
    assert tokens[0]["kl"] == [0.25, -0.5, 0.0]
    assert tokens[0]["advantage"] == [-1.0, -1.0, -1.0]


def test_the_group_view_needs_a_prompt(client_in, sampled_run):
    response = client_in.get(url("group", sampled_run, step=1))
    assert response.status_code == 400
    assert "Name a prompt: add prompt=&lt;prompt index&gt;." in response.content.decode()


def test_the_group_view_defaults_to_the_latest_step(client_in, sampled_run):
    response = client_in.get(url("group", sampled_run, split="val", prompt=1))
    assert response.context["step"] == 3
    assert response.context["group"].first.prompt_text == "val 1"


def test_across_steps_shows_the_trend_and_each_steps_responses(client_in, sampled_run):
    page = client_in.get(url("prompt", sampled_run, prompt=1)).content.decode()
    assert json_script(page, "inspector-trend") == [
        {"step": 1, "reward": 1.625, "n": 4},
        {"step": 2, "reward": 2.625, "n": 4},
        {"step": 3, "reward": 3.625, "n": 4},
    ]
    assert page.count('<section class="column"') == 3
    assert "answer 1-0 at 1" in page and "answer 1-3 at 3" in page


def test_across_runs_shows_deltas_against_the_chosen_reference(client_in, sampled_run, owner):
    ppo = finished_run(owner, "ppo")
    samples_write(run_id=ppo.pk, samples=records(3, 1, [4.0, 4.0]))
    response = client_in.get(url("compare", sampled_run, prompt=1, runs=ppo.pk))
    page = response.content.decode()
    assert '<td class="delta">+0.375</td>' in page
    assert page.count('class="response-text diffable"') == 6
    flipped = client_in.get(
        url("compare", sampled_run, prompt=1, runs=ppo.pk, reference=ppo.pk)
    ).content.decode()
    assert '<td class="delta">-0.375</td>' in flipped


def test_the_steps_endpoint_lists_steps_per_split(client_in, sampled_run):
    data = client_in.get(url("steps", sampled_run)).json()
    assert data == {
        "status": "succeeded",
        "active": False,
        "steps": {"train": [1, 2, 3], "val": [0, 3]},
    }


def test_the_whole_run_view_sorts_every_steps_responses_worst_first(client_in, sampled_run):
    response = client_in.get(url("run", sampled_run, per_page=25))
    samples = response.context["page"].samples
    assert response.context["page"].count == 36  # 3 steps x 3 prompts x 4 samples
    # Step s, prompt p, sample i scored (p + i) / 4 + s: the worst is step 1's prompt 0, sample 0.
    assert [(s.step, s.prompt_index, s.sample_index) for s in samples[:2]] == [
        (1, 0, 0),
        (1, 0, 1),
    ]
    page = response.content.decode()
    assert "rows 1–25 of 36" in page and 'data-step="1"' in page
    assert "<th>ground truth</th>" in page and "<code>1</code>" in page
    best = client_in.get(url("run", sampled_run, sort="-reward")).context["page"].samples
    assert (best[0].step, best[0].prompt_index, best[0].sample_index) == (3, 2, 3)  # 4.25
    # The NaN reward (step 2, prompt 2, sample 3) sorts last either way.
    last = client_in.get(url("run", sampled_run, per_page=25, page=2)).context["page"].samples
    assert (last[-1].step, last[-1].prompt_index, last[-1].sample_index) == (2, 2, 3)
    longest = client_in.get(url("run", sampled_run, sort="-length")).context["page"].samples
    assert {s.response_length for s in longest[:9]} == {6}


def test_recurring_prompts_are_listed_by_how_their_reward_changed(client_in, owner):
    run = finished_run(owner)
    rows = []
    for step, rewards in ((1, ([0.0, 0.0], [1.0, 1.0], [0.5])), (5, ([1.0, 1.0], [0.0, 0.5]))):
        for prompt, values in enumerate(rewards):
            rows += records(step, prompt, list(values))
    samples_write(run_id=run.pk, samples=rows)
    response = client_in.get(url("prompts", run))
    recurring = response.context["recurring"]
    assert recurring.count == 2  # prompt 2 was sampled once
    assert [(p.prompt_index, p.steps, p.first_mean, p.last_mean) for p in recurring.prompts] == [
        (0, 2, 0.0, 1.0),
        (1, 2, 1.0, 0.25),
    ]
    page = response.content.decode()
    assert (
        '<td class="value change">+1</td>' in page and '<td class="value change">-0.75</td>' in page
    )
    assert f'href="{url("prompt", run)}?split=train&amp;prompt=0"' in page
    worse = client_in.get(url("prompts", run, order="change")).context["recurring"]
    assert [p.prompt_index for p in worse.prompts] == [1, 0]
    bad = client_in.get(url("prompts", run, order="sideways"))
    assert bad.status_code == 400 and "sideways" in bad.content.decode()
    assert (
        "sampled at two steps yet"
        in client_in.get(url("prompts", run, split="val")).content.decode()
    )


def test_a_byte_that_is_not_utf8_shows_as_that_byte_in_both_views(client_in, owner):
    run = finished_run(owner)
    broken = records(1, 0, [0.0], responses=["9\ufffd7"], tokens=["9", "Þ", "7"])
    broken[0].token_logprobs = [-0.1, -2.0, -0.1]
    broken[0].token_ref_logprobs = None
    split = records(1, 1, [1.0], responses=["9×7"], tokens=["9", "Ã", "Ĺ", "7"])
    split[0].token_logprobs = [-0.1, -0.2, -0.3, -0.1]
    split[0].token_ref_logprobs = None
    split[0].token_advantages = None
    broken[0].token_advantages = None
    samples_write(run_id=run.pk, samples=broken + split)
    box = (
        '9<span class="bad-byte" title="byte 0xDE is not UTF-8 here: the model wrote part of a '
        'character">DE</span>7'
    )
    assert box in client_in.get(url("step", run, step=1)).content.decode()
    assert box in client_in.get(url("run", run)).content.decode()
    group = client_in.get(url("group", run, step=1, prompt=0)).content.decode()
    assert box in group
    tokens = json_script(group, "inspector-tokens")[0]
    assert tokens["tokens"] == ["9", "Þ", "7"] and tokens["text"] == ["9", "\\xDE", "7"]
    assert tokens["bad"] == [False, True, False]
    whole = json_script(
        client_in.get(url("group", run, step=1, prompt=1)).content.decode(), "inspector-tokens"
    )[0]
    assert whole["text"] == ["9", "", "×", "7"] and whole["partial"] == [False, True, False, False]
    assert whole["hex"] == ["39", "C3", "97", "37"]


def test_a_judges_reply_shows_beside_its_score_in_both_views(client_in, owner):
    run = finished_run(owner)
    judged = records(1, 0, [0.75, 0.0])
    judged[0].reward_parts = {
        "score/exact_match": 1.0,
        "score/reward_model": 0.5,
        "reward_model/judge_text": "Partly right <b>5</b>: \\boxed{0.5}",
    }
    # A reply the parser could not read is kept with the sample's reward error.
    judged[1].reward_parts = {"reward_model/judge_text": "I refuse"}
    judged[1].reward_error = "JudgeParseError: no \\boxed{} value in the judge's reply"
    samples_write(run_id=run.pk, samples=judged)
    reply = "Partly right &lt;b&gt;5&lt;/b&gt;: \\boxed{0.5}"
    for page in (
        client_in.get(url("group", run, step=1, prompt=0)).content.decode(),
        client_in.get(url("step", run, step=1)).content.decode(),
    ):
        assert '<span class="part">score/reward_model <b>0.5</b></span>' in page
        assert (
            '<div class="judge"><span class="part">reward_model judge said</span>'
            f'<pre class="judge-text">{reply}</pre></div>'
        ) in page
        assert '<pre class="judge-text">I refuse</pre>' in page
        assert "reward_model/judge_text" not in page  # text, not a number part
