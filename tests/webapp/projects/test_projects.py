"""Projects: members and roles, moving experiments, share links, and sockets that close at once
when a right is taken away (the role matrix itself: ``tests/webapp/test_role_matrix.py``)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import reverse

from tests.webapp.fixtures import make_experiment
from tests.webapp.live import private_redis_layer, short_lived_connections  # noqa: F401
from tests.webapp.runs.test_consumers import open_socket
from webapp.alerts.models import AlertDelivery
from webapp.alerts.services import subscription_create
from webapp.projects.access import EDIT, OWN, VIEW, run_for, visible_runs
from webapp.projects.models import Membership, Role, RunShare
from webapp.projects.services import (
    ProjectError,
    experiment_move,
    member_add,
    member_remove,
    member_set_role,
    project_create,
    run_share,
    run_unshare,
)
from webapp.runs.driver_writes import run_claim_for_start, run_finish, run_mark_running
from webapp.runs.models import Run
from webapp.runs.services import run_create

pytestmark = pytest.mark.django_db


def test_only_the_owner_changes_members_and_names_are_checked(owner, team, other_user):
    project, bob = team["project"], team["bob"]
    with pytest.raises(PermissionDenied):
        member_add(project=project, by=bob, username="mallory", role=Role.EDITOR)
    with pytest.raises(PermissionDenied):
        member_remove(project=project, by=bob, user_id=team["carol"].pk)
    with pytest.raises(ProjectError, match="no active user is named 'nobody'"):
        member_add(project=project, by=owner, username="nobody", role=Role.VIEWER)
    with pytest.raises(ProjectError, match="is a member already"):
        member_add(project=project, by=owner, username="bob", role=Role.VIEWER)
    with pytest.raises(ProjectError, match="'admin' is not a role"):
        member_add(project=project, by=owner, username="mallory", role="admin")
    with pytest.raises(ProjectError, match="already have a project named"):
        project_create(owner=owner, name="rl team")
    member_set_role(project=project, by=owner, user_id=bob.pk, role=Role.VIEWER)
    assert Membership.objects.get(user=bob).role == Role.VIEWER


def test_an_editor_launches_on_their_own_quota_and_a_viewer_only_reads(owner, team, settings):
    experiment, bob, carol = team["experiment"], team["bob"], team["carol"]
    run = run_create(experiment=experiment, launcher=bob)
    assert run.owner == bob  # the launching member's quotas count it
    client = Client()
    client.force_login(carol)
    launch = reverse("experiments:launch", kwargs={"experiment_id": experiment.pk})
    assert client.post(launch).status_code == 403
    page = client.get(reverse("runs:detail", kwargs={"run_id": run.pk})).content.decode()
    assert 'data-field="cancel" data-denied' in page and 'name="notes"' not in page
    assert "Launch a run" not in client.get(experiment.get_absolute_url()).content.decode()
    assert client.post(reverse("runs:cancel", kwargs={"run_id": run.pk})).status_code == 403
    client.force_login(bob)
    assert client.post(launch).status_code == 302
    assert Run.objects.filter(experiment=experiment, owner=bob).count() == 2
    # An editor cancels a member's run, but deletes only what it owns.
    assert run_for(bob, run.pk, EDIT) == run
    first = run_create(experiment=experiment)
    with pytest.raises(PermissionDenied):
        run_for(bob, first.pk, OWN)
    assert run_for(owner, run.pk, OWN) == run  # the project's owner owns every run of it


def test_moving_an_experiment_needs_its_owner_and_an_editor_of_the_project(owner, team):
    bob, carol = team["bob"], team["carol"]
    bobs = make_experiment(bob, name="bob's own")
    carols = make_experiment(carol, name="carol's own")
    experiment_move(experiment=bobs, by=bob, project=team["project"])
    assert visible_runs(carol).count() == 0 and bobs in team["project"].experiments.all()
    with pytest.raises(PermissionDenied, match="editor"):
        experiment_move(experiment=carols, by=carol, project=team["project"])
    with pytest.raises(PermissionDenied, match="owner"):
        experiment_move(experiment=team["experiment"], by=bob, project=None)
    with pytest.raises(PermissionDenied, match="owner"):  # the project's owner neither
        experiment_move(experiment=bobs, by=owner, project=None)
    client = Client()
    client.force_login(owner)
    move = reverse("projects:move", kwargs={"experiment_id": team["experiment"].pk})
    assert client.post(move, {"project_id": ""}).status_code == 302
    team["experiment"].refresh_from_db()
    assert team["experiment"].project is None


def test_the_project_pages_list_members_and_add_one(owner, team, other_user):
    client = Client()
    client.force_login(owner)
    page = client.get(team["project"].get_absolute_url()).content.decode()
    assert 'data-member="bob"' in page and "shared grpo" in page
    add = reverse("projects:member-add", kwargs={"project_id": team["project"].pk})
    assert client.post(add, {"username": "mallory", "role": "viewer"}).status_code == 302
    assert Membership.objects.filter(user=other_user, role="viewer").exists()
    client.force_login(other_user)
    assert "rl team" in client.get(reverse("projects:list")).content.decode()
    assert client.post(add, {"username": "x", "role": "viewer"}).status_code == 403


def test_a_member_subscribes_to_the_projects_runs(owner, team):
    carol = team["carol"]
    carol.email = "carol@example.org"
    carol.save()
    subscription_create(owner=carol, scope="project", project=team["project"], channel="email")
    run = run_create(experiment=team["experiment"])
    run_claim_for_start(run_id=run.pk)
    run_mark_running(run_id=run.pk)
    run_finish(run_id=run.pk, status="succeeded")
    delivery = AlertDelivery.objects.get()
    assert (delivery.owner, delivery.run) == (carol, run)
    # Removed from the project, she hears of its runs no more.
    member_remove(project=team["project"], by=owner, user_id=carol.pk)
    second = run_create(experiment=team["experiment"])
    run_claim_for_start(run_id=second.pk)
    run_mark_running(run_id=second.pk)
    run_finish(run_id=second.pk, status="succeeded")
    assert AlertDelivery.objects.count() == 1


def test_a_share_link_lets_the_servers_users_read_until_revoked(owner, other_user):
    run = run_create(experiment=make_experiment(owner, name="alice-secret"))
    client = Client()
    client.force_login(other_user)
    detail = reverse("runs:detail", kwargs={"run_id": run.pk})
    assert client.get(detail).status_code == 404
    with pytest.raises(PermissionDenied):
        run_share(run=run, by=other_user)
    client.force_login(owner)
    assert client.post(reverse("projects:share", kwargs={"run_id": run.pk})).status_code == 302
    link = RunShare.objects.get(run=run).get_absolute_url()
    assert Client().get(link).status_code == 302  # anonymous: to the log-in page
    client.force_login(other_user)
    response = client.get(link)
    assert response.status_code == 302 and response["Location"] == detail
    assert "alice-secret" in client.get(detail).content.decode()
    assert client.get(f"/api/runs/{run.pk}").status_code == 200
    assert client.get(reverse("runs:log", kwargs={"run_id": run.pk})).status_code in (200, 404)
    assert client.post(reverse("runs:cancel", kwargs={"run_id": run.pk})).status_code == 403
    assert client.post(reverse("projects:unshare", kwargs={"run_id": run.pk})).status_code == 403
    run_unshare(run=run, by=owner)
    assert client.get(detail).status_code == 404
    assert client.get(link).status_code == 404  # the link itself is gone
    assert run_for(owner, run.pk, VIEW) == run


async def _next_close(socket) -> int | None:
    """Return the close code once it comes, skipping the data messages before it."""
    while True:
        message = await socket.receive_output(timeout=10)
        if message["type"] == "websocket.close":
            return message["code"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("private_redis_layer", "short_lived_connections")
async def test_a_removed_member_loses_its_open_sockets_at_once(owner, django_user_model):
    create = database_sync_to_async(django_user_model.objects.create_user)
    bob, carol = await create("bob", password="b"), await create("carol", password="c")
    project = await database_sync_to_async(project_create)(owner=owner, name="team")
    for name, role in (("bob", Role.EDITOR), ("carol", Role.VIEWER)):
        await database_sync_to_async(member_add)(
            project=project, by=owner, username=name, role=role
        )
    experiment = await database_sync_to_async(make_experiment)(owner, name="shared")
    await database_sync_to_async(experiment_move)(experiment=experiment, by=owner, project=project)
    run = await database_sync_to_async(run_create)(experiment=experiment)
    carols = await open_socket(f"/ws/runs/{run.pk}/?log=", carol)
    bobs = await open_socket(f"/ws/runs/{run.pk}/", bob)
    for socket in (carols, bobs):
        assert (await socket.receive_json_from(timeout=10))["type"] == "backlog"
    await database_sync_to_async(member_remove)(project=project, by=owner, user_id=carol.pk)
    assert await _next_close(carols) == 4403
    assert await bobs.receive_nothing(timeout=1)  # the members who stay keep theirs
    # Her new socket is refused as an outsider's; the editor's stays until the run leaves.
    again = await open_socket(f"/ws/runs/{run.pk}/", carol)
    assert await again.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}
    await database_sync_to_async(experiment_move)(experiment=experiment, by=owner, project=None)
    assert await _next_close(bobs) == 4403
    for socket in (carols, bobs, again):
        await socket.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("private_redis_layer", "short_lived_connections")
async def test_a_revoked_share_link_closes_the_sockets_opened_through_it(owner, other_user):
    from webapp.projects.services import run_share_open

    experiment = await database_sync_to_async(make_experiment)(owner, name="shared")
    run = await database_sync_to_async(run_create)(experiment=experiment)
    share = await database_sync_to_async(run_share)(run=run, by=owner)
    await database_sync_to_async(run_share_open)(token=share.token, user=other_user)
    reader = await open_socket(f"/ws/runs/{run.pk}/", other_user)
    mine = await open_socket(f"/ws/runs/{run.pk}/", owner)
    for socket in (reader, mine):
        assert (await socket.receive_json_from(timeout=10))["type"] == "backlog"
    await database_sync_to_async(run_unshare)(run=run, by=owner)
    assert await _next_close(reader) == 4403
    assert await mine.receive_nothing(timeout=1)
    for socket in (reader, mine):
        await socket.disconnect()
