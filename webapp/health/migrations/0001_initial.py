import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("runs", "0002_run_driver_host_stalled_since"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunHealthState",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="health_state",
                        serialize=False,
                        to="runs.run",
                    ),
                ),
                (
                    "context",
                    models.JSONField(
                        help_text="checks.RunContext, read from the run's config once."
                    ),
                ),
                (
                    "state",
                    models.JSONField(help_text="checks.HealthState after the run's latest step."),
                ),
            ],
        ),
        migrations.CreateModel(
            name="HealthAlert",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "check_name",
                    models.CharField(
                        choices=[
                            ("entropy_collapse", "entropy collapse"),
                            ("kl_over_target", "KL over target"),
                            ("clip_fraction_high", "clip fraction high"),
                            ("reward_hacking", "reward up, validation down"),
                            ("length_collapse", "length collapse"),
                            ("length_at_limit", "length at limit"),
                            ("non_finite_loss", "NaN/inf loss"),
                            ("grad_norm_spike", "grad-norm spike"),
                            ("reward_errors", "reward errors"),
                        ],
                        max_length=32,
                    ),
                ),
                (
                    "step",
                    models.PositiveIntegerField(help_text="The step at which the check fired."),
                ),
                (
                    "message",
                    models.CharField(help_text="One line saying why it fired.", max_length=500),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="health_alerts",
                        to="runs.run",
                    ),
                ),
            ],
            options={
                "ordering": ["step", "pk"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("run", "check_name"), name="healthalert_unique_check"
                    )
                ],
            },
        ),
    ]
