"""URL configuration: the studio's pages, the admin and the accounts views."""

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from webapp.api.api import api

urlpatterns = [
    # Pages link their icon; a page that does not (the API docs) asks the browser's default.
    path(
        "favicon.ico",
        RedirectView.as_view(url=static("img/favicon.svg"), permanent=True),
        name="favicon",
    ),
    path("admin/", admin.site.urls),
    path("accounts/", include("webapp.accounts.urls")),
    path("accounts/tokens/", include("webapp.api.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("datasets/", include("webapp.datasets.urls")),
    path("api/", api.urls),
    path("runs/", include("webapp.runs.urls")),
    path("runs/<int:run_id>/samples/", include("webapp.samples.urls")),
    path("sweeps/", include("webapp.sweeps.urls")),
    path("alerts/", include("webapp.alerts.urls")),
    path("projects/", include("webapp.projects.urls")),
    path("reports/", include("webapp.reports.urls")),
    path("", include("webapp.experiments.urls")),
]
