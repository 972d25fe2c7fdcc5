"""The settings a deployment starts with: ``manage.py check --deploy`` clean, no default secret.

Each case is a fresh ``manage.py`` process, since the settings read the environment once.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from django.conf import settings

PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "POSTTRAIN_TLS": "1",
    "DJANGO_ALLOWED_HOSTS": "studio.example.org",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://studio.example.org",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``manage.py`` with this process's environment minus every DJANGO_/POSTTRAIN_TLS one."""
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "POSTTRAIN_TLS"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env={**base, "DJANGO_SETTINGS_MODULE": "webapp.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_passes_without_a_warning_in_production():
    result = manage("check", "--deploy", **PRODUCTION, DJANGO_SECRET_KEY=secrets.token_urlsafe(50))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNINGS" not in output and "?:" not in output and "ERRORS" not in output, output
    assert "System check identified no issues" in output


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        (None, "DJANGO_SECRET_KEY is not set"),
        ("posttrain-local-development-key-change-me", "is a published development key"),
        ("change-me-in-production", "is shorter than 50 characters"),
    ],
)
def test_without_debug_a_missing_or_weak_secret_stops_the_process(secret, problem):
    env = dict(PRODUCTION) | ({} if secret is None else {"DJANGO_SECRET_KEY": secret})
    result = manage("check", **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and problem in result.stderr
    fix = 'generate one with python -c "import secrets; print(secrets.token_urlsafe(50))"'
    assert fix in result.stderr and "set DJANGO_SECRET_KEY to it" in result.stderr


def test_debug_runs_without_a_secret_and_production_hosts_have_no_wildcard():
    assert manage("check", DJANGO_DEBUG="1").returncode == 0
    code = "from django.conf import settings; print(settings.ALLOWED_HOSTS, settings.DEBUG)"
    result = manage(
        "shell", "--no-imports", "-c", code, DJANGO_SECRET_KEY=secrets.token_urlsafe(50)
    )
    assert result.stdout.strip() == "['localhost', '127.0.0.1'] False", result.stderr
