"""docker-compose.yml cannot run on this machine; keep it honest against the code instead."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from webapp.settings import database_from_url

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
APP_SERVICES = ["web", "worker", "ray-head", "worker-gpu"]
# Variables read by libraries rather than by our code.
LIBRARY_VARS = {"OMP_NUM_THREADS", "RAY_AUTH_MODE"}


def env_vars_read_by_code() -> set[str]:
    """Return the environment variable names our packages read."""
    pattern = re.compile(
        r"""(?:os\.environ\.get|os\.getenv|_env_bool)\(\s*["']([A-Z_]+)["']"""
        r"""|os\.environ\[["']([A-Z_]+)["']\]"""
    )
    names: set[str] = set()
    for package in ("engine", "workers", "webapp"):
        for path in (ROOT / package).rglob("*.py"):
            for match in pattern.finditer(path.read_text()):
                names.add(match.group(1) or match.group(2))
    return names


def flag(command: list[str], name: str) -> str:
    """Return the value of ``--name=value`` in a command list."""
    for part in command:
        if part.startswith(f"--{name}="):
            return part.split("=", 1)[1]
    raise AssertionError(f"--{name}= not in {command}")


def test_services_are_the_documented_ones():
    assert set(SERVICES) == {"postgres", "redis", "ray-head", "web", "worker", "worker-gpu"}
    assert SERVICES["worker-gpu"]["profiles"] == ["gpu"]
    assert SERVICES["worker-gpu"]["build"]["args"]["EXTRAS"] == "gpu"


@pytest.mark.parametrize("service", APP_SERVICES)
def test_app_environment_matches_settings(service):
    env = SERVICES[service]["environment"]
    read = env_vars_read_by_code()
    for required in ("DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "POSTTRAIN_DATA_DIR"):
        assert required in read, f"code no longer reads {required}"
        assert required in env, f"{service} does not set {required}"
    unknown = set(env) - read - LIBRARY_VARS
    assert not unknown, f"{service} sets variables no code reads: {unknown}"
    assert env["POSTTRAIN_DATA_DIR"] in {v.split(":")[1] for v in SERVICES[service]["volumes"]}


def test_urls_point_at_the_services():
    env = SERVICES["web"]["environment"]
    pg = SERVICES["postgres"]["environment"]
    db = database_from_url(env["DATABASE_URL"])
    assert (db["HOST"], db["USER"], db["PASSWORD"], db["NAME"]) == (
        "postgres",
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        pg["POSTGRES_DB"],
    )
    assert urlparse(env["REDIS_URL"]).hostname == "redis"
    ray = urlparse(env["RAY_ADDRESS"])
    head = SERVICES["ray-head"]["command"]
    assert ray.hostname == "ray-head" and str(ray.port) == flag(head, "dashboard-port")
    gpu_address = flag(SERVICES["worker-gpu"]["command"], "address")
    assert gpu_address == f"ray-head:{flag(head, 'port')}"


def test_commands_name_importable_entry_points():
    web = " ".join(SERVICES["web"]["command"])
    module, attr = re.search(r"(\S+):(\w+)$", web).groups()
    assert hasattr(importlib.import_module(module), attr)
    worker = SERVICES["worker"]["command"]
    app_module = worker[worker.index("-A") + 1]
    assert hasattr(importlib.import_module(app_module), "app")


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """Return the Dockerfile's ``(INSTRUCTION, arguments)``, continuation lines joined."""
    instructions, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def copied_sources(text: str) -> set[str]:
    """Return every source path of the Dockerfile's ``COPY`` instructions."""
    sources = set()
    for keyword, arguments in dockerfile_instructions(text):
        if keyword != "COPY":
            continue
        if arguments.startswith("["):
            paths = json.loads(arguments)
        else:
            paths = [word for word in arguments.split() if not word.startswith("--")]
        sources.update(path.rstrip("/") for path in paths[:-1])  # the last one is the target
    return sources


def test_dockerfile_copies_every_package():
    sources = copied_sources((ROOT / "Dockerfile").read_text())
    for package in (
        "engine",
        "workers",
        "webapp",
        "frontend",
        "rewards_contrib",
        "manage.py",
        "pyproject.toml",
        "constraints.txt",
    ):
        assert package in sources, f"the Dockerfile does not COPY {package}"


def test_a_run_line_naming_a_package_is_not_a_copy():
    text = "FROM python:3.11-slim\nCOPY engine engine\nRUN ls webapp && \\\n    echo workers done\n"
    assert copied_sources(text) == {"engine"}
