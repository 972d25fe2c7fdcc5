"""The external-run API against the real PostgreSQL and Redis: create by key, config kept and
marked, idempotent and late steps, samples in batches, log lines by position, heartbeat and
finish, the limits' answers, and the same live events as the driver's recorder sends."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import timedelta

import pytest
from channels.layers import get_channel_layer
from django.utils import timezone

from tests.webapp.api.helpers import ApiClient, errors_of, token_of
from tests.webapp.fixtures import make_experiment, make_run
from webapp.experiments.models import Experiment
from webapp.external.models import ExternalRun
from webapp.external.services import LOG_FILE, prompt_index_of
from webapp.health.models import HealthAlert
from webapp.runs.driver_writes import runs_mark_lost
from webapp.runs.models import MetricPoint, Run, RunStatus, Sample
from webapp.runs.services import run_dir

pytestmark = pytest.mark.django_db

VERL_CONFIG = {
    "algorithm": {"adv_estimator": "grpo", "kl_ctrl": {"kl_coef": 0.001}},
    "data": {"train_batch_size": 512, "train_files": "/data/gsm8k/train.parquet"},
    "trainer": {"project_name": "gsm8k", "experiment_name": "qwen-grpo", "a_key_from_2027": 3},
    "actor_rollout_ref": {"rollout": {"n": 16, "brand_new_mode": "fast"}},
}


def create(api: ApiClient, key: str = "k" * 16, **body) -> dict:
    payload = {"key": key, "name": "qwen-grpo", "source": "verl", **body}
    response = api.post("/external-runs", payload)
    assert response.status_code in (200, 201), response.json()
    return response.json()


def sample(step: int, index: int, prompt: str = "What is 2+3?", **fields) -> dict:
    return {
        "step": step,
        "prompt": prompt,
        "response": f"answer {index}",
        "reward": float(index % 2),
        "sample_index": index,
        **fields,
    }


def test_a_create_with_the_same_key_returns_the_same_run_in_an_external_experiment(api, owner):
    first = api.post(
        "/external-runs",
        {"key": "a" * 20, "name": "qwen-grpo", "source": "verl", "config": VERL_CONFIG,
         "location": "gpu-07:/home/u/verl", "total_steps": 100, "tags": ["GSM8K"]},
    )  # fmt: skip
    again = api.post("/external-runs", {"key": "a" * 20, "name": "ignored", "source": "verl"})
    assert (first.status_code, again.status_code) == (201, 200)
    body = first.json()
    assert again.json()["id"] == body["id"]
    run = Run.objects.get(pk=body["id"])
    assert run.status == RunStatus.RUNNING and run.experiment.external
    assert run.driver == "external:verl" and run.total_steps == 100 and run.tags == ["gsm8k"]
    assert run.config == VERL_CONFIG  # kept as sent: paths are text here
    assert body["url"] == f"/runs/{run.pk}/" and body["location"] == "gpu-07:/home/u/verl"
    assert body["unknown_keys"] == [
        "actor_rollout_ref.rollout.brand_new_mode",
        "trainer.a_key_from_2027",
    ]
    # A second run of the same name joins the same experiment, numbered after the first.
    second = create(api, key="b" * 20)
    assert second["experiment_id"] == body["experiment_id"] and second["number"] == 2
    assert Experiment.objects.get(pk=body["experiment_id"]).config == {}


def test_the_config_is_attached_as_yaml_and_a_bad_yaml_names_its_field(api):
    run = create(api)
    text = "trainer:\n  project_name: p\n  total_epochs: 15\nrewards_v9:\n  weight: .nan\n"
    response = api.client.put(
        f"/api/external-runs/{run['id']}/config",
        json.dumps({"config_yaml": text}),
        content_type="application/json",
        headers=api.headers,
    )
    assert response.status_code == 200, response.json()
    assert Run.objects.get(pk=run["id"]).config == {
        "trainer": {"project_name": "p", "total_epochs": 15},
        "rewards_v9": {"weight": None},
    }
    assert response.json()["unknown_keys"] == ["rewards_v9.weight"]
    bad = api.client.put(
        f"/api/external-runs/{run['id']}/config",
        json.dumps({"config_yaml": "a: [1, 2"}),
        content_type="application/json",
        headers=api.headers,
    )
    assert bad.status_code == 400 and "not valid YAML" in errors_of(bad)["config_yaml"]


def test_a_step_sent_twice_is_stored_once_merged_and_a_late_step_keeps_the_latest(api):
    run = create(api)
    url = f"/external-runs/{run['id']}/steps"
    steps = [{"step": s, "metrics": {"critic/score/mean": s / 10}} for s in (1, 2, 3)]
    assert api.post(url, {"steps": steps}).json() == {"stored": 3}
    again = {"steps": [{"step": 2, "metrics": {"critic/score/mean": 0.9, "actor/pg_loss": None}}]}
    assert api.post(url, again).status_code == 200
    late = {"steps": [{"step": 0, "metrics": {"val-core/gsm8k/reward/mean@1": 0.25}}]}
    assert api.post(url, late).status_code == 200
    points = dict(MetricPoint.objects.filter(run_id=run["id"]).values_list("step", "metrics"))
    assert sorted(points) == [0, 1, 2, 3]
    assert points[2] == {"critic/score/mean": 0.9, "actor/pg_loss": None}
    # A second log of the same step (a summary, a validation) adds to it.
    summary = {"steps": [{"step": 2, "metrics": {"train_runtime": 12.5}}]}
    assert api.post(url, summary).status_code == 200
    assert MetricPoint.objects.get(run_id=run["id"], step=2).metrics == {
        "critic/score/mean": 0.9,
        "actor/pg_loss": None,
        "train_runtime": 12.5,
    }
    assert Run.objects.get(pk=run["id"]).latest_step == 3
    series = api.get(f"/runs/{run['id']}/metrics", {"name": "critic/score/mean"}).json()
    assert series["series"]["critic/score/mean"]["value"] == [0.1, 0.9, 0.3]


def test_samples_in_batches_and_a_batch_sent_again_are_stored_once(api):
    run = create(api)
    url = f"/external-runs/{run['id']}/samples"
    first = [sample(1, i) for i in range(3)]
    second = [sample(1, i, prompt="What is 7*6?") for i in range(2)] + [sample(1, 3)]
    assert api.post(url, {"samples": first}).json() == {"stored": 3}
    assert api.post(url, {"samples": second}).json() == {"stored": 3}
    assert api.post(url, {"samples": first}).json() == {"stored": 3}  # a retry
    rows = Sample.objects.filter(run_id=run["id"])
    assert rows.count() == 6
    index = prompt_index_of("What is 2+3?")
    assert sorted(rows.filter(prompt_index=index).values_list("sample_index", flat=True)) == [
        0,
        1,
        2,
        3,
    ]
    group = api.get(f"/runs/{run['id']}/samples/group", {"prompt": index, "step": 1}).json()
    assert [m["sample_index"] for m in group["members"]] == [0, 1, 2, 3]
    assert group["reward_mean"] == 0.5


def test_token_log_probs_and_ids_are_stored_for_the_token_view(api):
    run = create(api)
    url = f"/external-runs/{run['id']}/samples"
    with_tokens = sample(
        2, 0, tokens=["5", "<eos>"], token_logprobs=[-0.1, None], ground_truth=[5],
        reward_parts={"acc": 1.0, "pred": "5"}, data_source="openai/gsm8k",
    )  # fmt: skip
    with_ids = sample(2, 1, token_ids=[17, 2], token_logprobs=[-2.0, -0.5])
    assert api.post(url, {"samples": [with_tokens, with_ids]}).status_code == 200
    stored = {s.sample_index: s for s in Sample.objects.filter(run_id=run["id"])}
    assert stored[0].tokens == ["5", "<eos>"] and stored[0].token_logprobs[0] == pytest.approx(-0.1)
    assert math.isnan(stored[0].token_logprobs[1])
    assert stored[0].ground_truth == "[5]" and stored[0].reward_parts == {"acc": 1.0, "pred": "5"}
    assert stored[0].data_source == "openai/gsm8k" and stored[0].response_length == 2
    assert stored[1].tokens == ["17", "2"]
    group = api.get(
        f"/runs/{run['id']}/samples/group", {"prompt": prompt_index_of("What is 2+3?"), "step": 2}
    ).json()
    assert group["members"][0]["token_view"]["logprob"] == [pytest.approx(-0.1), None]
    mismatch = sample(2, 2, tokens=["a"], token_logprobs=[-1.0, -2.0])
    response = api.post(url, {"samples": [mismatch]})
    assert response.status_code == 400
    assert errors_of(response) == {
        "samples.0.token_logprobs": "2 values for 1 tokens; send one per response token"
    }


def test_log_lines_are_appended_by_position_and_a_gap_is_refused(api):
    run = create(api)
    url = f"/external-runs/{run['id']}/logs"
    assert api.post(url, {"offset": 0, "lines": ["step 1", "step 2"]}).json() == {"stored": 2}
    assert api.post(url, {"offset": 1, "lines": ["step 2", "step 3\n"]}).json() == {"stored": 3}
    gap = api.post(url, {"offset": 5, "lines": ["step 6"]})
    assert gap.status_code == 409
    assert (
        "holds 3 log lines" in errors_of(gap)[None] and "send from line 3" in errors_of(gap)[None]
    )
    log = run_dir(run["id"]) / LOG_FILE
    assert log.read_text() == "step 1\nstep 2\nstep 3\n"
    assert api.get(f"/external-runs/{run['id']}").json()["log_lines"] == 3


def test_a_finished_run_takes_nothing_more_and_finishing_again_changes_nothing(api):
    run = create(api)
    finish = f"/external-runs/{run['id']}/finish"
    missing = api.post(finish, {})
    assert (
        missing.status_code == 400
        and "finishes as succeeded, failed or cancelled" in (errors_of(missing)["status"])
    )
    assert api.post(finish, {"status": "succeeded"}).json()["status"] == "succeeded"
    assert api.post(finish, {"status": "succeeded"}).status_code == 200
    other = api.post(finish, {"status": "failed", "error": "OOM"})
    assert other.status_code == 409 and "already ended as succeeded" in errors_of(other)[None]
    late = api.post(f"/external-runs/{run['id']}/steps", {"steps": [{"step": 9, "metrics": {}}]})
    assert late.status_code == 409 and "has ended (succeeded)" in errors_of(late)[None]
    assert Run.objects.get(pk=run["id"]).finished_at is not None


def test_a_lost_run_whose_client_comes_back_is_running_again(api, settings):
    run = create(api)
    Run.objects.filter(pk=run["id"]).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert runs_mark_lost(timeout_s=45) == [run["id"]]
    assert Run.objects.get(pk=run["id"]).status == RunStatus.LOST
    beat = api.post(f"/external-runs/{run['id']}/heartbeat").json()
    assert beat["status"] == "running" and not beat["cancel_requested"]
    again = Run.objects.get(pk=run["id"])
    assert again.finished_at is None and again.error == ""


def test_sizes_past_the_limits_are_answered_with_the_limit(api, settings):
    run = create(api)
    url = f"/external-runs/{run['id']}/samples"
    too_many = api.post(url, {"samples": [sample(1, i) for i in range(5001)]})
    assert too_many.status_code == 422
    assert "at most 5000 items" in errors_of(too_many)["samples"]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024**2
    big = api.post(url, {"samples": [sample(1, 0, response="x" * 1024**2)]})
    assert big.status_code == 413 and "over 1 MiB" in errors_of(big)[None]
    bad_key = api.post("/external-runs", {"key": "short", "name": "x"})
    assert bad_key.status_code == 422 and "key" in errors_of(bad_key)
    names = {"steps": [{"step": 1, "metrics": {"m" * 201: 1.0}}]}
    long_name = api.post(f"/external-runs/{run['id']}/steps", names)
    assert (
        long_name.status_code == 400
        and "over 200 characters" in errors_of(long_name)["steps.0.metrics"]
    )


def test_a_count_past_the_databases_integers_is_a_422_naming_its_field(api):
    past = 2**31  # PostgreSQL's integer columns end one below
    response = api.post("/external-runs", {"key": "k" * 16, "name": "x", "total_steps": past})
    assert response.status_code == 422 and "total_steps" in errors_of(response)
    run = create(api)
    steps = api.post(
        f"/external-runs/{run['id']}/steps", {"steps": [{"step": past, "metrics": {}}]}
    )
    assert steps.status_code == 422 and "steps.0.step" in errors_of(steps)
    for field in ("sample_index", "prompt_index", "response_length"):
        body = {"samples": [sample(1, 0, **{field: past})]}
        answer = api.post(f"/external-runs/{run['id']}/samples", body)
        assert answer.status_code == 422 and f"samples.0.{field}" in errors_of(answer), field
    assert not Run.objects.filter(total_steps=past).exists()


def test_a_token_writes_only_its_owners_runs(api, bob, owner):
    run = create(api)
    for path, body in [
        ("steps", {"steps": [{"step": 1, "metrics": {"a": 1.0}}]}),
        ("samples", {"samples": [sample(1, 0)]}),
        ("logs", {"offset": 0, "lines": ["x"]}),
        ("heartbeat", {}),
        ("finish", {"status": "failed"}),
    ]:
        assert bob.post(f"/external-runs/{run['id']}/{path}", body).status_code == 404
    assert bob.get(f"/runs/{run['id']}").status_code == 404
    # A studio run is not an external one: its driver is its only writer.
    studio = make_run(owner, RunStatus.RUNNING)
    steps = {"steps": [{"step": 1, "metrics": {"a": 1.0}}]}
    assert api.post(f"/external-runs/{studio.pk}/steps", steps).status_code == 404
    # The same key of another user is another run.
    assert create(bob, key="k" * 16)["id"] != run["id"]


def test_external_runs_take_no_launch_slot_and_have_their_own_cap(api, owner, settings):
    settings.POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER = 1
    settings.POSTTRAIN_MAX_ACTIVE_EXTERNAL_RUNS = 2
    create(api, key="a" * 16)
    create(api, key="b" * 16)
    third = api.post("/external-runs", {"key": "c" * 16, "name": "x", "source": "trl"})
    assert third.status_code == 429
    assert "POSTTRAIN_MAX_ACTIVE_EXTERNAL_RUNS allows 2" in errors_of(third)[None]
    launched = api.post(f"/experiments/{make_experiment(owner).pk}/launch", {})
    assert launched.status_code == 201, launched.json()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("private_redis_layer")
def test_appends_send_the_events_the_drivers_recorder_sends(owner):
    api = ApiClient(token_of(owner))
    run = create(api)
    layer = get_channel_layer()
    loop = asyncio.new_event_loop()
    channel = loop.run_until_complete(layer.new_channel())
    loop.run_until_complete(layer.group_add(f"run.{run['id']}", channel))
    try:
        api.post(f"/external-runs/{run['id']}/samples", {"samples": [sample(4, 0), sample(4, 1)]})
        steps = [{"step": 4, "metrics": {"critic/score/mean": 0.5, "actor/pg_loss": None}}]
        api.post(f"/external-runs/{run['id']}/steps", {"steps": steps})
        received = [
            loop.run_until_complete(asyncio.wait_for(layer.receive(channel), 5)) for _ in range(2)
        ]
    finally:
        loop.run_until_complete(layer.group_discard(f"run.{run['id']}", channel))
        loop.close()
    samples, metrics = received
    assert samples == {
        "type": "run.event", "event": "samples", "run_id": run["id"], "step": 4,
        "split": "train", "count": 2, "reward_mean": 0.5,
    }  # fmt: skip
    assert metrics["event"] == "metrics" and metrics["step"] == 4
    assert metrics["metrics"] == {"critic/score/mean": 0.5, "actor/pg_loss": None}


def test_the_external_row_records_the_client(api):
    run = create(api, client="posttrain watch 0.2", cancel_honoured=True)
    external = ExternalRun.objects.get(run_id=run["id"])
    assert (external.client, external.cancel_honoured, external.source) == (
        "posttrain watch 0.2",
        True,
        "verl",
    )


def test_a_non_finite_loss_is_stored_as_null_and_fires_the_health_check(api):
    run = create(api)
    body = '{"steps": [{"step": 1, "metrics": {"actor/pg_loss": NaN, "actor/grad_norm": 1.0}}]}'
    response = api.client.post(
        f"/api/external-runs/{run['id']}/steps",
        body,
        content_type="application/json",
        headers=api.headers,
    )
    assert response.status_code == 200, response.json()
    assert MetricPoint.objects.get(run_id=run["id"]).metrics["actor/pg_loss"] is None
    alert = HealthAlert.objects.get(run_id=run["id"])
    assert (alert.check_name, alert.message) == ("non_finite_loss", "actor/pg_loss is nan")


def test_appends_count_against_the_tokens_rate_limit(api, limit):
    run = create(api)  # 1
    steps = {"steps": [{"step": 1, "metrics": {"a": 1.0}}]}
    assert api.post(f"/external-runs/{run['id']}/steps", steps).status_code == 200  # 2
    assert api.post(f"/external-runs/{run['id']}/heartbeat").status_code == 200  # 3
    refused = api.post(f"/external-runs/{run['id']}/samples", {"samples": [sample(1, 0)]})
    assert refused.status_code == 429 and refused["Retry-After"] == "20"
    assert "this token may send 3 requests per minute" in errors_of(refused)[None]
