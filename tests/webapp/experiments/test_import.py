"""Import in the dialects verl users write: YAML sections, dotted YAML keys, key=value lines."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.fixtures import builder_data, tiny_config

pytestmark = pytest.mark.django_db

URL = "experiments:import"


def test_key_value_lines_apply_to_the_preset_open_in_the_builder(client_in, owner):
    text = "# from my script\nalgorithm.adv_estimator=rloo\n+data.train_batch_size=8\n"
    data = builder_data(tiny_config(), owner, yaml_text=text)
    response = client_in.post(reverse(URL), data)
    assert response.status_code == 200, response.context["import_form"].errors
    initial = response.context["form"].initial
    assert initial["algorithm__adv_estimator"] == "rloo"
    assert initial["data__train_batch_size"] == "8"
    assert initial["actor_rollout_ref__model__path"] == "tiny://model"  # grpo_tiny's, kept


def test_a_verl_command_line_is_read_as_its_overrides(client_in, owner):
    text = (
        "python3 -m verl.trainer.main_ppo \\\n"
        "    algorithm.adv_estimator=grpo \\\n"
        "    actor_rollout_ref.rollout.n=4 \\\n"
        "    trainer.logger=['console'] $@\n"
    )
    response = client_in.post(reverse(URL), {"yaml_text": text})
    assert response.status_code == 200, response.context["import_form"].errors
    initial = response.context["form"].initial
    assert initial["actor_rollout_ref__rollout__n"] == "4"
    assert initial["trainer__logger"] == ["console"]


def test_dotted_keys_in_yaml_are_the_keys_they_spell(client_in):
    text = (
        "defaults: [grpo_tiny, _self_]\nalgorithm.adv_estimator: rloo\nalgorithm:\n  gamma: 0.5\n"
    )
    response = client_in.post(reverse(URL), {"yaml_text": text})
    assert response.status_code == 200, response.context["import_form"].errors
    initial = response.context["form"].initial
    assert (initial["algorithm__adv_estimator"], initial["algorithm__gamma"]) == ("rloo", "0.5")


def test_a_refused_import_keeps_the_builder_and_lists_each_bad_line(client_in, owner):
    data = builder_data(tiny_config(data__train_batch_size=16), owner, name="mine", yaml_text="x")
    data["yaml_text"] = "data.train_batch_size=16x\ntrainer.nope=1\n"
    response = client_in.post(reverse(URL), data)
    assert response.status_code == 400
    form = response.context["form"]
    assert form.initial["data__train_batch_size"] == "16"  # not verl's blank 1024
    assert form.initial["name"] == "mine"
    assert form.initial["actor_rollout_ref__model__path"] == "tiny://model"
    errors = response.context["import_form"].non_field_errors()
    assert len(errors) == 2
    assert errors[0].startswith("trainer.nope=1: unknown key; did you mean trainer.nnodes?")
    assert errors[1].startswith("data.train_batch_size='16x'")
    html = response.content.decode()
    assert 'value="16"' in html and "data.train_batch_size=&#x27;16x&#x27;" in html
