from django.urls import path

from webapp.sweeps import views

app_name = "sweeps"

urlpatterns = [
    path("", views.sweep_list, name="list"),
    path("new/", views.sweep_new, name="new"),
    path("<int:sweep_id>/", views.sweep_detail, name="detail"),
    path("<int:sweep_id>/state.json", views.sweep_state_view, name="state"),
    path("<int:sweep_id>/cancel/", views.sweep_cancel_view, name="cancel"),
]
