"""The Python client against a live Daphne and a real Celery worker: create, launch, wait,
metrics as a DataFrame, samples, cancel, and the server's field errors as ``StudioError``."""

from __future__ import annotations

from functools import partial

import pytest
from channels.testing.live import make_application, set_database_connection

from engine.config import config_to_dict
from posttrain_client import Studio, StudioError
from tests.e2e.browser import ForkedDaphneProcess
from tests.webapp.api.helpers import token_of
from tests.webapp.fixtures import tiny_config
from tests.workers.test_lifecycle import SMALL, start_worker, tiny_cache  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def live_url(studio_dirs, settings):  # noqa: F811
    """Serve the studio from a forked Daphne that sees this test's settings and database."""
    server = ForkedDaphneProcess(
        "127.0.0.1", partial(make_application, static_wrapper=None), setup=set_database_connection
    )
    server.start()
    while not server.ready.wait(timeout=1):
        assert server.is_alive(), "the live server stopped"
    yield f"http://127.0.0.1:{server.port.value}"
    server.terminate()
    server.join()


def test_a_tiny_run_launched_from_the_client_succeeds_with_metrics_and_samples(
    start_worker,  # noqa: F811  (first: the live server forks with the worker's queue set)
    live_url,
    owner,
):
    config = config_to_dict(
        tiny_config(**SMALL, trainer__total_training_steps=2, trainer__val_before_train=False,
                    trainer__test_freq=-1)
    )  # fmt: skip
    with Studio(live_url, token_of(owner)) as studio:
        experiment = studio.experiments.create(config, name="from the client", tags="client")
        assert experiment.name == "from the client" and experiment.tags == ["client"]
        run = experiment.launch()
        assert run.status == "queued"
        start_worker()
        run.wait(timeout=300, poll=0.5)
        assert run.status == "succeeded", run.error
        metrics = run.metrics()
        assert list(metrics.index) == [1, 2] and "critic/score/mean" in metrics.columns
        samples = run.samples(step=1)
        assert len(samples) == 8 * 4 and {s["step"] for s in samples} == {1}
        series = run.metric_series("critic/score/mean")
        assert series["critic/score/mean"]["step"] == [1, 2]
        assert [r.id for r in studio.runs.list(status="succeeded")] == [run.id]


def test_errors_carry_the_servers_field_messages_and_a_queued_run_cancels(live_url, owner):
    with Studio(live_url, token_of(owner)) as studio:
        config = config_to_dict(tiny_config())
        config["data"]["train_batch_size"] = 0
        with pytest.raises(StudioError) as caught:
            studio.experiments.create(config, name="bad")
        assert caught.value.status == 400
        assert "data.train_batch_size" in caught.value.field_errors
        experiment = studio.experiments.create(config_to_dict(tiny_config()), name="ok")
        run = experiment.launch()
        assert run.cancel().status == "cancelled"
        assert run.wait(timeout=5).status == "cancelled"
        with pytest.raises(StudioError) as missing:
            studio.runs.get(run.id + 1000)
        assert missing.value.status == 404
    with pytest.raises(StudioError) as refused, Studio(live_url, "pts_wrong") as stranger:
        stranger.experiments.list()
    assert refused.value.status == 401
