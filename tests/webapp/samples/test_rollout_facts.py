"""An asynchronous rollout's facts in the inspector: policy version, staleness and IS weight."""

from __future__ import annotations

import pytest

from engine.trainer.samples import IS_WEIGHT, LAST_POLICY_VERSION, POLICY_VERSION
from tests.webapp.samples.conftest import finished_run, records
from tests.webapp.samples.test_views import url
from webapp.runs.driver_writes import samples_write

pytestmark = pytest.mark.django_db


def test_each_samples_policy_version_staleness_and_is_weight_show_in_both_views(client_in, owner):
    run = finished_run(owner)
    stale = records(4, 0, [1.0, 0.0])
    stale[0].reward_parts = {"correct": 1.0, POLICY_VERSION: 2, IS_WEIGHT: 0.875}
    stale[1].reward_parts = {"correct": 0.0, POLICY_VERSION: 3, IS_WEIGHT: None}
    resumed = records(4, 1, [1.0])
    resumed[0].reward_parts = {"correct": 1.0, POLICY_VERSION: 1, LAST_POLICY_VERSION: 3}
    samples_write(run_id=run.pk, samples=resumed)
    samples_write(run_id=run.pk, samples=stale)
    for page in (
        client_in.get(url("group", run, step=4, prompt=0)).content.decode(),
        client_in.get(url("step", run, step=4)).content.decode(),
    ):
        # Step 4 trains after 3 updates: version 2 is one update stale, version 3 is fresh.
        assert "policy <b>v2</b>" in page and "stale <b>1</b>" in page
        assert "policy <b>v3</b>" in page and "stale <b>0</b>" in page
        assert "IS weight <b>0.875</b>" in page and "IS weight <b>—</b>" in page
        assert "correct <b>1</b>" in page
        # Shown as the rollout's facts, not among the reward's parts.
        assert POLICY_VERSION not in page and IS_WEIGHT not in page
    # A partial rollout's sample (prompt 1, on the step's page): begun by version 1, finished
    # by version 3, as stale as its first token.
    page = client_in.get(url("step", run, step=4)).content.decode()
    assert "policy <b>v1→v3</b>" in page and "stale <b>2</b>" in page
    assert LAST_POLICY_VERSION not in page


def test_a_synchronous_sample_shows_no_rollout_facts(client_in, owner):
    run = finished_run(owner)
    samples_write(run_id=run.pk, samples=records(1, 0, [1.0, 0.0]))
    page = client_in.get(url("step", run, step=1)).content.decode()
    assert "correct <b>1</b>" in page
    assert "policy <b>" not in page and "IS weight" not in page
