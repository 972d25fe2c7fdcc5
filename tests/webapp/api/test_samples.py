"""``/api/runs/{id}/samples``: the inspector's slices and exports, its filters and messages."""

from __future__ import annotations

import csv
import io
import json

import pytest

from engine.trainer.reporting import SampleRecord
from tests.webapp.api.helpers import errors_of
from tests.webapp.live import running_run
from webapp.runs.driver_writes import samples_write
from webapp.samples.forms import SampleFilterForm

pytestmark = pytest.mark.django_db


def record(step: int, prompt: int, sample: int, reward: float) -> SampleRecord:
    return SampleRecord(
        step=step, split="train", prompt_index=prompt, sample_index=sample, group_id=f"g{prompt}",
        data_source="tiny", prompt_text=f"prompt {prompt}", response_text=f"answer {sample}",
        ground_truth="1", reward=reward, tokens=["a", "b"], token_logprobs=[-0.5, -1.0],
    )  # fmt: skip


@pytest.fixture
def run(owner):
    run = running_run(owner)
    rows = [record(step, p, s, float(s)) for step in (1, 2) for p in (0, 1) for s in (0, 1, 2)]
    rows.append(record(2, 2, 0, float("nan")))
    samples_write(run_id=run.pk, samples=rows)
    return run


def test_steps_pages_and_filters_follow_the_inspector(api, run):
    assert api.get(f"/runs/{run.pk}/samples/steps").json() == {"train": [1, 2], "val": []}
    latest = api.get(f"/runs/{run.pk}/samples").json()
    assert latest["step"] == 2 and latest["count"] == 7
    assert [s["reward"] for s in latest["samples"]][-1] is None  # NaN is not JSON
    page = api.get(
        f"/runs/{run.pk}/samples", {"step": 1, "sort": "-reward", "per_page": 25, "reward_min": 1}
    ).json()
    assert page["count"] == 4 and [s["reward"] for s in page["samples"]] == [2.0, 2.0, 1.0, 1.0]
    assert api.get(f"/runs/{run.pk}/samples", {"q": "prompt 1", "step": 1}).json()["count"] == 3


def test_bad_filters_get_the_inspectors_messages_by_name(api, run):
    query = {"reward_min": 2, "reward_max": 1, "per_page": 7}
    form = SampleFilterForm(query)
    assert not form.is_valid()
    response = api.get(f"/runs/{run.pk}/samples", query)
    assert response.status_code == 400
    errors = errors_of(response)
    assert errors["per_page"] == form.errors["per_page"][0]
    assert errors[None] == form.errors["__all__"][0]
    assert api.get(f"/runs/{run.pk}/samples", {"step": -1}).status_code == 400


def test_a_group_shows_its_members_tokens_and_grpo_normalisation(api, run):
    group = api.get(f"/runs/{run.pk}/samples/group", {"prompt": 1, "step": 1}).json()
    assert [m["sample_index"] for m in group["members"]] == [0, 1, 2]
    assert group["reward_mean"] == pytest.approx(1.0) and group["reward_std"] == pytest.approx(1.0)
    assert [round(m["normalized"], 4) for m in group["members"]] == [-1.0, 0.0, 1.0]
    assert group["members"][0]["token_view"]["tokens"] == ["a", "b"]
    missing = api.get(f"/runs/{run.pk}/samples/group", {"prompt": 9, "step": 1})
    assert missing.status_code == 404 and "prompt" in errors_of(missing)
    unnamed = api.get(f"/runs/{run.pk}/samples/group")
    assert unnamed.status_code == 400
    assert errors_of(unnamed)["prompt"] == "Name a prompt: add prompt=<prompt index>."


def test_exports_stream_the_filtered_samples(api, run):
    response = api.get(f"/runs/{run.pk}/samples/export", {"step": 1, "reward_min": 2})
    assert response.status_code == 200
    lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert [(r["prompt_index"], r["reward"]) for r in lines] == [(0, 2.0), (1, 2.0)]
    assert lines[0]["tokens"] == ["a", "b"]
    table = api.get(f"/runs/{run.pk}/samples/export", {"format": "csv", "step": 2})
    rows = b"".join(table.streaming_content).decode().splitlines()
    assert rows[0].startswith("run_id,step,split") and len(rows) == 8


def test_a_multi_turn_sample_carries_the_turns_the_inspector_shows(api, owner):
    from tests.webapp.samples.test_turns import TURNS

    run = running_run(owner)
    multi = record(1, 0, 0, 1.0)
    multi.turns = TURNS + [{"role": "user", "content": "right", "score": 1.0, "ends": True}]
    samples_write(run_id=run.pk, samples=[multi, record(1, 0, 1, 0.0)])
    recorded = [{k: v for k, v in t.items() if v is not None} for t in multi.turns]

    def given(turns):  # the schema names every key; the unset ones come back null
        return [{k: v for k, v in t.items() if v is not None} for t in turns]

    page = api.get(f"/runs/{run.pk}/samples", {"step": 1}).json()["samples"]
    assert given(page[0]["turns"]) == recorded and page[1]["turns"] is None
    assert page[0]["turns"][1]["role"] == "tool" and page[0]["turns"][1]["content"] == "579"
    assert page[0]["turns"][0]["tool_calls"] == [{"name": "calc", "arguments": {"expr": "123+456"}}]
    assert page[0]["turns"][3]["error"] == "the tool call is not valid JSON"
    group = api.get(f"/runs/{run.pk}/samples/group", {"prompt": 0, "step": 1}).json()
    assert given(group["members"][0]["turns"]) == recorded
    assert group["members"][1]["turns"] is None

    export = api.get(f"/runs/{run.pk}/samples/export", {"step": 1, "tokens": False})
    lines = [json.loads(line) for line in b"".join(export.streaming_content).splitlines()]
    assert lines[0]["turns"] == multi.turns and lines[1]["turns"] is None
    table = api.get(f"/runs/{run.pk}/samples/export", {"step": 1, "format": "csv"})
    rows = list(csv.DictReader(io.StringIO(b"".join(table.streaming_content).decode())))
    assert json.loads(rows[0]["turns"]) == multi.turns and rows[1]["turns"] == ""

    schema = api.client.get("/api/openapi.json").json()["components"]["schemas"]
    assert "turns" in schema["SampleOut"]["properties"]
    assert set(schema["TurnOut"]["properties"]) >= {"role", "content", "tool_calls", "error"}
