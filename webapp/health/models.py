"""A run's fired health alerts, and the small state the checks keep between its steps."""

from __future__ import annotations

from django.db import models

from webapp.health.checks import CHECKS


class HealthAlert(models.Model):
    """A health check that fired on a run: once per (run, check), at the step it first fired."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="health_alerts")
    check_name = models.CharField(
        max_length=32, choices=[(name, label) for name, label in CHECKS.items()]
    )
    step = models.PositiveIntegerField(help_text="The step at which the check fired.")
    message = models.CharField(max_length=500, help_text="One line saying why it fired.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["run", "check_name"], name="healthalert_unique_check")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id}: {self.check_name} at step {self.step}"

    @property
    def label(self) -> str:
        return CHECKS.get(self.check_name, self.check_name)

    def as_event(self) -> dict[str, object]:
        """Return the alert as the run page's script reads it."""
        return {
            "check": self.check_name,
            "label": self.label,
            "step": self.step,
            "message": self.message,
        }


class RunHealthState(models.Model):
    """What the checks keep of a run's earlier steps (``checks.HealthState``) and its context."""

    run = models.OneToOneField(
        "runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="health_state"
    )
    context = models.JSONField(help_text="checks.RunContext, read from the run's config once.")
    state = models.JSONField(help_text="checks.HealthState after the run's latest step.")
