"""The studio's pages read an external run as any run: the runs table, compare, the config diff
of two verl YAMLs, the experiment page (which offers no launch), and the live socket's backlog."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator

from tests.webapp.live import short_lived_connections  # noqa: F401
from webapp.asgi import application
from webapp.external.services import StepIn, external_run_create, external_steps_append

pytestmark = pytest.mark.django_db

BASE = {
    "algorithm": {"adv_estimator": "grpo", "kl_ctrl": {"kl_coef": 0.001}},
    "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}, "rollout": {"n": 16}},
    "trainer": {"experiment_name": "qwen-grpo", "default_local_dir": "/ckpt/a"},
}


def verl_run(owner, key: str, lr: float, **extra):
    config = {**BASE, "actor_rollout_ref": {"actor": {"optim": {"lr": lr}}, "rollout": {"n": 16}}}
    config.update(extra)
    run, _ = external_run_create(
        owner=owner, key=key, name="qwen-grpo", source="verl", config=config, location="gpu-07"
    )
    external_steps_append(
        run=run, steps=[StepIn(s, {"critic/score/mean": s * lr * 1e5}) for s in (1, 2, 3)]
    )
    return run


def test_the_diff_of_two_verl_configs_lists_what_differs(client_in, owner):
    left = verl_run(owner, "a" * 16, 1e-6)
    right = verl_run(owner, "b" * 16, 3e-6, reward={"style": "rule"})
    page = client_in.get(f"/runs/{left.pk}/diff/{right.pk}/")
    assert page.status_code == 200
    rows = {(r.key, r.left, r.right) for r in page.context["rows"]}
    assert rows == {
        ("actor_rollout_ref.actor.optim.lr", 1e-6, 3e-6),
        ("reward.style", None, "rule"),
    }


def test_the_runs_table_compare_and_experiment_pages_show_external_runs(client_in, owner):
    first = verl_run(owner, "a" * 16, 1e-6)
    second = verl_run(owner, "b" * 16, 2e-6)
    table = client_in.get("/runs/", {"metric": "last:critic/score/mean"})
    assert table.status_code == 200
    shown = {row.run.pk: row for row, *_ in table.context["rows"]}
    assert set(shown) == {first.pk, second.pk}
    compare = client_in.get("/runs/compare/", {"run": [first.pk, second.pk]})
    assert [run.pk for run in compare.context["runs"]] == [first.pk, second.pk]
    experiment = client_in.get(first.experiment.get_absolute_url()).content.decode()
    assert "Launch a run" not in experiment and "Clone into builder" not in experiment
    assert "runs reported from outside the studio" in experiment


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("private_redis_layer", "short_lived_connections")
async def test_the_live_socket_sends_an_external_runs_backlog(owner):
    from asgiref.sync import sync_to_async
    from django.test import Client

    run = await sync_to_async(verl_run)(owner, "c" * 16, 1e-6)
    client = Client()
    await sync_to_async(client.force_login)(owner)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    communicator = WebsocketCommunicator(
        application,
        f"/ws/runs/{run.pk}/",
        headers=[(b"cookie", cookie), (b"origin", b"http://testserver"), (b"host", b"testserver")],
    )
    connected, _ = await communicator.connect()
    assert connected
    message = await communicator.receive_json_from(timeout=10)
    while message["type"] == "backlog" and not message.get("complete"):
        message = await communicator.receive_json_from(timeout=10)
    assert message["run"]["status"] == "running" and message["run"]["can_cancel"] is False
    assert message["last_step"] == 3
    await communicator.disconnect()
