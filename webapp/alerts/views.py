"""The alerts page: the member's webhook, subscriptions and the record of messages sent."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.alerts.forms import AlertSettingsForm, SubscriptionForm
from webapp.alerts.models import Scope
from webapp.alerts.selectors import delivery_list_for_user, subscription_list_for_user
from webapp.alerts.services import (
    AlertRefused,
    alert_settings_for,
    alert_settings_update,
    subscription_create,
    subscription_delete,
)
from webapp.projects.access import VIEW, experiment_for, project_for, run_for

DELIVERIES_SHOWN = 100


def _page(
    request: HttpRequest,
    settings_form: AlertSettingsForm | None = None,
    subscription_form: SubscriptionForm | None = None,
    status: int = 200,
) -> HttpResponse:
    user = request.user
    context = {
        "settings_form": settings_form
        or AlertSettingsForm(initial={"webhook_url": alert_settings_for(owner=user).webhook_url}),
        "subscription_form": subscription_form or SubscriptionForm(initial=request.GET.dict()),
        "subscriptions": subscription_list_for_user(user=user),
        "deliveries": delivery_list_for_user(user=user)[:DELIVERIES_SHOWN],
    }
    return render(request, "alerts/index.html", context, status=status)


@login_required
def alerts_index(request: HttpRequest) -> HttpResponse:
    return _page(request)


@login_required
@require_POST
def alerts_settings(request: HttpRequest) -> HttpResponse:
    form = AlertSettingsForm(request.POST)
    if form.is_valid():
        try:
            alert_settings_update(owner=request.user, webhook_url=form.cleaned_data["webhook_url"])
        except AlertRefused as exc:
            form.add_error("webhook_url", str(exc))
        else:
            messages.success(request, "Alert settings saved.")
            return redirect("alerts:index")
    return _page(request, settings_form=form, status=400)


@login_required
@require_POST
def alerts_subscribe(request: HttpRequest) -> HttpResponse:
    form = SubscriptionForm(request.POST)
    if not form.is_valid():
        return _page(request, subscription_form=form, status=400)
    data = form.cleaned_data
    run = experiment = project = None
    # A run, experiment or project the member may not read is a 404, as everywhere.
    if data["scope"] == Scope.RUN:
        run = run_for(request.user, data["run_id"], VIEW)
    elif data["scope"] == Scope.EXPERIMENT:
        experiment = experiment_for(request.user, data["experiment_id"], VIEW)
    elif data["scope"] == Scope.PROJECT:
        project = project_for(request.user, data["project_id"], VIEW)
    try:
        subscription = subscription_create(
            owner=request.user,
            scope=data["scope"],
            channel=data["channel"],
            run=run,
            experiment=experiment,
            project=project,
            on_finish=data["on_finish"],
            on_failure=data["on_failure"],
            on_health=data["on_health"],
            metric=data["metric"],
            direction=data["direction"],
            threshold=data["threshold"],
        )
    except AlertRefused as exc:
        form.add_error(None, str(exc))
        return _page(request, subscription_form=form, status=400)
    messages.success(request, f"Subscribed to {subscription.describe()}.")
    return redirect("alerts:index")


@login_required
@require_POST
def alerts_unsubscribe(request: HttpRequest, subscription_id: int) -> HttpResponse:
    subscription = get_object_or_404(
        subscription_list_for_user(user=request.user), pk=subscription_id
    )
    subscription_delete(subscription=subscription)
    messages.success(request, f"Unsubscribed from {subscription.describe()}.")
    return redirect("alerts:index")
