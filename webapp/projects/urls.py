"""Project pages, under ``projects/``."""

from django.urls import path

from webapp.projects import views

app_name = "projects"

urlpatterns = [
    path("", views.project_list, name="list"),
    path("<int:project_id>/", views.project_detail, name="detail"),
    path("<int:project_id>/members/add/", views.member_add_view, name="member-add"),
    path("<int:project_id>/members/role/", views.member_role_view, name="member-role"),
    path("<int:project_id>/members/remove/", views.member_remove_view, name="member-remove"),
    path("experiments/<int:experiment_id>/move/", views.experiment_move_view, name="move"),
    path("runs/<int:run_id>/share/", views.run_share_view, name="share"),
    path("runs/<int:run_id>/unshare/", views.run_unshare_view, name="unshare"),
    path("shared/<str:share_token>/", views.run_shared_view, name="shared"),
]
