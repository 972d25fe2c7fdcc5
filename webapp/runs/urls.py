from django.urls import path

from webapp.runs import views

app_name = "runs"

urlpatterns = [
    path("", views.run_table_view, name="list"),
    path("<int:run_id>/", views.run_detail, name="detail"),
    path("compare/", views.run_compare, name="compare"),
    path("groups/series/", views.run_group_series, name="group-series"),
    path("<int:run_id>/metrics/series/", views.run_metrics_series, name="metrics-series"),
    path("<int:run_id>/metrics.csv", views.run_metrics_csv, name="metrics-csv"),
    path("<int:run_id>/metrics.json", views.run_metrics_json_view, name="metrics-json"),
    path("<int:run_id>/log.txt", views.run_log_download, name="log"),
    path("<int:run_id>/log/search/", views.run_log_search_view, name="log-search"),
    path("<int:run_id>/checkpoints/", views.run_checkpoints_view, name="checkpoints"),
    path(
        "<int:run_id>/checkpoints/<int:step>/hf.tar",
        views.run_checkpoint_archive,
        name="checkpoint-archive",
    ),
    path(
        "<int:run_id>/checkpoints/<int:step>/export/",
        views.run_checkpoint_export_view,
        name="checkpoint-export",
    ),
    path(
        "<int:run_id>/checkpoints/<int:step>/evaluate/",
        views.run_checkpoint_evaluate_view,
        name="checkpoint-evaluate",
    ),
    path("<int:run_id>/cancel/", views.run_cancel_view, name="cancel"),
    path("<int:run_id>/resume/", views.run_resume_view, name="resume"),
    path("<int:run_id>/delete/", views.run_delete_view, name="delete"),
    path("<int:run_id>/notes/", views.run_notes_view, name="notes"),
    path("<int:run_id>/tags/", views.run_tags_view, name="tags"),
    path("<int:run_id>/clone/", views.run_clone, name="clone"),
    path("<int:run_id>/config.yaml", views.run_yaml, name="yaml"),
    path("<int:run_id>/diff/", views.run_diff_pick, name="diff-pick"),
    path("<int:run_id>/diff/<int:other_run_id>/", views.run_diff, name="diff"),
]
