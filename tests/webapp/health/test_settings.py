"""The health thresholds come from POSTTRAIN_HEALTH_* in the environment; a bad one stops the
studio at start with the setting's name and an example."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

READ = "import webapp.settings as s; print(s.POSTTRAIN_HEALTH_CLIPFRAC_MAX, s.POSTTRAIN_HEALTH_GRAD_NORM_WINDOW)"


def read_settings(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", READ],
        env={**os.environ, "DJANGO_SECRET_KEY": secrets.token_urlsafe(50), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_threshold_is_read_from_the_environment():
    done = read_settings(
        POSTTRAIN_HEALTH_CLIPFRAC_MAX="0.2", POSTTRAIN_HEALTH_GRAD_NORM_WINDOW="50"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.2", "50"]


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("POSTTRAIN_HEALTH_CLIPFRAC_MAX", "high", "'high' is not a positive number"),
        ("POSTTRAIN_HEALTH_CLIPFRAC_MAX", "-1", "'-1' is not a positive number"),
        ("POSTTRAIN_HEALTH_CLIPFRAC_MAX", "nan", "'nan' is not a positive number"),
        ("POSTTRAIN_HEALTH_GRAD_NORM_WINDOW", "2.5", "'2.5' is not a positive whole number"),
    ],
)
def test_a_bad_threshold_stops_the_studio_naming_the_setting(name, value, problem):
    done = read_settings(**{name: value})
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}={problem}; set it like {name}=" in done.stderr
