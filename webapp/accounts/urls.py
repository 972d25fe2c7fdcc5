from django.urls import path

from webapp.accounts import views

urlpatterns = [path("signup/", views.signup, name="signup")]
