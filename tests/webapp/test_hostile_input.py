"""Hostile input: query strings get a clear 400, never a server error; what a run writes (its
log, errors, responses) is text on every page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.fixtures import make_experiment
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
