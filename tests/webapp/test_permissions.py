"""Ownership: another user gets a 404 on every page, form, download and action of an object.

The world here is the owner's: a project holding her experiment, runs, sweep and an external
run, with a run shared by link; the role matrix (``test_role_matrix.py``) adds its members.

The walker enumerates every URL pattern from the resolver, so a new page is covered the day it
is added; a pattern with a URL argument the walker does not know fails the test until it learns.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.contrib.contenttypes.models import ContentType
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from engine.trainer.checkpoint import HF_FOLDER, step_dir
from engine.trainer.reporting import SampleRecord
from tests.webapp.fixtures import make_experiment
from tests.webapp.live import private_redis_layer, short_lived_connections  # noqa: F401
from tests.webapp.runs.test_consumers import open_socket
from webapp.alerts.models import AlertSettings, Subscription
from webapp.alerts.services import subscription_create
from webapp.api.models import ApiToken
from webapp.api.tokens import token_create
from webapp.datasets.models import Dataset
from webapp.datasets.services import dataset_create
from webapp.experiments.models import Experiment
from webapp.external.services import external_run_create
from webapp.projects.models import Membership, Project, RunShare
from webapp.projects.services import experiment_move, project_create, run_share
from webapp.reports.models import Report
from webapp.reports.services import report_create
from webapp.runs.driver_writes import samples_write
from webapp.runs.logs import run_log_path
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create
from webapp.sweeps.models import Sweep
from webapp.sweeps.services import sweep_create

pytestmark = pytest.mark.django_db

SECRET = "alice-secret"
# URL arguments that name one of the owner's objects: the other user must get a 404.
OBJECT_KWARGS = (
    "project_id",
    "experiment_id",
    "run_id",
    "other_run_id",
    "dataset_id",
    "sweep_id",
    "token_id",
    "subscription_id",
)


def walk(patterns, namespace="", chain=()):
    """Yield (qualified name or None, pattern chain) for every URL pattern."""
    for entry in patterns:
        if isinstance(entry, URLResolver):
            ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from walk(entry.url_patterns, ns, (*chain, entry))
        elif isinstance(entry, URLPattern):
            name = f"{namespace}{entry.name}" if entry.name else None
            yield name, (*chain, entry)


def kwarg_names(chain) -> set[str]:
    names: set[str] = set()
    for entry in chain:
        pattern = entry.pattern
        converters = getattr(pattern, "converters", None)
        names |= set(converters) if converters else set(pattern.regex.groupindex)
    return names


def write_log(run, text: str) -> None:
    path = run_log_path(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def world(owner, studio_dirs):
    return build_world(owner)


def build_world(owner):
    """Create the owner's objects of every kind; return the URL arguments that name them."""
    experiment = make_experiment(owner, name=f"{SECRET} experiment")
    running = run_create(experiment=experiment)
    Run.objects.filter(pk=running.pk).update(status=RunStatus.RUNNING, error=f"{SECRET} traceback")
    # A sample for the inspector's pages and exports to show to its owner only.
    secret_sample = SampleRecord(
        step=0,
        split="train",
        prompt_index=0,
        sample_index=0,
        group_id="g",
        data_source="secret",
        prompt_text=f"{SECRET} prompt",
        response_text=f"{SECRET} response",
        ground_truth=None,
        reward=1.0,
    )
    samples_write(run_id=running.pk, samples=[secret_sample])
    stopped = run_create(experiment=experiment)
    Run.objects.filter(pk=stopped.pk).update(status=RunStatus.CANCELLED)
    for run in (running, stopped):  # the driver's own output: the log views and search
        write_log(run, f"loading the model\n{SECRET} log line\n")
    checkpoint = Path(stopped.checkpoint_dir) / "global_step_1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"x")
    upload = SimpleUploadedFile(
        "secret.jsonl", f'{{"prompt": "{SECRET}", "ground_truth": "1"}}\n'.encode()
    )
    dataset = dataset_create(owner=owner, name=f"{SECRET} dataset", upload=upload)
    token, _ = token_create(owner=owner, name=f"{SECRET} token")
    sweep = sweep_create(
        experiment=experiment,
        name=f"{SECRET} sweep",
        spec={"mode": "grid", "params": {"actor_rollout_ref.actor.optim.lr": [1e-6]}},
        concurrency=1,
    )
    owner.email = "alice@example.org"
    owner.save()
    # The project the experiment lives in, with no member yet (the matrix adds its roles).
    project = project_create(owner=owner, name=f"{SECRET} project")
    experiment_move(experiment=experiment, by=owner, project=project)
    external, _ = external_run_create(
        owner=owner, key="k" * 16, name=f"{SECRET} external", source="verl"
    )
    experiment_move(experiment=external.experiment, by=owner, project=project)
    share = run_share(run=stopped, by=owner)
    hf = step_dir(running.checkpoint_dir, 1) / "actor" / HF_FOLDER
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    subscription = subscription_create(
        owner=owner, scope="run", run=running, channel="email", metric="x", threshold=1.0
    )
    # A report in the project, of both runs, whose notes and sample table show the secret.
    report = report_create(
        owner=owner,
        title=f"{SECRET} report",
        run_ids=[running.pk, stopped.pk],
        project=project,
        notes=f"{SECRET} notes",
    )
    return {
        "report_id": report.uuid,
        "project_id": project.pk,
        "external_run_id": external.pk,
        "share_token": share.token,
        "subscription_id": subscription.pk,
        "experiment_id": experiment.pk,
        "run_id": running.pk,
        "other_run_id": stopped.pk,
        "dataset_id": dataset.pk,
        "sweep_id": sweep.pk,
        "step": 1,  # a checkpoint's step
        "token_id": token.pk,
        "object_id": str(experiment.pk),
        "app_label": "experiments",
        "content_type_id": ContentType.objects.get_for_model(Experiment).pk,
        "id": owner.pk,
        "uidb64": urlsafe_base64_encode(force_bytes(owner.pk)),
        "token": "set-password",
    }


def snapshot():
    return {
        "experiments": list(Experiment.objects.values_list("pk", "name", "archived", "tags")),
        "runs": list(
            Run.objects.values_list("pk", "status", "cancel_requested", "notes", "tags").order_by(
                "pk"
            )
        ),
        "datasets": list(Dataset.objects.values_list("pk", "name", "key_map")),
        "sweeps": list(Sweep.objects.values_list("pk", "name", "cancelled_at")),
        "tokens": list(ApiToken.objects.values_list("pk", "name")),
        "subscriptions": list(Subscription.objects.values_list("pk", "owner_id", "run_id")),
        "alert_settings": list(AlertSettings.objects.values_list("owner_id", "webhook_url")),
        "projects": list(Project.objects.values_list("pk", "name")),
        "members": list(Membership.objects.values_list("pk", "user_id", "role").order_by("pk")),
        "placement": list(Experiment.objects.values_list("pk", "project_id").order_by("pk")),
        "shares": list(RunShare.objects.values_list("pk", "token")),
        "reports": list(
            Report.objects.values_list("pk", "title", "notes", "metrics", "project_id")
        ),
    }


def test_another_user_sees_and_changes_nothing_on_any_url(world, other_user):
    """The outsider column of the role matrix (``tests/webapp/test_role_matrix.py``), for every
    URL the resolver knows, admin included: nothing of the owner's shows or changes."""
    before = snapshot()
    client = Client()
    checked = 0
    for name, chain in walk(get_resolver().url_patterns):
        names = kwarg_names(chain)
        is_admin = str(chain[0].pattern) == "admin/"
        if name is None:
            assert is_admin, (
                f"unnamed URL pattern {chain[-1].pattern}: name it so the walker can test it"
            )
            url = "/admin/anything/"
        else:
            unknown = names - set(world)
            assert not unknown, f"{name}: teach the walker what to put in {sorted(unknown)}"
            url = reverse(name, kwargs={k: world[k] for k in names})
        if name == "projects:shared":
            continue  # opening a share link grants reading: the matrix tests it last
        for method in ("get", "post"):
            client.force_login(other_user)
            # The API speaks JSON: its bodies are JSON, so ownership is what answers.
            api_post = method == "post" and url.startswith("/api/")
            body = {"data": "{}", "content_type": "application/json"} if api_post else {}
            response = getattr(client, method)(url, **body)
            body = response.content.decode(errors="replace")
            where = f"{method.upper()} {url} ({name})"
            assert SECRET not in body, f"{where} shows the owner's data"
            if is_admin:
                assert response.status_code in (200, 302, 404), where
                if response.status_code == 302:
                    assert response["Location"].startswith("/admin/"), where
            elif names & set(OBJECT_KWARGS):
                assert response.status_code in (404, 405), f"{where}: {response.status_code}"
            checked += 1
    assert checked > 60
    assert snapshot() == before


def test_pages_need_a_login(world):
    client = Client()
    for name in ("experiments:list", "experiments:new", "datasets:list"):
        response = client.get(reverse(name))
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    response = client.get(reverse("runs:detail", kwargs={"run_id": world["run_id"]}))
    assert response.status_code == 302


def test_actions_need_a_csrf_token(world, owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    url = reverse("runs:cancel", kwargs={"run_id": world["run_id"]})
    assert client.post(url).status_code == 403
    assert not Run.objects.get(pk=world["run_id"]).cancel_requested
    page = client.get(reverse("runs:detail", kwargs={"run_id": world["run_id"]})).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert client.post(url, {"csrfmiddlewaretoken": token}).status_code == 302
    assert Run.objects.get(pk=world["run_id"]).cancel_requested


def test_the_owner_reads_the_runs_log_over_http(world, owner):
    client = Client()
    client.force_login(owner)
    run_id = world["run_id"]
    log = client.get(reverse("runs:log", kwargs={"run_id": run_id}))
    assert f"{SECRET} log line" in b"".join(log.streaming_content).decode()
    found = client.get(reverse("runs:log-search", kwargs={"run_id": run_id}), {"q": SECRET})
    assert found.json()["matches"] == [{"line": 2, "text": f"{SECRET} log line"}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("private_redis_layer", "short_lived_connections")
async def test_another_member_gets_no_log_over_the_runs_socket(owner, other_user, studio_dirs):
    experiment = await database_sync_to_async(make_experiment)(owner, name=SECRET)
    run = await database_sync_to_async(run_create)(experiment=experiment)
    write_log(run, f"{SECRET} log line\n")
    stranger = await open_socket(f"/ws/runs/{run.pk}/?log=", other_user)
    assert await stranger.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}
    await stranger.disconnect()
    own = await open_socket(f"/ws/runs/{run.pk}/?log=", owner)  # the same socket works for her
    messages = [await own.receive_json_from(timeout=10) for _ in range(2)]
    assert messages[-1]["type"] == "log" and SECRET in messages[-1]["text"]
    await own.disconnect()


def test_the_owner_sees_the_traceback_of_a_failed_run(world, owner):
    client = Client()
    client.force_login(owner)
    page = client.get(reverse("runs:detail", kwargs={"run_id": world["run_id"]})).content.decode()
    assert f"{SECRET} traceback" in page
    assert f'data-group="run.{world["run_id"]}"' in page
