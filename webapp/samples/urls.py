"""The inspector's pages under ``runs/<run_id>/samples/``; everything else is in the query."""

from django.urls import path

from webapp.samples import views

app_name = "samples"

urlpatterns = [
    path("", views.sample_step_view, name="step"),
    path("steps.json", views.sample_steps_json, name="steps"),
    path("run/", views.sample_run_view, name="run"),
    path("prompts/", views.sample_recurring_view, name="prompts"),
    path("group/", views.sample_group_view, name="group"),
    path("prompt/", views.sample_prompt_view, name="prompt"),
    path("compare/", views.sample_compare_view, name="compare"),
    path("export.jsonl", views.sample_export_jsonl, name="export-jsonl"),
    path("export.csv", views.sample_export_csv, name="export-csv"),
]
