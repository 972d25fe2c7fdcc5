"""Alerts end to end: subscriptions of one's own runs, the events that queue messages, and
their delivery to a real HTTP receiver on loopback (allowed by the test's setting) or through
Django's locmem mail backend, with retries, the rate limit and the send-time address check."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.urls import reverse

from tests.webapp.fixtures import make_experiment
from webapp.alerts.models import AlertDelivery, AlertSettings, Subscription
from webapp.alerts.services import (
    AlertRefused,
    alert_settings_update,
    deliveries_overdue,
    delivery_attempt,
    subscription_create,
)
from webapp.runs.driver_writes import (
    run_claim_for_start,
    run_finish,
    run_mark_running,
    run_record_step,
)
from webapp.runs.services import run_create
from workers.tasks import deliver_alert

pytestmark = pytest.mark.django_db


class Receiver:
    """A webhook receiver on 127.0.0.1 that answers with ``statuses`` in turn (then 200)."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.bodies: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                receiver.bodies.append(
                    {
                        "path": self.path,
                        "type": self.headers["Content-Type"],
                        "json": json.loads(self.rfile.read(length)),
                    }
                )
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/team"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:
    settings.POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS = True  # the receiver is on loopback
    receiver = Receiver()
    yield receiver
    receiver.close()


def running_run(owner, experiment=None):
    run = run_create(experiment=experiment or make_experiment(owner))
    run_claim_for_start(run_id=run.pk)
    run_mark_running(run_id=run.pk)
    return run


def webhook_subscription(owner, url, **fields):
    alert_settings_update(owner=owner, webhook_url=url)
    return subscription_create(owner=owner, scope="all", channel="webhook", **fields)


def test_a_finished_run_posts_slack_json_to_the_members_webhook(owner, receiver):
    webhook_subscription(owner, receiver.url)
    run = running_run(owner)
    assert run_finish(run_id=run.pk, status="succeeded")
    (delivery,) = AlertDelivery.objects.all()
    assert delivery.event == "finished" and delivery.status == "pending"
    assert deliver_alert.apply(args=(delivery.pk,)).get() == "sent"
    (body,) = receiver.bodies
    assert body["path"] == "/hooks/team" and body["type"] == "application/json"
    text = body["json"]["text"]  # Slack's and Mattermost's incoming-webhook body
    assert f"run #{run.pk}: succeeded" in text and f"/runs/{run.pk}/" in text
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("sent", 1, "")
    assert delivery.sent_at is not None
    # A second delivery of the task's message sends nothing twice.
    assert deliver_alert.apply(args=(delivery.pk,)).get() == "done"
    assert len(receiver.bodies) == 1


def test_the_message_is_queued_on_commit(owner, receiver, django_capture_on_commit_callbacks):
    webhook_subscription(owner, receiver.url)
    run = running_run(owner)
    with django_capture_on_commit_callbacks() as callbacks:
        run_finish(run_id=run.pk, status="failed", error="Traceback...\nValueError: bad lr")
    delivery = AlertDelivery.objects.get()
    assert delivery.event == "failed" and delivery.text.startswith(
        f"{run.experiment.name} · run #{run.pk}: failed: ValueError: bad lr"
    )
    assert len(callbacks) == 2  # the run page's status, and the alert's delivery task


def test_a_failing_webhook_is_retried_then_recorded_as_failed(owner, receiver, settings):
    settings.POSTTRAIN_ALERTS_MAX_ATTEMPTS = 3
    webhook_subscription(owner, receiver.url)
    run = running_run(owner)
    run_finish(run_id=run.pk, status="succeeded")
    delivery = AlertDelivery.objects.get()
    receiver.statuses = [500, 503]  # two failures, then 200: sent on the third attempt
    deliver_alert.apply(args=(delivery.pk,))
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("sent", 3)
    assert len(receiver.bodies) == 3

    other = running_run(owner)
    run_finish(run_id=other.pk, status="succeeded")
    delivery = AlertDelivery.objects.get(run=other)
    receiver.statuses = [500] * 5
    deliver_alert.apply(args=(delivery.pk,))
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("failed", 3)
    assert delivery.last_error == "OSError: the webhook answered HTTP 500"


def test_a_retry_waits_longer_each_time(owner, receiver, settings):
    settings.POSTTRAIN_ALERTS_RETRY_SECONDS = 30.0
    webhook_subscription(owner, receiver.url)
    run = running_run(owner)
    run_finish(run_id=run.pk, status="succeeded")
    delivery = AlertDelivery.objects.get()
    receiver.statuses = [500, 500]
    assert delivery_attempt(delivery_id=delivery.pk) == ("retry", 30.0)
    assert delivery_attempt(delivery_id=delivery.pk) == ("retry", 60.0)
    assert delivery_attempt(delivery_id=delivery.pk) == ("sent", 0.0)


def test_a_member_over_the_rate_waits_without_losing_an_attempt(owner, receiver, settings):
    settings.POSTTRAIN_ALERTS_PER_MINUTE = 2
    webhook_subscription(owner, receiver.url)
    runs = [running_run(owner) for _ in range(3)]
    for run in runs:
        run_finish(run_id=run.pk, status="succeeded")
    deliveries = [AlertDelivery.objects.get(run=run) for run in runs]
    assert delivery_attempt(delivery_id=deliveries[0].pk).outcome == "sent"
    assert delivery_attempt(delivery_id=deliveries[1].pk).outcome == "sent"
    outcome, wait = delivery_attempt(delivery_id=deliveries[2].pk)
    assert outcome == "retry" and 55 < wait <= 60
    third = AlertDelivery.objects.get(pk=deliveries[2].pk)
    assert (third.status, third.attempts) == ("pending", 0)
    assert third.last_error.startswith("rate limited: 2 messages in the last minute")
    assert len(receiver.bodies) == 2
    # A minute later the member may be sent another.
    AlertDelivery.objects.filter(status="sent").update(sent_at=third.created_at.replace(year=2000))
    assert delivery_attempt(delivery_id=third.pk).outcome == "sent"


def test_a_name_that_rebinds_to_loopback_after_the_check_is_refused_at_send(
    owner, settings, monkeypatch
):
    receiver = Receiver()
    port = receiver.server.server_address[1]
    answers = iter(["93.184.216.34", "127.0.0.1"])  # public when saved, loopback when sent

    def rebinding(host, port_, *args, **kwargs):
        return [(2, 1, 6, "", (next(answers), port_))]

    monkeypatch.setattr("webapp.alerts.webhooks.socket.getaddrinfo", rebinding)
    try:
        webhook_subscription(owner, f"http://hooks.example.org:{port}/x")
        run = running_run(owner)
        run_finish(run_id=run.pk, status="succeeded")
        delivery = AlertDelivery.objects.get()
        assert delivery_attempt(delivery_id=delivery.pk).outcome == "failed"
        delivery.refresh_from_db()
        assert delivery.status == "failed" and delivery.attempts == 1
        assert "127.0.0.1 is a loopback address" in delivery.last_error
        assert receiver.bodies == []  # nothing reached the internal address
    finally:
        receiver.close()


def test_email_alerts_go_through_djangos_mail_backend(owner, mailoutbox):
    owner.email = "alice@example.org"
    owner.save()
    subscription_create(owner=owner, scope="all", channel="email")
    run = running_run(owner)
    run_finish(run_id=run.pk, status="cancelled")
    delivery = AlertDelivery.objects.get()
    assert deliver_alert.apply(args=(delivery.pk,)).get() == "sent"
    (mail,) = mailoutbox
    assert mail.to == ["alice@example.org"]
    assert mail.subject == f"[PostTrain] {run.experiment.name} · run #{run.pk}: cancelled"
    assert f"/runs/{run.pk}/" in mail.body


def test_health_checks_and_thresholds_queue_one_message_each(owner, receiver, settings):
    experiment = make_experiment(owner)
    alert_settings_update(owner=owner, webhook_url=receiver.url)
    subscription_create(
        owner=owner,
        scope="experiment",
        experiment=experiment,
        channel="webhook",
        on_finish=False,
        on_failure=False,
        on_health=False,
        metric="critic/score/mean",
        direction="above",
        threshold=0.5,
    )
    subscription_create(owner=owner, scope="all", channel="webhook", on_finish=False)
    run = running_run(owner, experiment)
    other_experiment_run = running_run(owner)
    for step, score in enumerate([0.2, 0.7, 0.9], start=1):
        for r in (run, other_experiment_run):
            run_record_step(
                run_id=r.pk, step=step, metrics={"critic/score/mean": score, "actor/grad_norm": 1}
            )
    # A NaN loss fires the non-finite health check.
    run_record_step(run_id=run.pk, step=4, metrics={"actor/pg_loss": float("nan")})
    events = sorted(AlertDelivery.objects.filter(run=run).values_list("event", "text"))
    assert [e for e, _ in events] == ["health", "threshold"]
    assert "NaN/inf loss at step 4: actor/pg_loss is nan" in events[0][1]
    assert "critic/score/mean = 0.7 rises above 0.5 at step 2" in events[1][1]
    # The experiment's subscription does not watch another experiment's run.
    assert not AlertDelivery.objects.filter(run=other_experiment_run, event="threshold").exists()


def test_refused_subscriptions_say_why(owner, other_user):
    theirs = running_run(other_user)
    with pytest.raises(AlertRefused, match="choose a run you may read"):
        subscription_create(owner=owner, scope="run", run=theirs, channel="email")
    with pytest.raises(AlertRefused, match="set your webhook URL first"):
        subscription_create(owner=owner, scope="all", channel="webhook")
    with pytest.raises(AlertRefused, match="no e-mail address"):
        subscription_create(owner=owner, scope="all", channel="email")
    owner.email = "alice@example.org"
    with pytest.raises(AlertRefused, match="needs both the metric's name and a threshold"):
        subscription_create(owner=owner, scope="all", channel="email", metric="x")
    with pytest.raises(AlertRefused, match="at least one event"):
        subscription_create(
            owner=owner,
            scope="all",
            channel="email",
            on_finish=False,
            on_failure=False,
            on_health=False,
        )
    assert not Subscription.objects.exists()


def test_the_page_saves_a_public_webhook_and_refuses_a_private_one(client_in, owner):
    url = reverse("alerts:settings")
    response = client_in.post(url, {"webhook_url": "http://169.254.169.254/latest"})
    assert response.status_code == 400
    assert "169.254.169.254 is a link-local address" in response.content.decode()
    assert not AlertSettings.objects.exists()
    response = client_in.post(url, {"webhook_url": "https://93.184.216.34/hooks/abc"})
    assert response.status_code == 302
    assert AlertSettings.objects.get(owner=owner).webhook_url == "https://93.184.216.34/hooks/abc"


def test_the_page_subscribes_to_ones_own_run_and_404s_anothers(client_in, owner, other_user):
    owner.email = "alice@example.org"
    owner.save()
    mine = running_run(owner)
    theirs = running_run(other_user)
    # The run page links to the form, filled in for the run.
    run_page = client_in.get(reverse("runs:detail", kwargs={"run_id": mine.pk})).content.decode()
    assert f"/alerts/?scope=run&amp;run_id={mine.pk}" in run_page
    form_page = client_in.get(f"/alerts/?scope=run&run_id={mine.pk}").content.decode()
    assert f'name="run_id" value="{mine.pk}"' in form_page
    url = reverse("alerts:subscribe")
    form = {"scope": "run", "channel": "email", "on_finish": "on", "direction": "above"}
    assert client_in.post(url, {**form, "run_id": theirs.pk}).status_code == 404
    assert (
        client_in.post(
            url, {**form, "scope": "experiment", "experiment_id": theirs.experiment_id}
        ).status_code
        == 404
    )
    assert client_in.post(url, {**form, "run_id": mine.pk}).status_code == 302
    subscription = Subscription.objects.get()
    assert (subscription.run_id, subscription.owner_id) == (mine.pk, owner.pk)
    run_finish(run_id=mine.pk, status="succeeded")
    page = client_in.get(reverse("alerts:index")).content.decode()
    assert f"run {mine.pk}" in page and 'data-status="pending"' in page
    client_in.force_login(other_user)
    unsubscribe = reverse("alerts:unsubscribe", kwargs={"subscription_id": subscription.pk})
    assert client_in.post(unsubscribe).status_code == 404
    assert Subscription.objects.exists()


def test_a_message_whose_task_was_lost_is_queued_again_once_overdue(owner, receiver):
    webhook_subscription(owner, receiver.url)
    run = running_run(owner)
    run_finish(run_id=run.pk, status="succeeded")  # its task never ran: no broker in this test
    delivery = AlertDelivery.objects.get()
    now = delivery.next_attempt_at
    assert deliveries_overdue(now=now + timedelta(minutes=4)) == []  # its task may still come
    assert deliveries_overdue(now=now + timedelta(minutes=6)) == [delivery.pk]
    # Marked due again: the next sweep leaves it to the task it just queued.
    assert deliveries_overdue(now=now + timedelta(minutes=7)) == []
    assert deliver_alert.apply(args=(delivery.pk,)).get() == "sent"
    assert deliveries_overdue(now=now + timedelta(hours=1)) == []  # sent: never again
