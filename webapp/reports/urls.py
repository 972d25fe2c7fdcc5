"""Report pages, under ``reports/``: the link is the report's UUID, stable across edits."""

from django.urls import path

from webapp.reports import views

app_name = "reports"

urlpatterns = [
    path("", views.report_list, name="list"),
    path("<uuid:report_id>/", views.report_detail, name="detail"),
    path("<uuid:report_id>/edit/", views.report_edit, name="edit"),
    path("<uuid:report_id>/export.html", views.report_export, name="export"),
    path("<uuid:report_id>/delete/", views.report_delete_view, name="delete"),
]
