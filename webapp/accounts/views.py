"""Sign-up (only when ``POSTTRAIN_ALLOW_SIGNUP`` is on) and the page of a locked-out log-in."""

from __future__ import annotations

from typing import Any

from axes.helpers import get_cool_off
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


def lockout(
    request: HttpRequest, original_response: Any = None, credentials: dict | None = None
) -> HttpResponse:
    """Answer a log-in that django-axes refused (``AXES_LOCKOUT_CALLABLE``): 429 and why."""
    minutes = int(get_cool_off(request).total_seconds() // 60)
    context = {
        "username": (credentials or {}).get("username") or request.POST.get("username", ""),
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": minutes,
    }
    return render(request, "registration/lockout.html", context, status=429)
