"""Alerts: members' settings and subscriptions, the messages events queue, and their delivery.

The run's lifecycle calls in: ``webapp.runs.driver_writes.transition`` on an end state
(:func:`alerts_on_status`), ``webapp.health.services`` on a fired check
(:func:`alerts_on_health`), ``run_record_step`` on each step (:func:`alerts_on_step`). Each call
runs in the caller's transaction, writes one :class:`AlertDelivery` per matching subscription
(idempotent by its key, so a retried step or status change queues nothing twice) and sends the
delivery task once the transaction commits. Failure policy: those hooks never raise into the
run's own writes; a failure is logged and the run's write goes on without the alert.

Delivery (:func:`delivery_attempt`, run by the ``deliver_alert`` Celery task): at most
``POSTTRAIN_ALERTS_PER_MINUTE`` messages a minute per member (a message over the rate waits, and
that wait is no attempt), ``POSTTRAIN_ALERTS_MAX_ATTEMPTS`` attempts with a doubling wait from
``POSTTRAIN_ALERTS_RETRY_SECONDS``; a webhook refused by the address check (``webhooks``) fails
at once. A pending message whose task was lost (the broker was down when it was queued) is
queued again by the ``resend_overdue_alerts`` sweep once it is :data:`OVERDUE`. The webhook is the member's setting at send time; e-mail goes to the account's address
through Django's mail backend (``EMAIL_BACKEND`` and ``EMAIL_*`` settings).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from webapp.alerts.models import (
    AlertDelivery,
    AlertSettings,
    Channel,
    DeliveryStatus,
    Direction,
    Event,
    Scope,
    Subscription,
)
from webapp.alerts.webhooks import WebhookRefused, post_json, resolve_webhook
from webapp.celery import send_deliver_alert
from webapp.projects.access import (
    VIEW,
    experiment_may,
    run_may,
    run_reader_ids,
    visible_projects,
)
from webapp.runs.models import Run, RunStatus

logger = logging.getLogger(__name__)

FINISH_STATUSES = (RunStatus.SUCCEEDED, RunStatus.CANCELLED)
FAILURE_STATUSES = (RunStatus.FAILED, RunStatus.LOST)


class AlertRefused(ValueError):
    """A setting or subscription the studio will not keep; the message says how to fix it."""


# -- settings and subscriptions ---------------------------------------------------------------
def alert_settings_for(*, owner: Any) -> AlertSettings:
    """Return the member's alert settings (empty ones until saved)."""
    return AlertSettings.objects.filter(owner=owner).first() or AlertSettings(owner=owner)


def alert_settings_update(*, owner: Any, webhook_url: str) -> AlertSettings:
    """Save the member's webhook URL after checking it; AlertRefused says why it is refused."""
    webhook_url = webhook_url.strip()
    if not webhook_url:  # removed: the member has no webhook, and no row is kept
        AlertSettings.objects.filter(owner=owner).delete()
        return AlertSettings(owner=owner)
    try:
        resolve_webhook(webhook_url, allow_private=settings.POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS)
    except WebhookRefused as exc:
        raise AlertRefused(str(exc)) from None
    row, _ = AlertSettings.objects.update_or_create(
        owner=owner, defaults={"webhook_url": webhook_url}
    )
    return row


def subscription_create(
    *,
    owner: Any,
    scope: str,
    channel: str,
    run: Run | None = None,
    experiment: Any = None,
    project: Any = None,
    on_finish: bool = True,
    on_failure: bool = True,
    on_health: bool = True,
    metric: str = "",
    direction: str = str(Direction.ABOVE),
    threshold: float | None = None,
) -> Subscription:
    """Subscribe ``owner`` to a run, an experiment or a project they may read, or all their runs.

    The caller passes objects it read through ``webapp.projects.access``; one ``owner`` may not
    read is refused here too. A subscriber who loses the right stops getting messages.
    """
    if scope == Scope.RUN and (run is None or not run_may(owner, run, VIEW)):
        raise AlertRefused("choose a run you may read")
    if scope == Scope.EXPERIMENT and (
        experiment is None or not experiment_may(owner, experiment, VIEW)
    ):
        raise AlertRefused("choose an experiment you may read")
    if scope == Scope.PROJECT and (
        project is None or not visible_projects(owner).filter(pk=project.pk).exists()
    ):
        raise AlertRefused("choose a project you are a member of")
    metric = metric.strip()
    if bool(metric) != (threshold is not None):
        raise AlertRefused("a metric alert needs both the metric's name and a threshold")
    if threshold is not None and not math.isfinite(threshold):
        raise AlertRefused("the threshold must be a finite number")
    if not (on_finish or on_failure or on_health or metric):
        raise AlertRefused("choose at least one event: finish, failure, health check or metric")
    if channel == Channel.WEBHOOK and not alert_settings_for(owner=owner).webhook_url:
        raise AlertRefused("set your webhook URL first (Alerts page, Settings), or choose e-mail")
    if channel == Channel.EMAIL and not owner.email:
        raise AlertRefused("your account has no e-mail address; ask an administrator to set it")
    return Subscription.objects.create(
        owner=owner,
        scope=scope,
        run=run if scope == Scope.RUN else None,
        experiment=experiment if scope == Scope.EXPERIMENT else None,
        project=project if scope == Scope.PROJECT else None,
        channel=channel,
        on_finish=on_finish,
        on_failure=on_failure,
        on_health=on_health,
        metric=metric,
        direction=direction,
        threshold=threshold,
    )


def subscription_delete(*, subscription: Subscription) -> None:
    """Stop a subscription (its sent messages stay on record)."""
    subscription.delete()


# -- events -> deliveries ---------------------------------------------------------------------
def _subscriptions(run: Run) -> Any:
    """Return the subscriptions an event of ``run`` answers, of members who may still read it."""
    project_id = run.experiment.project_id if run.experiment_id else None
    return Subscription.objects.filter(owner_id__in=run_reader_ids(run)).filter(
        Q(scope=Scope.ALL, owner_id=run.owner_id)
        | Q(scope=Scope.RUN, run_id=run.pk)
        | Q(scope=Scope.EXPERIMENT, experiment_id=run.experiment_id)
        | Q(scope=Scope.PROJECT, project_id=project_id, project_id__isnull=False)
    )


def run_link(run: Run) -> str:
    """Return the run page's address (absolute with ``POSTTRAIN_PUBLIC_URL``)."""
    path = reverse("runs:detail", kwargs={"run_id": run.pk})
    return settings.POSTTRAIN_PUBLIC_URL.rstrip("/") + path


def _run_label(run: Run) -> str:
    name = run.experiment.name if run.experiment_id else "external run"
    return f"{name} · run #{run.pk}"


def _queue(subscription: Subscription, run: Run, event: str, detail: str, line: str) -> None:
    subject = f"[PostTrain] {_run_label(run)}: {line}"[:200]
    delivery, created = AlertDelivery.objects.get_or_create(
        key=f"{subscription.pk}:{run.pk}:{event}:{detail}"[:300],
        defaults={
            "owner_id": subscription.owner_id,
            "subscription": subscription,
            "run": run,
            "event": event,
            "channel": subscription.channel,
            "subject": subject,
            "text": f"{_run_label(run)}: {line}\n{run_link(run)}",
        },
    )
    if created:
        # robust: a broker that is down loses this message (logged), never the run's write.
        transaction.on_commit(lambda: send_deliver_alert(delivery.pk), robust=True)


def _never_raise(hook: Callable[..., None], **kwargs: Any) -> None:
    try:
        with transaction.atomic():
            hook(**kwargs)
    except Exception:
        logger.exception("alerts: %s(%s) failed; the run's write goes on", hook.__name__, kwargs)


def _on_status(*, run_id: int, status: str) -> None:
    run = Run.objects.select_related("experiment").filter(pk=run_id).first()
    if run is None:
        return
    wanted = "on_finish" if status in FINISH_STATUSES else "on_failure"
    line = f"{status}"
    if status in FAILURE_STATUSES and run.error:
        line += f": {run.error.strip().splitlines()[-1][:300]}"
    for subscription in _subscriptions(run).filter(**{wanted: True}):
        event = Event.FINISHED if status in FINISH_STATUSES else Event.FAILED
        _queue(subscription, run, str(event), status, line)


def alerts_on_status(*, run_id: int, status: str) -> None:
    """Queue the messages of a run that reached an end state (never raises)."""
    if status in FINISH_STATUSES or status in FAILURE_STATUSES:
        _never_raise(_on_status, run_id=run_id, status=status)


def _on_health(*, run_id: int, check: str, label: str, step: int, message: str) -> None:
    run = Run.objects.select_related("experiment").get(pk=run_id)
    for subscription in _subscriptions(run).filter(on_health=True):
        _queue(subscription, run, str(Event.HEALTH), check, f"{label} at step {step}: {message}")


def alerts_on_health(*, run_id: int, check: str, label: str, step: int, message: str) -> None:
    """Queue the messages of a health check that fired (never raises)."""
    _never_raise(_on_health, run_id=run_id, check=check, label=label, step=step, message=message)


def crossed(value: Any, direction: str, threshold: float) -> bool:
    """Return whether ``value`` is a finite number past ``threshold`` in ``direction``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value > threshold if direction == Direction.ABOVE else value < threshold


def _on_step(*, run_id: int, step: int, metrics: Mapping[str, Any]) -> None:
    run = Run.objects.select_related("experiment").get(pk=run_id)
    for subscription in _subscriptions(run).filter(metric__in=list(metrics)):
        value = metrics[subscription.metric]
        assert subscription.threshold is not None  # a metric subscription has one
        if crossed(value, subscription.direction, subscription.threshold):
            line = (
                f"{subscription.metric} = {value:.6g} {subscription.get_direction_display()} "
                f"{subscription.threshold:g} at step {step}"
            )
            _queue(subscription, run, str(Event.THRESHOLD), subscription.metric, line)


def alerts_on_step(*, run_id: int, step: int, metrics: Mapping[str, Any]) -> None:
    """Queue a message for each watched metric that crossed its threshold for the first time
    in this run (never raises)."""
    _never_raise(_on_step, run_id=run_id, step=step, metrics=metrics)


# -- delivery ---------------------------------------------------------------------------------
class Attempt(NamedTuple):
    """What became of one delivery attempt: ``sent``, ``failed``, ``done`` (nothing to do) or
    ``retry`` after ``wait_s`` seconds."""

    outcome: str
    wait_s: float = 0.0


def _rate_wait(owner_id: int, now: Any) -> float:
    """Return the seconds until the member may be sent another message (0: now)."""
    window = now - timedelta(minutes=1)
    sent = AlertDelivery.objects.filter(
        owner_id=owner_id, status=DeliveryStatus.SENT, sent_at__gte=window
    ).order_by("sent_at")
    limit = settings.POSTTRAIN_ALERTS_PER_MINUTE
    times = list(sent.values_list("sent_at", flat=True)[: limit + 1])
    if len(times) < limit:
        return 0.0
    return max(1.0, (times[-limit] - window).total_seconds())


def _send(delivery: AlertDelivery) -> None:
    """Send one message; raise WebhookRefused, AlertRefused or the transport's error."""
    if delivery.channel == Channel.EMAIL:
        address = delivery.owner.email
        if not address:
            raise AlertRefused("the account has no e-mail address")
        send_mail(delivery.subject, delivery.text, None, [address])
        return
    url = alert_settings_for(owner=delivery.owner).webhook_url
    if not url:
        raise AlertRefused("no webhook URL is set (Alerts page, Settings)")
    status = post_json(
        url,
        {"text": delivery.text},  # Slack's and Mattermost's incoming-webhook body
        allow_private=settings.POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS,
    )
    if not 200 <= status < 300:
        raise OSError(f"the webhook answered HTTP {status}")


def delivery_attempt(*, delivery_id: int) -> Attempt:
    """Try to send one pending delivery; record the attempt and say what should happen next."""
    with transaction.atomic():
        delivery = (
            AlertDelivery.objects.select_for_update()
            .select_related("owner")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
            .first()
        )
        if delivery is None:
            return Attempt("done")
        now = timezone.now()
        wait = _rate_wait(delivery.owner_id, now)
        if wait:
            delivery.last_error = (
                f"rate limited: {settings.POSTTRAIN_ALERTS_PER_MINUTE} messages in the last "
                f"minute (POSTTRAIN_ALERTS_PER_MINUTE); next try in {wait:.0f} s"
            )
            delivery.next_attempt_at = now + timedelta(seconds=wait)
            delivery.save(update_fields=["last_error", "next_attempt_at"])
            return Attempt("retry", wait)
        delivery.attempts += 1
        try:
            _send(delivery)
        except (WebhookRefused, AlertRefused) as exc:
            delivery.status, delivery.last_error = DeliveryStatus.FAILED, f"refused: {exc}"
            outcome = Attempt("failed")
        except Exception as exc:  # the transport's errors: retried
            delivery.last_error = f"{type(exc).__name__}: {exc}"
            if delivery.attempts >= settings.POSTTRAIN_ALERTS_MAX_ATTEMPTS:
                delivery.status = DeliveryStatus.FAILED
                outcome = Attempt("failed")
            else:
                base = settings.POSTTRAIN_ALERTS_RETRY_SECONDS
                outcome = Attempt("retry", base * 2 ** (delivery.attempts - 1))
        else:
            delivery.status, delivery.sent_at, delivery.last_error = (
                DeliveryStatus.SENT,
                timezone.now(),
                "",
            )
            outcome = Attempt("sent")
        delivery.last_error = delivery.last_error[:500]
        delivery.next_attempt_at = timezone.now() + timedelta(seconds=outcome.wait_s)
        delivery.save(
            update_fields=["status", "attempts", "last_error", "sent_at", "next_attempt_at"]
        )
        return outcome


# A pending message this long past its due time lost its task (a broker down when it was
# queued, a worker killed mid-retry); the sweep queues it again.
OVERDUE = timedelta(minutes=5)


def deliveries_overdue(*, now: Any = None) -> list[int]:
    """Return the ids of pending messages whose task was lost; mark them due again later, so
    one sweep's new task has the time to run before the next sweep looks."""
    now = now or timezone.now()
    with transaction.atomic():
        ids = list(
            AlertDelivery.objects.select_for_update(skip_locked=True)
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lt=now - OVERDUE)
            .values_list("pk", flat=True)[:500]
        )
        AlertDelivery.objects.filter(pk__in=ids).update(next_attempt_at=now)
    return ids
