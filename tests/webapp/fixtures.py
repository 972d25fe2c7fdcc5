"""Fixtures and helpers shared by the web app and worker tests (imported by both conftests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REWARD_MODULE = '''"""Rewards installed for the tests."""
import sys

sys.exit("importing this module would stop the process: listing must not import it")


def length_penalty(data_source, solution_str, ground_truth, extra_info=None):
    """Reward short answers."""
    return -len(solution_str) / 100


def _helper():
    return 0
'''


@pytest.fixture(autouse=True)
def studio_dirs(settings: Any, tmp_path: Path) -> Path:
    """Point the data, upload and reward-module directories at a fresh temporary folder."""
    # Password hashing is deliberately slow; the tests log in often.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    data = tmp_path / "data"
    rewards = tmp_path / "rewards"
    rewards.mkdir()
    (rewards / "house_rewards.py").write_text(REWARD_MODULE)
    settings.POSTTRAIN_DATA_DIR = data
    settings.MEDIA_ROOT = data / "uploads"
    settings.POSTTRAIN_REWARD_MODULES_DIR = rewards
    return tmp_path


@pytest.fixture
def owner(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="alice-pass")


@pytest.fixture
def other_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("mallory", password="mallory-pass")


@pytest.fixture
def team(owner: Any, django_user_model: Any) -> dict[str, Any]:
    """Return ``owner``'s project "rl team" with bob an editor and carol a viewer, and the
    experiment "shared grpo" moved into it (keys project, bob, carol, experiment)."""
    from webapp.projects.models import Role
    from webapp.projects.services import experiment_move, member_add, project_create

    bob = django_user_model.objects.create_user("bob", password="bob-pass")
    carol = django_user_model.objects.create_user("carol", password="carol-pass")
    project = project_create(owner=owner, name="rl team")
    member_add(project=project, by=owner, username="bob", role=Role.EDITOR)
    member_add(project=project, by=owner, username="carol", role=Role.VIEWER)
    experiment = make_experiment(owner, name="shared grpo")
    experiment_move(experiment=experiment, by=owner, project=project)
    return {"project": project, "bob": bob, "carol": carol, "experiment": experiment}


@pytest.fixture
def client_in(client: Any, owner: Any) -> Any:
    """Return Django's test client logged in as ``owner``."""
    client.force_login(owner)
    return client


def tiny_config(**values: Any) -> Any:
    """Return the grpo_tiny preset with dotted keys set (``trainer__save_freq=1``)."""
    from engine.config import set_value
    from webapp.experiments.configs import preset_load

    config = preset_load("grpo_tiny")
    for key, value in values.items():
        set_value(config, key.replace("__", "."), value)
    return config


def builder_data(config: Any, owner: Any, **fields: Any) -> dict[str, Any]:
    """Return the POST data the builder page would send for ``config`` (as a browser would)."""
    from webapp.experiments.forms import ExperimentForm

    initial = ExperimentForm.initial_from_config(config, owner)
    data: dict[str, Any] = {}
    for name, value in initial.items():
        if value is False:
            continue  # an unticked checkbox is absent from a browser's POST
        data[name] = "on" if value is True else value
    data.update({"name": "tiny grpo", "preset": "grpo_tiny", "launch": "on"})
    data.update(fields)
    return {k: v for k, v in data.items() if v is not None}


def make_experiment(owner: Any, name: str = "tiny grpo", **values: Any) -> Any:
    from webapp.experiments.services import experiment_create

    return experiment_create(
        owner=owner, name=name, config=tiny_config(**values), tags="Tiny, GRPO"
    )


def make_run(owner: Any, status: str = "queued", **fields: Any) -> Any:
    """Return run #1 of a new tiny experiment of ``owner`` (an empty config), as a bare row: no
    launch message, no files."""
    from webapp.runs.models import Run

    return Run.objects.create(
        experiment=make_experiment(owner), owner=owner, number=1, status=status, config={}, **fields
    )


def errors_by_key(exc: Any) -> dict[str, str]:
    """Return a ``ConfigValidationError``'s messages by config key."""
    return {e.key: e.message for e in exc.errors}
