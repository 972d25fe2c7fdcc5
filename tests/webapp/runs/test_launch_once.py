"""One click makes one run: launch keys, concurrent POSTs, and a launch the broker refused.

The transactional tests commit for real, so ``run_create`` really dispatches ``start_run``: to a
private key prefix of the studio's Redis (counted there), or to a closed port (Redis down).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from tests.webapp.fixtures import builder_data, make_experiment, make_run, tiny_config
from tests.webapp.runs.launching import closed_broker, private_broker, queued_starts, race
from webapp.experiments.models import Experiment
from webapp.runs.driver_writes import run_claim_for_start, run_finish
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create

KEY = "k" * 32
LAUNCH_KEY_INPUT = re.compile(
    r'<input type="hidden" name="launch_key" value="([A-Za-z0-9_-]{32})">'
)


def _launch_url(experiment: Experiment) -> str:
    return reverse("experiments:launch", kwargs={"experiment_id": experiment.pk})


@pytest.mark.django_db
def test_every_render_of_a_launch_form_carries_a_fresh_key(client_in, owner):
    experiment = make_experiment(owner)
    url = reverse("experiments:detail", kwargs={"experiment_id": experiment.pk})
    first, second = (LAUNCH_KEY_INPUT.findall(client_in.get(url).content.decode()) for _ in "12")
    assert len(first) == len(second) == 1 and first != second
    page = client_in.get(reverse("experiments:new")).content.decode()
    assert len(LAUNCH_KEY_INPUT.findall(page)) == 1
    assert 'data-busy-label="Launching…"' in client_in.get(url).content.decode()


@pytest.mark.django_db
def test_a_repeated_launch_post_leads_to_the_run_it_made(client_in, owner, other_user):
    experiment = make_experiment(owner)
    first = client_in.post(_launch_url(experiment), {"launch_key": KEY})
    run = Run.objects.get()
    again = client_in.post(_launch_url(experiment), {"launch_key": KEY}, follow=True)
    assert first["Location"] == again.redirect_chain[-1][0] == run.get_absolute_url()
    assert f"Run #{run.pk} was already launched from this page." in again.content.decode()
    assert Run.objects.count() == 1
    # A key is the owner's own: the same text from another user launches that user's run.
    client_in.force_login(other_user)
    client_in.post(_launch_url(make_experiment(other_user)), {"launch_key": KEY})
    assert Run.objects.filter(owner=other_user).count() == 1


@pytest.mark.django_db
def test_posts_without_a_key_each_launch_a_run(client_in, owner):
    experiment = make_experiment(owner)
    client_in.post(_launch_url(experiment))
    client_in.post(_launch_url(experiment))
    assert sorted(Run.objects.values_list("number", flat=True)) == [1, 2]


@pytest.mark.django_db
def test_a_malformed_key_is_refused_and_launches_nothing(client_in, owner):
    experiment = make_experiment(owner)
    response = client_in.post(_launch_url(experiment), {"launch_key": "x" * 65}, follow=True)
    assert (
        "launch_key must be 16 to 64 letters, digits, &#x27;-&#x27; or &#x27;_&#x27; "
        "(got 65 characters); reload the page for a fresh form" in response.content.decode()
    )
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_repeated_resume_post_makes_one_child(client_in, owner):
    parent = run_create(experiment=make_experiment(owner))
    run_claim_for_start(run_id=parent.pk)
    run_finish(run_id=parent.pk, status="failed", error="boom")
    checkpoint = Path(parent.checkpoint_dir) / "global_step_2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"x")
    page = client_in.get(reverse("runs:detail", kwargs={"run_id": parent.pk})).content.decode()
    (key,) = LAUNCH_KEY_INPUT.findall(page)
    url = reverse("runs:resume", kwargs={"run_id": parent.pk})
    first = client_in.post(url, {"launch_key": key})
    again = client_in.post(url, {"launch_key": key})
    child = Run.objects.get(parent=parent)
    assert first["Location"] == again["Location"] == child.get_absolute_url()


@pytest.mark.django_db
def test_a_repeated_builder_post_makes_one_experiment_and_one_run(client_in, owner):
    data = builder_data(tiny_config(), owner, launch_key=KEY)
    first = client_in.post(reverse("experiments:new"), data)
    again = client_in.post(reverse("experiments:new"), data)
    run = Run.objects.get()
    assert first["Location"] == again["Location"] == run.get_absolute_url()
    assert Experiment.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_posts_of_one_form_at_the_same_instant_make_one_run_and_one_start(owner):
    experiment = make_experiment(owner)
    with private_broker() as prefix:
        pages = race(owner, [(_launch_url(experiment), {"launch_key": KEY})] * 2)
        run = Run.objects.get()
        assert queued_starts(prefix) == [run.pk]
    assert sum(f"Run #{run.pk} queued." in page for page in pages) == 1
    assert sum(f"Run #{run.pk} was already launched from this page." in page for page in pages) == 1


@pytest.mark.django_db(transaction=True)
def test_a_launch_says_queued_only_once_the_broker_took_the_start(owner):
    experiment = make_experiment(owner)
    client = Client()
    client.force_login(owner)
    with private_broker() as prefix:
        page = client.post(_launch_url(experiment), follow=True).content.decode()
        queued = Run.objects.get()
        assert queued_starts(prefix) == [queued.pk]
    assert f"Run #{queued.pk} queued." in page
    with closed_broker():
        page = client.post(_launch_url(experiment), follow=True).content.decode()
    failed = Run.objects.get(number=2)
    assert failed.status == RunStatus.FAILED and failed.finished_at is not None
    assert failed.error == (
        "the task broker did not take the start request (OperationalError); check that Redis "
        "(REDIS_URL) answers, then launch the experiment again"
    )
    assert f"Run #{failed.pk} queued." not in page
    assert f"Run #{failed.pk} did not start: {failed.error}" in page


@pytest.mark.django_db(transaction=True)
def test_two_deliveries_of_a_start_at_the_same_instant_claim_the_run_once(owner):
    run = make_run(owner)  # a queued row with no message sent for it
    barrier, claims = threading.Barrier(2), []

    def deliver() -> None:
        try:
            barrier.wait(timeout=10)
            claims.append(run_claim_for_start(run_id=run.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(claim is None for claim in claims) == [False, True]
    assert Run.objects.get(pk=run.pk).status == RunStatus.STARTING
