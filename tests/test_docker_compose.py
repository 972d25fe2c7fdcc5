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
APP_SERVICES = ["web", "worker", "beat", "ray-head", "worker-gpu"]
# Where the site's settings load (and need the secret key), and where drivers run reward code.
SITE_SERVICES = ["web", "worker", "beat"]
SANDBOX_SERVICES = ["worker", "ray-head", "worker-gpu"]
# Variables read by libraries rather than by our code.
LIBRARY_VARS = {"OMP_NUM_THREADS", "RAY_AUTH_MODE"}


def env_vars_read_by_code() -> set[str]:
    """Return the environment variable names our packages read."""
    pattern = re.compile(
        r"""(?:os\.environ\.get|os\.getenv|_env_bool|_env_list)\(\s*["']([A-Z_]+)["']"""
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
    assert set(SERVICES) == {"postgres", "redis", "ray-head", "web", "worker", "beat", "worker-gpu"}
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


@pytest.mark.parametrize("service", APP_SERVICES)
def test_every_app_service_runs_in_production_mode(service):
    env = SERVICES[service]["environment"]
    assert env["DJANGO_DEBUG"] == "0"
    assert env["DJANGO_ALLOWED_HOSTS"] == "localhost,127.0.0.1"
    secret = env.get("DJANGO_SECRET_KEY")
    if service in SITE_SERVICES:  # required: compose stops with the message when it is unset
        assert re.fullmatch(r"\$\{DJANGO_SECRET_KEY:\?set DJANGO_SECRET_KEY .+\}", secret), secret
    else:  # drivers get a throwaway key of their own (workers.tasks.driver_settings_env)
        assert secret is None


def test_beat_is_one_service_of_its_own_and_the_worker_does_not_beat():
    worker = SERVICES["worker"]["command"]
    beat = SERVICES["beat"]["command"]
    assert "--beat" not in worker and "-B" not in worker
    assert beat[:4] == ["celery", "-A", worker[worker.index("-A") + 1], "beat"]
    assert flag(beat, "schedule").startswith("/data/")  # the volume the image's user owns
    assert "deploy" not in SERVICES["beat"]  # never scaled: two beats would double the sweep


@pytest.mark.parametrize("service", SANDBOX_SERVICES)
def test_services_running_reward_code_may_build_the_bubblewrap_sandbox(service):
    options = set(SERVICES[service]["security_opt"])
    assert options == {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"}
    assert "privileged" not in SERVICES[service] and "cap_add" not in SERVICES[service]
    assert "security_opt" not in SERVICES["web"]


def test_the_image_runs_as_an_unprivileged_user_with_bubblewrap():
    instructions = dockerfile_instructions((ROOT / "Dockerfile").read_text())
    runs = " ".join(arguments for keyword, arguments in instructions if keyword == "RUN")
    assert re.search(r"apt-get install [^&]*\bbubblewrap\b", runs)
    assert "useradd --uid 10001" in runs and "posttrain" in runs
    assert "chown posttrain:posttrain /data" in runs
    users = [
        (i, arguments) for i, (keyword, arguments) in enumerate(instructions) if keyword == "USER"
    ]
    assert [arguments for _, arguments in users] == ["posttrain"]
    last_run = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "RUN")
    assert users[0][0] > last_run  # installed as root, run as posttrain


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
