"""The API tokens page, under ``accounts/tokens/``."""

from django.urls import path

from webapp.api import views

app_name = "api-tokens"

urlpatterns = [
    path("", views.token_list, name="list"),
    path("<int:token_id>/revoke/", views.token_revoke_view, name="revoke"),
]
