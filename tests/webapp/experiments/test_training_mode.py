"""The builder's training mode: each mode's verl keys, and the engine's words on a bad setting."""

from __future__ import annotations

import pytest
from django.urls import reverse

from engine.config import ConfigValidationError, config_to_dict, get_value, load_config, set_value
from tests.webapp.fixtures import builder_data, tiny_config
from webapp.experiments.configs import config_check
from webapp.experiments.forms import ExperimentForm, field_name
from webapp.experiments.models import Experiment
from webapp.experiments.modes import (
    FULLY_ASYNC,
    FULLY_ASYNC_KEYS,
    HYBRID_ENGINE,
    ONE_STEP_OFF,
    PARTIAL_ROLLOUT,
    STALENESS_KEYS,
    SYNC,
    VERL_STALENESS_DEFAULTS,
    training_mode_of,
    training_mode_values,
)

THRESHOLD, SYNC_STEP, BATCHES = (field_name(key) for key in STALENESS_KEYS)
PARTIAL = field_name(PARTIAL_ROLLOUT)


def test_each_mode_writes_hybrid_engine_and_only_fully_async_its_panels_keys():
    typed = {
        STALENESS_KEYS[0]: "0.5",
        STALENESS_KEYS[1]: "",
        STALENESS_KEYS[2]: "2",
        PARTIAL_ROLLOUT: "true",
    }
    none = dict.fromkeys(FULLY_ASYNC_KEYS)
    assert training_mode_values(SYNC, typed) == {HYBRID_ENGINE: True, **none}
    assert training_mode_values(ONE_STEP_OFF, typed) == {HYBRID_ENGINE: False, **none}
    assert training_mode_values(FULLY_ASYNC, typed) == {HYBRID_ENGINE: False, **typed}
    # Every staleness box empty: verl's fully_async_ppo_trainer.yaml values, so the mode stays
    # selected (partial rollout does not select it, so it does not count).
    empty = {**dict.fromkeys(STALENESS_KEYS, ""), PARTIAL_ROLLOUT: "true"}
    assert training_mode_values(FULLY_ASYNC, empty) == {
        HYBRID_ENGINE: False,
        **VERL_STALENESS_DEFAULTS,
        PARTIAL_ROLLOUT: "true",
    }


def test_the_mode_of_a_config_is_the_trainer_the_engine_picks():
    assert training_mode_of(tiny_config()) == SYNC
    assert training_mode_of(load_config("grpo_tiny_one_step_off")) == ONE_STEP_OFF
    config = load_config("grpo_tiny_one_step_off")
    set_value(config, STALENESS_KEYS[1], 2)
    assert training_mode_of(config) == FULLY_ASYNC


@pytest.mark.django_db
@pytest.mark.parametrize("mode", [SYNC, ONE_STEP_OFF])
def test_picking_a_mode_in_the_form_writes_hybrid_engine(owner, mode):
    # The staleness boxes are read in the fully-async mode only: typed here, they are left out.
    data = builder_data(
        tiny_config(), owner, training_mode=mode, **{THRESHOLD: "0.5", PARTIAL: "true"}
    )
    form = ExperimentForm(data, owner=owner)
    form.is_valid()
    assert form.config is not None
    assert get_value(form.config, HYBRID_ENGINE) is (mode == SYNC)
    assert all(get_value(form.config, key) is None for key in FULLY_ASYNC_KEYS)


@pytest.mark.django_db
def test_the_one_step_off_preset_opens_in_its_mode_and_survives_the_round_trip(owner):
    config = load_config("grpo_tiny_one_step_off")
    data = builder_data(config, owner, preset="grpo_tiny_one_step_off")
    assert data["training_mode"] == ONE_STEP_OFF
    form = ExperimentForm(data, owner=owner)
    assert form.is_valid(), form.errors
    assert config_to_dict(form.config) == config_to_dict(config)


def _expected_errors(owner, config):
    try:
        config_check(owner=owner, config=config)
    except ConfigValidationError as exc:
        return {field_name(e.key): [e.message] for e in exc.errors}
    return {}


@pytest.mark.django_db
@pytest.mark.parametrize("threshold", ["0.5", "-1"])
def test_fully_async_in_the_form_is_judged_by_the_engines_validator(owner, threshold):
    data = builder_data(
        load_config("grpo_tiny_one_step_off"),
        owner,
        training_mode=FULLY_ASYNC,
        **{THRESHOLD: threshold, SYNC_STEP: "2"},
    )
    form = ExperimentForm(data, owner=owner)
    form.is_valid()
    expected = load_config("grpo_tiny_one_step_off")
    set_value(expected, STALENESS_KEYS[0], threshold)
    set_value(expected, STALENESS_KEYS[1], 2)
    assert config_to_dict(form.config) == config_to_dict(expected)
    errors = _expected_errors(owner, expected)
    assert dict(form.errors) == errors
    if float(threshold) < 0:  # a bad value is refused on its own box, in the engine's words
        assert THRESHOLD in form.errors


@pytest.mark.django_db
def test_the_builder_page_offers_the_modes_and_hides_the_staleness_boxes_until_picked(
    client_in,
):
    page = client_in.get(reverse("experiments:new") + "?preset=grpo_tiny_one_step_off")
    html = page.content.decode()
    assert 'name="training_mode" value="one_step_off"' in html
    assert 'value="one_step_off" required' not in html
    checked = page.context["form"]["training_mode"].value()
    assert checked == ONE_STEP_OFF
    assert '<div id="staleness-settings" data-shown-for="fully_async" hidden>' in html
    panel = html[html.index('id="staleness-settings"') :]
    panel = panel[: panel.index("</fieldset>")]
    for name in (THRESHOLD, SYNC_STEP, BATCHES, PARTIAL):
        assert f'name="{name}"' in panel
        assert html.count(f'name="{name}"') == 1  # not again among the advanced settings
    assert 'placeholder="verl: 0.1"' in html
    # Nothing else in the form sets hybrid_engine: the radio buttons are its one control.
    assert 'name="actor_rollout_ref__hybrid_engine"' not in html


@pytest.mark.django_db
def test_a_refused_staleness_setting_is_named_by_its_key_at_the_top_and_creates_nothing(
    client_in, owner
):
    data = builder_data(
        load_config("grpo_tiny_one_step_off"),
        owner,
        training_mode=FULLY_ASYNC,
        **{THRESHOLD: "-1"},
    )
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400 and not Experiment.objects.exists()
    form = response.context["form"]
    [(anchor, what, message)] = [row for row in form.error_summary() if row[0] == f"id_{THRESHOLD}"]
    assert what == STALENESS_KEYS[0] and message == form.errors[THRESHOLD][0]


@pytest.mark.django_db
def test_partial_rollout_in_the_fully_async_panel_round_trips_and_the_engine_judges_it(owner):
    # hf and vllm single-turn honour it; multi-turn is refused on the box with the engine's
    # reason.
    config = load_config("grpo_tiny_one_step_off")
    set_value(config, STALENESS_KEYS[1], 2)
    set_value(config, PARTIAL_ROLLOUT, True)
    data = builder_data(config, owner, preset="grpo_tiny_one_step_off")
    assert data["training_mode"] == FULLY_ASYNC and data[PARTIAL] == "true"
    form = ExperimentForm(data, owner=owner)
    assert form.is_valid(), form.errors
    assert config_to_dict(form.config) == config_to_dict(config)

    set_value(config, "actor_rollout_ref.rollout.name", "vllm")
    form = ExperimentForm(builder_data(config, owner, preset="grpo_tiny_one_step_off"), owner=owner)
    form.is_valid()
    assert PARTIAL not in form.errors

    set_value(config, "actor_rollout_ref.rollout.multi_turn.enable", True)
    form = ExperimentForm(builder_data(config, owner, preset="grpo_tiny_one_step_off"), owner=owner)
    assert not form.is_valid()
    assert dict(form.errors).get(PARTIAL) == _expected_errors(owner, config)[PARTIAL]
    assert "multi_turn" in form.errors[PARTIAL][0]
