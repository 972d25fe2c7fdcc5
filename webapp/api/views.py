"""The API tokens page: make a token (its secret is shown once), see and revoke yours."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.api.tokens import TokenRefused, token_create, token_list_for_user, token_revoke


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. 'laptop'.")


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    secret = ""
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                _, secret = token_create(owner=request.user, name=form.cleaned_data["name"])
            except TokenRefused as exc:
                form.add_error("name", str(exc))
            else:
                form = TokenForm()
        if not secret:
            status = 400
    context = {"form": form, "secret": secret, "tokens": token_list_for_user(user=request.user)}
    response = render(request, "api/tokens.html", context, status=status)
    response["Cache-Control"] = "no-store"  # the page may hold a token's secret
    return response


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(token_list_for_user(user=request.user), pk=token_id)
    token_revoke(token=token)
    messages.success(request, f"Token {token.name} revoked; requests that carry it are refused.")
    return redirect("api-tokens:list")
