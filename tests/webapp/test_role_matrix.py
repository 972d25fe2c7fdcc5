"""The role matrix: owner, editor, viewer, outsider and anonymous on every route and socket.

One table, ``ROUTES``, says for every named URL pattern (pages, downloads, actions and API
routes) and each method what it needs and what it answers when allowed:

- ``VIEW``, ``EDIT``, ``OWN``: a role on the object (``webapp.projects.access``): allowed, the
  ``ok`` answer; a member without the role, 403; an outsider, 404 (as for an id that does not
  exist); anonymous, the log-in page (302) or the API's 401;
- ``SELF``: one of the owner's personal objects (a dataset, a token, a subscription): 404 for
  everyone else;
- ``ANY``: every logged-in user gets ``ok`` (lists, forms of their own);
- ``PUBLIC``: everyone, anonymous included, gets ``ok``;
- ``NONE``: the method is not allowed: 405 for every logged-in user.

The owner (alice) owns the project and everything in it; bob is its editor, carol its viewer,
mallory an outsider. A new URL pattern fails ``test_every_route_is_in_the_table`` until it has
a row. The live socket's row is ``SOCKETS``.
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import get_resolver, reverse

from tests.webapp.fixtures import make_experiment
from tests.webapp.live import private_redis_layer, short_lived_connections  # noqa: F401
from tests.webapp.runs.test_consumers import open_socket
from tests.webapp.test_permissions import SECRET, build_world, kwarg_names, snapshot, walk
from webapp.datasets.services import dataset_create
from webapp.experiments.models import Experiment
from webapp.projects.models import Role
from webapp.projects.services import experiment_move, member_add, project_create
from webapp.runs.services import run_create

pytestmark = pytest.mark.django_db

VIEW, EDIT, OWN, SELF, ANY, PUBLIC, NONE = "view", "edit", "own", "self", "any", "public", "none"
ROLES = ("owner", "editor", "viewer", "outsider", "anonymous")
RANK = {"owner": 3, "editor": 2, "viewer": 1, "outsider": 0}
NEED_RANK = {VIEW: 1, EDIT: 2, OWN: 3}
N405 = (NONE, 405)

# name: {method: (need, answer when allowed)}; "run_id": the external run for external-runs.
ROUTES: dict[str, dict[str, tuple[str, int]]] = {
    # accounts
    "favicon": {"get": (PUBLIC, 301)},
    "signup": {"get": (PUBLIC, 404)},
    "login": {"get": (PUBLIC, 200)},
    "logout": {"get": (PUBLIC, 405)},
    "password_change": {"get": (ANY, 200)},
    "password_change_done": {"get": (ANY, 200)},
    "password_reset": {"get": (PUBLIC, 200)},
    "password_reset_done": {"get": (PUBLIC, 200)},
    "password_reset_confirm": {"get": (PUBLIC, 200)},
    "password_reset_complete": {"get": (PUBLIC, 200)},
    "api-tokens:list": {"get": (ANY, 200), "post": (ANY, 400)},
    "api-tokens:revoke": {"get": N405, "post": (SELF, 302)},
    # datasets: each member's own
    "datasets:list": {"get": (ANY, 200), "post": (ANY, 200)},
    "datasets:upload": {"get": (ANY, 200), "post": (ANY, 200)},
    "datasets:detail": {"get": (SELF, 200), "post": (SELF, 200)},
    "datasets:download": {"get": (SELF, 200), "post": (SELF, 200)},
    "datasets:delete": {"get": N405, "post": (SELF, 302)},
    # experiments
    "experiments:list": {"get": (ANY, 200), "post": (ANY, 200)},
    "experiments:new": {"get": (ANY, 200), "post": (ANY, 400)},
    "experiments:preview": {"get": N405, "post": (ANY, 200)},
    "experiments:import": {"get": N405, "post": (ANY, 400)},
    "experiments:detail": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "experiments:clone": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "experiments:yaml": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "experiments:launch": {"get": N405, "post": (EDIT, 302)},
    "experiments:archive": {"get": N405, "post": (OWN, 302)},
    "experiments:delete": {"get": (OWN, 200), "post": (OWN, 302)},
    # runs
    "runs:list": {"get": (ANY, 200), "post": (ANY, 302)},
    "runs:compare": {"get": (ANY, 200), "post": (ANY, 200)},
    "runs:group-series": {"get": (VIEW, 200), "post": (VIEW, 200)},  # ?run=: the runs to band
    "runs:detail": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:metrics-series": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:metrics-csv": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:metrics-json": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:log": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:log-search": {"get": (VIEW, 400), "post": (VIEW, 400)},
    "runs:checkpoints": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:checkpoint-archive": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:checkpoint-export": {"get": N405, "post": (EDIT, 302)},
    "runs:checkpoint-evaluate": {"get": N405, "post": (EDIT, 302)},
    "runs:cancel": {"get": N405, "post": (EDIT, 302)},
    "runs:resume": {"get": N405, "post": (EDIT, 302)},
    "runs:delete": {"get": N405, "post": (OWN, 302)},
    "runs:notes": {"get": N405, "post": (EDIT, 302)},
    "runs:tags": {"get": N405, "post": (EDIT, 302)},
    "runs:clone": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:yaml": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "runs:diff-pick": {"get": (VIEW, 302), "post": (VIEW, 302)},
    "runs:diff": {"get": (VIEW, 200), "post": (VIEW, 200)},
    # the sample inspector: reading only
    "samples:step": {"get": (VIEW, 200), "post": N405},
    "samples:steps": {"get": (VIEW, 200), "post": N405},
    "samples:run": {"get": (VIEW, 200), "post": N405},
    "samples:prompts": {"get": (VIEW, 200), "post": N405},
    "samples:group": {"get": (VIEW, 400), "post": N405},
    "samples:prompt": {"get": (VIEW, 400), "post": N405},
    "samples:compare": {"get": (VIEW, 400), "post": N405},
    "samples:export-jsonl": {"get": (VIEW, 200), "post": N405},
    "samples:export-csv": {"get": (VIEW, 200), "post": N405},
    # sweeps
    "sweeps:list": {"get": (ANY, 200), "post": (ANY, 200)},
    "sweeps:new": {"get": N405, "post": (ANY, 400)},
    "sweeps:detail": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "sweeps:state": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "sweeps:cancel": {"get": N405, "post": (EDIT, 302)},
    # alerts: a member's own subscriptions (subscribing checks the run: tests/webapp/alerts)
    "alerts:index": {"get": (ANY, 200), "post": (ANY, 200)},
    "alerts:settings": {"get": N405, "post": (ANY, 302)},
    "alerts:subscribe": {"get": N405, "post": (ANY, 400)},
    "alerts:unsubscribe": {"get": N405, "post": (SELF, 302)},
    # projects
    "projects:list": {"get": (ANY, 200), "post": (ANY, 200)},
    "projects:detail": {"get": (VIEW, 200), "post": (VIEW, 200)},
    "projects:member-add": {"get": N405, "post": (OWN, 302)},
    "projects:member-role": {"get": N405, "post": (OWN, 302)},
    "projects:member-remove": {"get": N405, "post": (OWN, 302)},
    "projects:move": {"get": N405, "post": (OWN, 302)},
    "projects:share": {"get": N405, "post": (OWN, 302)},
    "projects:unshare": {"get": N405, "post": (OWN, 302)},
    "projects:shared": {"get": (ANY, 302), "post": (ANY, 302)},
    # reports: the project's members read them, its editors edit them (an empty form: an error)
    "reports:list": {"get": (ANY, 200), "post": (ANY, 200)},
    "reports:detail": {"get": (VIEW, 200), "post": N405},
    "reports:edit": {"get": N405, "post": (EDIT, 302)},
    "reports:export": {"get": (VIEW, 200), "post": N405},
    "reports:delete": {"get": N405, "post": (OWN, 302)},
    # the API (its own method per route; a JSON body of {})
    "api:openapi-json": {"get": (PUBLIC, 200)},
    "api:openapi-view": {"get": (PUBLIC, 200)},
    "api:api-root": {"get": (PUBLIC, 404)},
    "api:list_experiments": {"get": (ANY, 200)},
    "api:create_experiment": {"post": (ANY, 422)},
    "api:read_experiment": {"get": (VIEW, 200)},
    "api:delete_experiment": {"delete": (OWN, 409)},
    "api:clone_experiment": {"post": (VIEW, 201)},
    "api:archive_experiment": {"post": (OWN, 200)},
    "api:launch_experiment": {"post": (EDIT, 201)},
    "api:list_runs": {"get": (ANY, 200)},
    "api:read_run": {"get": (VIEW, 200)},
    "api:run_status": {"get": (VIEW, 200)},
    "api:cancel_run": {"post": (EDIT, 200)},
    "api:resume_run": {"post": (EDIT, 409)},
    "api:metric_series": {"get": (VIEW, 200)},
    "api:metric_table": {"get": (VIEW, 200)},
    "api:sample_step_list": {"get": (VIEW, 200)},
    "api:sample_list": {"get": (VIEW, 200)},
    "api:sample_group_read": {"get": (VIEW, 400)},
    "api:sample_export": {"get": (VIEW, 200)},
    "api:list_datasets": {"get": (ANY, 200)},
    "api:upload_dataset": {"post": (ANY, 400)},
    "api:read_dataset": {"get": (SELF, 200)},
    "api:delete_dataset": {"delete": (SELF, 204)},
    "api:preview_dataset": {"get": (SELF, 200)},
    "api:list_sweeps": {"get": (ANY, 200)},
    "api:create_sweep": {"post": (ANY, 422)},
    "api:read_sweep": {"get": (VIEW, 200)},
    "api:cancel_sweep": {"post": (EDIT, 200)},
    # external runs: only the reporting client writes (OWN: the run's owner)
    "api:create_external_run": {"post": (ANY, 422)},
    "api:read_external_run": {"get": (OWN, 200)},
    "api:attach_config": {"put": (OWN, 400)},
    "api:append_steps": {"post": (OWN, 200)},
    "api:append_samples": {"post": (OWN, 200)},
    "api:delete_samples": {"delete": (OWN, 200)},
    "api:append_logs": {"post": (OWN, 200)},
    "api:heartbeat": {"post": (OWN, 200)},
    "api:finish": {"post": (OWN, 400)},
}
EXTERNAL = {name for name in ROUTES if "external" in name} | {
    "api:attach_config",
    "api:append_steps",
    "api:append_samples",
    "api:delete_samples",
    "api:append_logs",
    "api:heartbeat",
    "api:finish",
}
EXTERNAL.discard("api:create_external_run")
# A route that deletes what another also deletes gets an object of its own.
OVERRIDES = {"api:delete_dataset": {"dataset_id": "spare_dataset_id"}}
# Query strings a route validates before it looks at the object (``{name}``: a world object).
QUERIES = {"api:delete_samples": "?step=1", "runs:group-series": "?run={run_id}"}
# Routes that change what later routes see run last, in this order: opening the share link
# makes the run readable; the deletes and the move take objects away.
LAST = (
    "projects:shared",
    "reports:delete",
    "runs:delete",
    "experiments:delete",
    "api:delete_experiment",
    "datasets:delete",
    "api:delete_dataset",
    "api-tokens:revoke",
    "alerts:unsubscribe",
    "projects:member-remove",
    "projects:move",
)
# The run socket, with and without the log: open (the backlog comes) or closed with a code.
SOCKETS = ("/ws/runs/{run_id}/", "/ws/runs/{run_id}/?log=")
SOCKET_ANSWER = {
    "owner": "open",
    "editor": "open",
    "viewer": "open",
    "outsider": 4403,
    "anonymous": 4401,
}


def expected(role: str, need: str, ok: int, api: bool) -> int:
    """Return the answer ``role`` gets from a route that needs ``need`` and answers ``ok``."""
    if need == PUBLIC:
        return ok
    if role == "anonymous":
        return 401 if api else 302
    if need == NONE:
        return 405
    if need == ANY:
        return ok
    if need == SELF:
        return ok if role == "owner" else 404
    if RANK[role] == 0:
        return 404
    return ok if RANK[role] >= NEED_RANK[need] else 403


def matrix_size() -> int:
    cells = sum(len(methods) for methods in ROUTES.values())
    return cells * len(ROLES) + len(SOCKETS) * len(ROLES)


def named_routes() -> dict[str, set[str]]:
    return {
        name: kwarg_names(chain)
        for name, chain in walk(get_resolver().url_patterns)
        if name is not None and not name.startswith("admin:")
    }


def test_every_route_is_in_the_table():
    assert set(named_routes()) == set(ROUTES)
    assert matrix_size() == 965  # the size docs/projects.md gives


@pytest.fixture
def members(django_user_model):
    return {
        "editor": django_user_model.objects.create_user("bob", password="bob-pass"),
        "viewer": django_user_model.objects.create_user("carol", password="carol-pass"),
        "outsider": django_user_model.objects.create_user("mallory", password="mallory-pass"),
    }


@pytest.fixture
def team_world(owner, members, studio_dirs):
    from webapp.projects.models import Project

    world = build_world(owner)
    project = Project.objects.get(pk=world["project_id"])
    member_add(project=project, by=owner, username="bob", role=Role.EDITOR)
    member_add(project=project, by=owner, username="carol", role=Role.VIEWER)
    upload = SimpleUploadedFile("spare.jsonl", b'{"prompt": "p", "ground_truth": "1"}\n')
    spare = dataset_create(owner=owner, name="spare", upload=upload)
    return {**world, "members": members, "owner": owner, "spare_dataset_id": spare.pk}


def ordered(names):
    return sorted(names, key=lambda n: (LAST.index(n) + 1) if n in LAST else 0)


@pytest.mark.parametrize("role", ROLES)
def test_role_matrix(team_world, role):
    """Every route and method answers ``role`` as the table says (see the module docstring)."""
    world = team_world
    user = world["owner"] if role == "owner" else world["members"].get(role)
    routes = named_routes()
    before = snapshot()
    client = Client()
    wrong, checked = [], 0
    for name in ordered(routes):
        kwargs = {k: world[k] for k in routes[name]}
        if name in EXTERNAL:
            kwargs["run_id"] = world["external_run_id"]
        kwargs.update({k: world[v] for k, v in OVERRIDES.get(name, {}).items()})
        url = reverse(name, kwargs=kwargs) + QUERIES.get(name, "").format(**world)
        api = url.startswith("/api/")
        for method, (need, ok) in ROUTES[name].items():
            client.logout()
            if user is not None:
                client.force_login(user)
            body = {"data": "{}", "content_type": "application/json"} if api else {}
            response = getattr(client, method)(url, **(body if method != "get" else {}))
            want = expected(role, need, ok, api)
            if response.status_code != want:
                wrong.append(f"{method.upper()} {url} ({name}): {response.status_code}, not {want}")
            if want == 302 and role == "anonymous" and need != PUBLIC:
                assert response["Location"].startswith("/accounts/login/"), name
            if role in ("outsider", "anonymous") and name != "projects:shared":
                content = b"" if response.streaming else response.content
                assert SECRET.encode() not in content, f"{method} {url} shows the owner's data"
            checked += 1
    assert not wrong, "\n".join(wrong)
    assert checked == sum(len(m) for m in ROUTES.values())
    if role in ("viewer", "outsider", "anonymous"):  # they changed nothing of the others'
        Experiment.objects.filter(owner=user).delete() if user else None  # a viewer's own clone
        assert snapshot() == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("private_redis_layer", "short_lived_connections")
async def test_role_matrix_sockets(owner, members):
    experiment = await database_sync_to_async(make_experiment)(owner, name=SECRET)
    run = await database_sync_to_async(run_create)(experiment=experiment)
    project = await database_sync_to_async(project_create)(owner=owner, name="team")
    await database_sync_to_async(experiment_move)(experiment=experiment, by=owner, project=project)
    for username, role in (("bob", Role.EDITOR), ("carol", Role.VIEWER)):
        await database_sync_to_async(member_add)(
            project=project, by=owner, username=username, role=role
        )
    users = {"owner": owner, **members, "anonymous": None}
    wrong = []
    for path in SOCKETS:
        for role in ROLES:
            socket = await open_socket(path.format(run_id=run.pk), users[role])
            first = await socket.receive_output(timeout=10)
            got = first["code"] if first["type"] == "websocket.close" else "open"
            if got != SOCKET_ANSWER[role]:
                wrong.append(f"{path} as {role}: {got}, not {SOCKET_ANSWER[role]}")
            await socket.disconnect()
    assert not wrong, "\n".join(wrong)
