"""Alerts: a member's subscriptions to the events of runs they may read (their own, their
projects'), and every message sent for them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AlertSettings(models.Model):
    """A member's own alert destinations (the e-mail address is the account's)."""

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_settings"
    )
    webhook_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="A Slack or Mattermost incoming-webhook URL (public http(s) addresses only).",
    )


class Scope(models.TextChoices):
    RUN = "run", "one run"
    EXPERIMENT = "experiment", "an experiment's runs"
    PROJECT = "project", "a project's runs"
    ALL = "all", "all my runs"


class Channel(models.TextChoices):
    WEBHOOK = "webhook", "webhook"
    EMAIL = "email", "e-mail"


class Direction(models.TextChoices):
    ABOVE = "above", "rises above"
    BELOW = "below", "falls below"


class Event(models.TextChoices):
    FINISHED = "finished", "finished"
    FAILED = "failed", "failed"
    HEALTH = "health", "health check fired"
    THRESHOLD = "threshold", "metric crossed a threshold"


class Subscription(models.Model):
    """What a member wants to hear about (a run, an experiment's runs or all theirs) and how."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_subscriptions"
    )
    scope = models.CharField(max_length=16, choices=Scope.choices)
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.CASCADE)
    experiment = models.ForeignKey(
        "experiments.Experiment", null=True, blank=True, on_delete=models.CASCADE
    )
    project = models.ForeignKey("projects.Project", null=True, blank=True, on_delete=models.CASCADE)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    on_finish = models.BooleanField(default=True, help_text="When a run succeeds or is cancelled.")
    on_failure = models.BooleanField(default=True, help_text="When a run fails or is lost.")
    on_health = models.BooleanField(default=True, help_text="When a health check fires.")
    metric = models.CharField(
        max_length=200, blank=True, help_text="A metric to watch, e.g. critic/score/mean."
    )
    direction = models.CharField(max_length=8, choices=Direction.choices, default=Direction.ABOVE)
    threshold = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["owner", "scope"], name="alertsub_owner_scope")]

    def __str__(self) -> str:
        return f"{self.owner_id}: {self.describe()}"

    def describe(self) -> str:
        """Return what the subscription covers, in words."""
        if self.scope == Scope.RUN:
            return f"run {self.run_id}"
        if self.scope == Scope.EXPERIMENT:
            return f"experiment {self.experiment_id}"
        if self.scope == Scope.PROJECT:
            return f"project {self.project_id}"
        return "all my runs"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class AlertDelivery(models.Model):
    """One message for one event of one run: its state, attempts and last error."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_deliveries"
    )
    subscription = models.ForeignKey(
        Subscription, null=True, on_delete=models.SET_NULL, related_name="deliveries"
    )
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="alert_deliveries")
    event = models.CharField(max_length=16, choices=Event.choices)
    # One message per (subscription, run, event and what it is about): a retried write of the
    # same step or status change sends nothing twice.
    key = models.CharField(max_length=300, unique=True)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    subject = models.CharField(max_length=200)
    text = models.TextField()
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(
        default=timezone.now, help_text="When the pending message is due to be tried."
    )

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [
            models.Index(fields=["owner", "status", "sent_at"], name="alertdel_owner_sent"),
            models.Index(fields=["status", "next_attempt_at"], name="alertdel_due"),
        ]

    def __str__(self) -> str:
        return f"{self.event} of run {self.run_id} by {self.channel}: {self.status}"
