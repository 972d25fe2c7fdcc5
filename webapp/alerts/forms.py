"""The alerts page's forms: the member's webhook URL, and a new subscription."""

from __future__ import annotations

from django import forms

from webapp.alerts.models import Channel, Direction, Scope


class AlertSettingsForm(forms.Form):
    webhook_url = forms.CharField(
        max_length=500,
        required=False,
        label="Webhook URL",
        help_text="A Slack or Mattermost incoming-webhook URL; empty to remove it.",
    )


class SubscriptionForm(forms.Form):
    scope = forms.ChoiceField(choices=Scope.choices, initial=Scope.ALL)
    run_id = forms.IntegerField(required=False, min_value=1, label="Run #")
    experiment_id = forms.IntegerField(required=False, min_value=1, label="Experiment #")
    project_id = forms.IntegerField(required=False, min_value=1, label="Project #")
    channel = forms.ChoiceField(choices=Channel.choices, initial=Channel.WEBHOOK)
    on_finish = forms.BooleanField(required=False, initial=True, label="finished")
    on_failure = forms.BooleanField(required=False, initial=True, label="failed or lost")
    on_health = forms.BooleanField(required=False, initial=True, label="health check fired")
    metric = forms.CharField(max_length=200, required=False, help_text="e.g. critic/score/mean")
    direction = forms.ChoiceField(choices=Direction.choices, initial=Direction.ABOVE)
    threshold = forms.FloatField(required=False)

    def clean(self) -> dict:
        data = super().clean()
        if data.get("scope") == Scope.RUN and not data.get("run_id"):
            self.add_error("run_id", "give the number of the run to watch")
        if data.get("scope") == Scope.EXPERIMENT and not data.get("experiment_id"):
            self.add_error("experiment_id", "give the number of the experiment to watch")
        if data.get("scope") == Scope.PROJECT and not data.get("project_id"):
            self.add_error("project_id", "give the number of the project to watch")
        return data
