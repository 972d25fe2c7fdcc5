"""The sign-up, log-in and log-out pages."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_signup_is_off_unless_enabled(client, settings):
    assert client.get(reverse("signup")).status_code == 404
    settings.POSTTRAIN_ALLOW_SIGNUP = True
    response = client.post(
        reverse("signup"),
        {
            "username": "newbie",
            "password1": "a-long-passphrase-9",
            "password2": "a-long-passphrase-9",
        },
    )
    assert response.status_code == 302
    assert get_user_model().objects.filter(username="newbie").exists()


def test_login_and_logout_pages(client, owner):
    assert "Log in" in client.get(reverse("login")).content.decode()
    response = client.post(reverse("login"), {"username": "alice", "password": "alice-pass"})
    assert response.status_code == 302
    assert client.get(reverse("experiments:list")).status_code == 200
    client.post(reverse("logout"))
    assert client.get(reverse("experiments:list")).status_code == 302
