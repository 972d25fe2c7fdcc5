from django.apps import AppConfig


class SamplesConfig(AppConfig):
    """The rollout sample inspector; it reads ``runs.Sample`` and owns no models."""

    name = "webapp.samples"
    label = "samples"
