"""The alerts page, under ``alerts/``."""

from django.urls import path

from webapp.alerts import views

app_name = "alerts"

urlpatterns = [
    path("", views.alerts_index, name="index"),
    path("settings/", views.alerts_settings, name="settings"),
    path("subscribe/", views.alerts_subscribe, name="subscribe"),
    path("<int:subscription_id>/unsubscribe/", views.alerts_unsubscribe, name="unsubscribe"),
]
