"""Reads of a member's own alert subscriptions and messages."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from webapp.alerts.models import AlertDelivery, Subscription


def delivery_list_for_user(*, user: Any) -> QuerySet:
    """Return the member's messages, newest first."""
    return AlertDelivery.objects.filter(owner=user).select_related("run")


def subscription_list_for_user(*, user: Any) -> QuerySet:
    """Return the member's subscriptions, newest first."""
    return Subscription.objects.filter(owner=user).select_related("run", "experiment", "project")
