from django.apps import AppConfig


class ExternalConfig(AppConfig):
    name = "webapp.external"
    label = "external"
    verbose_name = "External runs"
