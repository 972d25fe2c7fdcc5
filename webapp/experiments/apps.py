from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "webapp.experiments"
    label = "experiments"
