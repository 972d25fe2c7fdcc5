from django.urls import path

from webapp.experiments import views

app_name = "experiments"

urlpatterns = [
    path("", views.experiment_list, name="list"),
    path("experiments/new/", views.experiment_new, name="new"),
    path("experiments/new/preview/", views.builder_preview, name="preview"),
    path("experiments/import/", views.experiment_import, name="import"),
    path("experiments/<int:experiment_id>/", views.experiment_detail, name="detail"),
    path("experiments/<int:experiment_id>/clone/", views.experiment_clone, name="clone"),
    path("experiments/<int:experiment_id>/config.yaml", views.experiment_yaml, name="yaml"),
    path("experiments/<int:experiment_id>/launch/", views.experiment_launch, name="launch"),
    path("experiments/<int:experiment_id>/archive/", views.experiment_archive, name="archive"),
    path("experiments/<int:experiment_id>/delete/", views.experiment_remove, name="delete"),
]
