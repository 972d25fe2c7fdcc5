from django.urls import path

from webapp.datasets import views

app_name = "datasets"

urlpatterns = [
    path("", views.dataset_list, name="list"),
    path("upload/", views.dataset_upload, name="upload"),
    path("<int:dataset_id>/", views.dataset_detail, name="detail"),
    path("<int:dataset_id>/download/", views.dataset_download, name="download"),
    path("<int:dataset_id>/delete/", views.dataset_remove, name="delete"),
]
