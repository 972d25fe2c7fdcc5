"""Log-in throttling (django-axes) and the password rules of the sign-up form."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

pytestmark = pytest.mark.django_db


def log_in(client, password: str):
    return client.post(reverse("login"), {"username": "alice", "password": password})


def test_six_wrong_passwords_lock_the_account_out_even_for_the_right_one(client, owner, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, "wrong-guess").status_code == 200  # the form again, with its error
    for _ in range(2):  # the fifth wrong one locks; the sixth meets the lock
        response = log_in(client, "wrong-guess")
        assert response.status_code == 429
    response = log_in(client, "alice-pass")
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed log-ins" in page and "after 5 wrong passwords" in page
    assert "locked for 15 minutes" in page and "axes_reset_username alice" in page
    assert client.get(reverse("experiments:list")).status_code == 302  # still logged out


def test_a_right_password_resets_the_count(client, owner, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        log_in(client, "wrong-guess")
    assert log_in(client, "alice-pass").status_code == 302
    client.post(reverse("logout"))
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, "wrong-guess").status_code == 200
    assert log_in(client, "alice-pass").status_code == 302


def test_the_lock_is_per_username_and_address(client, owner, other_user, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "wrong-guess")
    response = client.post(reverse("login"), {"username": "mallory", "password": "mallory-pass"})
    assert response.status_code == 302


@pytest.mark.parametrize(
    ("password", "rule"),
    [
        ("Xq7#kd", "This password is too short. It must contain at least 10 characters."),
        ("password123", "This password is too common."),
        ("8352019476", "This password is entirely numeric."),
        ("newbie-the-user", "The password is too similar to the username."),
    ],
)
def test_a_weak_password_at_sign_up_is_refused_naming_the_rule(client, settings, password, rule):
    settings.POSTTRAIN_ALLOW_SIGNUP = True
    data = {"username": "newbie-the-user", "password1": password, "password2": password}
    response = client.post(reverse("signup"), data)
    assert response.status_code == 200
    assert rule in response.content.decode().replace("&#x27;", "'")
    assert not get_user_model().objects.filter(username="newbie-the-user").exists()
