"""The status table every lifecycle function moves a run through, against a real PostgreSQL."""

from __future__ import annotations

import pytest

from engine.trainer.reporting import RunOutcome
from tests.webapp.fixtures import make_run
from webapp.runs.driver_writes import ALLOWED_TRANSITIONS, transition
from webapp.runs.models import RunStatus

pytestmark = pytest.mark.django_db

ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


def test_every_status_has_its_row_and_an_ended_run_moves_nowhere():
    assert set(ALLOWED_TRANSITIONS) == set(RunStatus.values)
    for status in ENDED:
        assert ALLOWED_TRANSITIONS[status] == frozenset()
    assert RunStatus.QUEUED not in set().union(*ALLOWED_TRANSITIONS.values())  # never back


def test_the_engine_ends_a_run_in_statuses_the_studio_stores():
    assert {s.value for s in RunOutcome} == {s.value for s in ENDED}


def test_a_change_the_table_does_not_list_is_refused(owner):
    run = make_run(owner, RunStatus.SUCCEEDED)
    with pytest.raises(ValueError, match="does not move from succeeded to running"):
        transition(run.pk, [RunStatus.SUCCEEDED], RunStatus.RUNNING)
    with pytest.raises(ValueError, match="does not move from queued to lost"):
        transition(run.pk, [RunStatus.QUEUED], RunStatus.LOST)


def test_a_run_moves_only_from_the_statuses_named(owner):
    run = make_run(owner, RunStatus.RUNNING)
    assert not transition(run.pk, [RunStatus.QUEUED], RunStatus.CANCELLED)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    assert transition(run.pk, [RunStatus.RUNNING], RunStatus.LOST, error="no heartbeat")
    assert transition(run.pk, [RunStatus.LOST], RunStatus.SUCCEEDED, error="")  # a slow driver
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert not transition(run.pk, [RunStatus.RUNNING], RunStatus.FAILED)


def test_the_sample_field_lists_are_the_model_and_the_engine_record():
    from engine.trainer.reporting import SampleRecord
    from webapp.runs.driver_writes import SAMPLE_COLUMNS, SAMPLE_TYPES
    from webapp.runs.models import SAMPLE_FIELDS, SAMPLE_TOKEN_FIELDS, Sample
    from webapp.samples.selectors import EXPORT_FIELDS, TOKEN_FIELDS

    model_fields = {f.name for f in Sample._meta.concrete_fields} - {"id"}
    assert set(SAMPLE_COLUMNS) == model_fields and len(SAMPLE_COLUMNS) == len(SAMPLE_TYPES)
    assert list(SAMPLE_FIELDS) == list(SampleRecord.__dataclass_fields__)
    assert set(EXPORT_FIELDS) | set(TOKEN_FIELDS) == {"run_id", *SAMPLE_FIELDS}
    assert TOKEN_FIELDS == SAMPLE_TOKEN_FIELDS
