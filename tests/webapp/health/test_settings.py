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


def test_the_reward_failure_rule_is_read_from_the_environment_and_checked():
    read = "import webapp.settings as s; print(s.POSTTRAIN_REWARD_FAILURE_RATE, s.POSTTRAIN_REWARD_FAILURE_STEPS)"
    env = {"DJANGO_SECRET_KEY": secrets.token_urlsafe(50)}

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", read],
            env={**os.environ, **env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = run(POSTTRAIN_REWARD_FAILURE_RATE="0.8", POSTTRAIN_REWARD_FAILURE_STEPS="5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.8", "5"]
    assert run().stdout.split() == ["0.5", "3"]
    over = run(POSTTRAIN_REWARD_FAILURE_RATE="2")
    assert "POSTTRAIN_REWARD_FAILURE_RATE=2.0 is over 1; it is a share" in over.stderr
    zero = run(POSTTRAIN_REWARD_FAILURE_STEPS="0")
    assert "POSTTRAIN_REWARD_FAILURE_STEPS='0' is not a positive whole number" in zero.stderr
