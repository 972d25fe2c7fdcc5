"""Hostile input: query strings get a clear 400, never a server error; what a run writes (its
log, errors, responses) is text on every page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.fixtures import make_experiment, make_run
from webapp.runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def test_a_nul_character_in_any_query_or_form_field_is_refused_with_the_reason(client_in, owner):
    experiment = make_experiment(owner)
    run = Run.objects.create(
        experiment=experiment, owner=owner, number=1, status=RunStatus.SUCCEEDED, config={}
    )
    pages = [
        "/",
        "/datasets/",
        f"/runs/{run.pk}/samples/",
        f"/experiments/{experiment.pk}/",
    ]
    for page in pages:
        for key in ("q", "tag", "status", "name"):
            response = client_in.get(page, {key: "a\x00b"})
            assert response.status_code == 400, (page, key, response.status_code)
            assert f"the query field '{key}' holds a NUL character" in response.content.decode()
        assert client_in.get(page).status_code == 200, page
    response = client_in.post("/experiments/new/", {"name": "x\x00"})
    assert response.status_code == 400
    assert "the form field 'name' holds a NUL character" in response.content.decode()


SCRIPT = "<script>alert(1)</script>"


def test_a_log_line_or_a_response_with_a_script_is_text_on_every_page(client_in, owner):
    """The run's log, its error, its checkpoint jobs' errors and its responses (broken bytes
    and all) are the driver's and the model's words: every page escapes them."""
    from pathlib import Path

    from engine.trainer.reporting import SampleRecord
    from webapp.runs.driver_writes import samples_write
    from webapp.runs.logs import run_log_path
    from webapp.runs.models import CheckpointJob
    from webapp.runs.services import run_create

    run = run_create(experiment=make_experiment(owner))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error=f"boom {SCRIPT}")
    log = run_log_path(run)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"step 1 {SCRIPT}\n")
    step_folder = Path(run.checkpoint_dir) / "global_step_1"
    step_folder.mkdir(parents=True)
    (step_folder / "trainer_state.pt").write_bytes(b"x")
    CheckpointJob.objects.create(
        run=run, step=1, kind="evaluate", status="failed", dataset=SCRIPT, error=SCRIPT
    )
    samples = []
    for step in (1, 2):
        for index, (text, tokens) in enumerate(
            [(f"{SCRIPT}\ufffd", [*SCRIPT, "Þ"]), (SCRIPT, list(SCRIPT))]
        ):
            samples.append(
                SampleRecord(
                    step=step,
                    split="train",
                    prompt_index=index,
                    sample_index=0,
                    group_id="g",
                    data_source="x",
                    prompt_text=SCRIPT,
                    response_text=text,
                    ground_truth=SCRIPT,
                    reward=float(step),
                    reward_error=SCRIPT,
                    tokens=tokens,
                    token_logprobs=[-0.5] * len(tokens),
                )  # fmt: skip
            )
    samples_write(run_id=run.pk, samples=samples)
    base = f"/runs/{run.pk}/samples"
    pages = [
        run.get_absolute_url(),
        reverse("runs:checkpoints", kwargs={"run_id": run.pk}),
        f"{base}/?step=1",
        f"{base}/run/",
        f"{base}/prompts/",
        f"{base}/group/?step=1&prompt=0",
        f"{base}/prompt/?prompt=0",
    ]
    for page in pages:
        response = client_in.get(page)
        assert response.status_code == 200, page
        text = response.content.decode()
        assert SCRIPT not in text, page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text, page
    found = client_in.get(reverse("runs:log-search", kwargs={"run_id": run.pk}), {"q": "script"})
    assert found["Content-Type"] == "application/json"
    download = client_in.get(reverse("runs:log", kwargs={"run_id": run.pk}))
    assert download["Content-Type"] == "text/plain; charset=utf-8"
    assert download["X-Content-Type-Options"] == "nosniff"
    assert download["Content-Disposition"].startswith("attachment;")


XSS = "<script>alert(1)</script>"
XSS_IMG = '"><img src=x onerror=alert(2)>'


def test_hostile_text_an_external_run_sends_is_escaped_on_every_page(client_in, owner):
    """What a trainer outside the studio sends (samples, metrics, config keys and values, where
    it lives, its log) reaches each page as text, never as markup."""
    from tests.webapp.api.helpers import ApiClient, token_of
    from webapp.external.services import prompt_index_of

    api = ApiClient(token_of(owner))
    created = api.post(
        "/external-runs",
        {
            "key": "h" * 16,
            "name": f"exp {XSS}",
            "source": "verl",
            "location": f"host {XSS_IMG}",
            "client": XSS,
            "tags": ["ok"],
            "config": {"trainer": {XSS: XSS_IMG, "project_name": XSS}, XSS_IMG: {"a": 1}},
        },
    ).json()
    run_id = created["id"]
    prompt = f"prompt {XSS}"
    sample = {
        "step": 1, "prompt": prompt, "response": f"response {XSS_IMG}", "reward": 1.0,
        "sample_index": 0, "reward_parts": {XSS: 1.0, "pred": XSS_IMG}, "ground_truth": XSS,
        "data_source": XSS[:100], "tokens": [XSS, XSS_IMG], "token_logprobs": [-0.5, -1.0],
    }  # fmt: skip
    assert api.post(f"/external-runs/{run_id}/samples", {"samples": [sample]}).status_code == 200
    steps = {"steps": [{"step": 1, "metrics": {f"actor/{XSS}": 1.0, "critic/score/mean": 0.5}}]}
    assert api.post(f"/external-runs/{run_id}/steps", steps).status_code == 200
    logs = api.post(f"/external-runs/{run_id}/logs", {"offset": 0, "lines": [XSS]})
    assert logs.status_code == 200
    other = make_run(owner, RunStatus.SUCCEEDED)
    index = prompt_index_of(prompt)
    pages = [
        f"/runs/{run_id}/",
        "/runs/",
        f"/runs/?metric=last:actor/{XSS}",
        f"/runs/compare/?run={run_id}&run={other.pk}",
        f"/runs/{run_id}/diff/{other.pk}/",
        f"/runs/{run_id}/samples/?step=1",
        f"/runs/{run_id}/samples/group/?step=1&prompt={index}",
        f"/runs/{run_id}/samples/prompt/?prompt={index}",
        f"/experiments/{created['experiment_id']}/",
        "/",
    ]
    for page in pages:
        response = client_in.get(page)
        assert response.status_code == 200, page
        body = response.content.decode()
        for raw in (XSS, XSS_IMG, "<img src=x"):
            assert raw not in body, (page, raw)
    detail = client_in.get(f"/runs/{run_id}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail  # shown, as text
    assert "host &quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in detail


def test_a_reward_service_address_of_the_members_choosing_is_refused_by_the_api(owner, monkeypatch):
    """Only the services an administrator lists in POSTTRAIN_REWARD_ENDPOINTS take a run's
    responses; an address typed into a config (a cloud metadata service, the database, a
    bare address) is a field error under its key, over the API as in the builder."""
    from engine.config import config_to_dict
    from engine.rewards.endpoints import ENDPOINTS_ENV
    from tests.webapp.api.helpers import ApiClient, errors_of, token_of
    from tests.webapp.fixtures import tiny_config
    from webapp.experiments.models import Experiment

    monkeypatch.setenv(ENDPOINTS_ENV, "judge=http://10.0.0.5:8000/score")
    api = ApiClient(token_of(owner))
    hostile = {
        "reward_model.reward_kwargs.endpoint": "http://169.254.169.254/latest/meta-data",
        "reward_model.sandbox_fusion.url": "http://127.0.0.1:5432/run_code",
    }
    for key, address in hostile.items():
        config = config_to_dict(tiny_config())
        config["reward_model"]["reward_manager"] = "remote"
        config["reward_model"]["reward_kwargs"] = {"endpoint": "judge"}
        section, name = key.split(".")[1], key.split(".")[2]
        config["reward_model"][section][name] = address
        response = api.post("/experiments", {"name": "x", "config": config})
        assert response.status_code == 400, response.content
        message = errors_of(response)[key]
        assert "is not a reward service the administrator allows" in message
        assert "name one of judge" in message and "10.0.0.5" not in message
    assert not Experiment.objects.exists()

    config["reward_model"]["sandbox_fusion"]["url"] = None
    config["reward_model"]["reward_kwargs"]["endpoint"] = "judge"
    response = api.post("/experiments", {"name": "allowed", "config": config})
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("number", ["²", "1²", "99999999999999999999", "-1", "1e3", "٣"])
def test_an_id_or_count_that_is_not_a_plain_whole_number_is_never_a_server_error(
    client_in, owner, number
):
    # "²" passes str.isdigit() but not int(); a number past bigint is not a row's id.
    experiment = make_experiment(owner)
    run = Run.objects.create(
        experiment=experiment, owner=owner, number=1, status=RunStatus.SUCCEEDED, config={}
    )
    gets = [
        (f"/runs/{run.pk}/diff/", {"other": number}),
        (f"/runs/{run.pk}/metrics/series/", {"from": number}),
        ("/runs/compare/", {"run": number}),
        ("/runs/groups/series/", {"run": number}),
    ]
    for path, query in gets:
        response = client_in.get(path, query)
        assert response.status_code < 500, (path, query, response.status_code)
