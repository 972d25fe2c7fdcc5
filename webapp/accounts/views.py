"""Sign-up, available only when ``POSTTRAIN_ALLOW_SIGNUP`` is on (accounts come from an admin)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth.forms import UserCreationForm
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render


def signup(request: HttpRequest) -> HttpResponse:
    if not settings.POSTTRAIN_ALLOW_SIGNUP:
        raise Http404("sign-up is off; ask an administrator for an account")
    form = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect(settings.LOGIN_REDIRECT_URL)
    return render(request, "registration/signup.html", {"form": form})
