"""The builder form and pages: generated from the schema, engine errors next to the fields."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils.html import escape

from engine.config import (
    ConfigValidationError,
    config_to_dict,
    iter_field_specs,
    load_config,
    validate_config,
)
from engine.config.fields import HONOURED
from tests.webapp.fixtures import builder_data, tiny_config
from webapp.experiments.configs import (
    STUDIO_MANAGED_KEYS,
    config_check,
    list_presets,
    preset_dir,
)
from webapp.experiments.forms import ExperimentForm, field_name
from webapp.experiments.models import Experiment
from webapp.experiments.modes import STALENESS_KEYS
from webapp.experiments.rewards import list_reward_functions, unreadable_reward_modules
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db


def test_every_honoured_schema_field_but_the_studio_managed_ones_is_in_the_form(owner):
    form = ExperimentForm(owner=owner)
    keys = {spec.key for spec in iter_field_specs() if spec.effect == HONOURED}
    shown = {k for k in keys if field_name(k) in form.fields}
    assert keys - shown == {
        *(k for k in STUDIO_MANAGED_KEYS if k in keys),
        "custom_reward_function.path",
        "custom_reward_function.name",
        "reward.components",
        "data.file_key_maps",  # from the datasets picked (attach_dataset_maps)
        "data.file_data_sources",
        "actor_rollout_ref.hybrid_engine",  # the training mode's radio buttons
    }
    # Keys with no effect here, or refused, stay at their defaults: the form does not show them
    # (the training mode's staleness boxes excepted: the engine judges them in that mode).
    others = {spec.key for spec in iter_field_specs() if spec.effect != HONOURED}
    others -= set(STALENESS_KEYS)
    assert others and not any(field_name(k) in form.fields for k in others)
    spec = next(s for s in iter_field_specs() if s.key == "algorithm.adv_estimator")
    field = form.fields["algorithm__adv_estimator"]
    assert [c for c, _ in field.choices] == spec.choices and field.help_text == spec.help
    assert not spec.advanced
    assert any(s.advanced for s in form.specs) and any(not s.advanced for s in form.specs)


def test_number_inputs_have_the_schemas_bounds_as_min_and_max(owner):
    form = ExperimentForm(owner=owner)
    batch = str(form["data__train_batch_size"])
    assert 'inputmode="decimal"' in batch and 'min="1"' in batch and 'max="1048576"' in batch
    top_p = str(form["actor_rollout_ref__rollout__top_p"])
    assert 'min="0"' in top_p and 'max="1"' in top_p
    assert "min=" not in str(form["trainer__seed"])


def test_every_preset_is_offered_with_a_label():
    presets = dict(list_presets())
    algorithm_presets = {"grpo_tiny_otb", "grpo_tiny_calculator", "grpo_tiny_rm"}
    assert algorithm_presets | {"grpo_tiny_rollout_corr", "dapo_tiny"} <= presets.keys()
    assert presets.keys() == {p.stem for p in preset_dir().glob("*.yaml")}
    assert [name for name, label in presets.items() if label == name] == []


@pytest.mark.parametrize("preset", [name for name, _ in list_presets()])
def test_a_preset_survives_the_round_trip_through_the_form(owner, preset):
    config = load_config(preset)
    form = ExperimentForm(builder_data(config, owner, preset=preset), owner=owner)
    form.is_valid()
    assert config_to_dict(form.config) == config_to_dict(config)
    # The form reports what the engine and the studio report (grpo_gsm8k reads from ~/data and
    # ~/models, which are no model roots here).
    try:
        config_check(owner=owner, config=config)
        expected = {}
    except ConfigValidationError as exc:
        expected = {field_name(e.key): [e.message] for e in exc.errors}
    assert dict(form.errors) == expected


def test_bad_values_show_the_engines_words_next_to_their_fields_and_create_nothing(
    client_in, owner
):
    data = builder_data(
        tiny_config(),
        owner,
        actor_rollout_ref__rollout__n="1",
        trainer__save_freq="0",
        data__max_prompt_length="sixteen",
    )
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    form = response.context["form"]
    expected = tiny_config(actor_rollout_ref__rollout__n=1, trainer__save_freq=0)
    with pytest.raises(ConfigValidationError) as engine:
        validate_config(expected)
    for error in engine.value.errors:
        assert form.errors[field_name(error.key)] == [error.message]
    assert form.errors["data__max_prompt_length"] == ["expected int, got str"]
    for error in engine.value.errors:  # as the page writes them, > as &gt;
        assert escape(error.message) in response.content.decode()
    assert not Experiment.objects.exists() and not Run.objects.exists()


def test_a_valid_form_creates_the_experiment_and_queues_a_run(
    client_in, owner, django_capture_on_commit_callbacks
):
    data = builder_data(
        tiny_config(), owner, name="my grpo", tags="a, b", trainer__total_training_steps="3"
    )
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client_in.post(reverse("experiments:new"), data)
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == run.get_absolute_url()
    assert run.experiment.name == "my grpo" and run.experiment.tags == ["a", "b"]
    assert run.config["trainer"]["total_training_steps"] == 3
    assert len(callbacks) == 2  # start_run on commit, and the queued status event


def test_rewards_are_built_ins_with_weights_or_an_installed_function(owner, studio_dirs):
    functions = list_reward_functions()
    assert [(f.module, f.name, f.doc) for f in functions] == [
        ("house_rewards.py", "length_penalty", "Reward short answers.")
    ]
    data = builder_data(
        tiny_config(),
        owner,
        reward_weight__tiny_arithmetic="0.75",
        reward_weight__format="0.25",
        reward_kwargs__format="{pattern: '^\\d+$'}",
        custom_reward="house_rewards.py:length_penalty",
        reward_weight__custom="0.5",
    )
    form = ExperimentForm(data, owner=owner)
    assert form.is_valid(), form.errors
    components = [(c.name, c.weight, c.kwargs) for c in form.config.reward.components]
    assert sorted(components) == [
        ("custom", 0.5, {}),
        ("format", 0.25, {"pattern": "^\\d+$"}),
        ("tiny_arithmetic", 0.75, {}),
    ]
    assert form.config.custom_reward_function.path == str(
        studio_dirs / "rewards" / "house_rewards.py"
    )
    assert form.config.custom_reward_function.name == "length_penalty"
    again = ExperimentForm.initial_from_config(form.config, owner)
    assert again["custom_reward"] == "house_rewards.py:length_penalty"
    assert again["reward_weight__format"] == "0.25"
    bad = ExperimentForm({**data, "custom_reward": "../../etc/passwd:x"}, owner=owner)
    assert not bad.is_valid() and "custom_reward" in bad.errors


REWARD_MODEL_ON = {
    "reward_model__enable": True,
    "reward_model__model__path": "tiny://reward_model",
    "reward_model__micro_batch_size_per_gpu": 64,
}


@pytest.mark.parametrize(
    "names", [("reward_model", "tiny_arithmetic"), ("tiny_arithmetic", "reward_model")]
)
def test_a_reward_model_component_survives_the_round_trip_in_its_order(owner, names):
    components = [{"name": name, "weight": 0.5, "kwargs": {}} for name in names]
    config = tiny_config(**REWARD_MODEL_ON, reward__components=components)
    data = builder_data(config, owner)
    assert data["reward_weight__reward_model"] == data["reward_weight__tiny_arithmetic"] == "0.5"
    form = ExperimentForm(data, owner=owner)
    assert form.is_valid(), form.errors
    assert [c.name for c in form.config.reward.components] == list(names)
    assert config_to_dict(form.config) == config_to_dict(config)


def test_a_custom_component_survives_the_round_trip(owner, studio_dirs):
    config = tiny_config(
        custom_reward_function__path=str(studio_dirs / "rewards" / "house_rewards.py"),
        custom_reward_function__name="length_penalty",
        reward__components=[
            {"name": "custom", "weight": 0.25, "kwargs": {}},
            {"name": "format", "weight": 0.75, "kwargs": {"pattern": "^\\d+$"}},
        ],
    )
    form = ExperimentForm(builder_data(config, owner), owner=owner)
    assert form.is_valid(), form.errors
    assert config_to_dict(form.config) == config_to_dict(config)


def test_a_reward_model_component_needs_the_reward_model_and_says_so_on_its_row(client_in, owner):
    data = builder_data(
        tiny_config(), owner, reward_weight__tiny_arithmetic="1", reward_weight__reward_model="1"
    )
    form = ExperimentForm(data, owner=owner)
    assert not form.is_valid()
    assert form.errors == {
        "reward_weight__reward_model": ["reward_model needs reward_model.enable=True"]
    }
    # Given in another order, the error still lands on the reward model's row.
    form = ExperimentForm({**data, "reward_order": "reward_model,tiny_arithmetic"}, owner=owner)
    assert not form.is_valid() and list(form.errors) == ["reward_weight__reward_model"]
    assert [c.name for c in form.config.reward.components] == ["reward_model", "tiny_arithmetic"]
    page = client_in.get(reverse("experiments:new") + "?preset=grpo_tiny_rm").content.decode()
    assert 'name="reward_weight__reward_model"' in page and 'name="reward_weight__custom"' in page
    assert "needs reward_model.enable" in page


def test_the_reward_models_own_pool_shows_its_error_next_to_its_field(client_in, owner):
    # reward_model.nnodes defaults to 0 (verl's default): a pool of no ranks, which the trainer
    # would refuse only once the run started.
    config = tiny_config(
        **REWARD_MODEL_ON, trainer__controller="ray", reward_model__enable_resource_pool=True
    )
    data = builder_data(config, owner)
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    form = response.context["form"]
    assert list(form.errors) == ["reward_model__nnodes"]
    (message,) = form.errors["reward_model__nnodes"]
    assert "reward_model.nnodes x reward_model.n_gpus_per_node ranks, but they are 0 x 8" in message
    assert "set both to at least 1, or reward_model.enable_resource_pool=False" in message
    assert "but they are 0 x 8; set both to at least 1" in response.content.decode()
    assert not Experiment.objects.exists() and not Run.objects.exists()
    assert ExperimentForm({**data, "reward_model__nnodes": "1"}, owner=owner).is_valid()
    # The single-process trainer has no pools: the error lands on the key it cannot honour.
    form = ExperimentForm(
        {**data, "reward_model__nnodes": "1", "trainer__controller": "local"}, owner=owner
    )
    assert not form.is_valid() and list(form.errors) == ["reward_model__enable_resource_pool"]
    (message,) = form.errors["reward_model__enable_resource_pool"]
    assert "set trainer.controller=ray, or reward_model.enable_resource_pool=False" in message


def test_an_installed_function_with_no_weight_is_refused_on_its_field(owner, studio_dirs):
    # With weighted components, a chosen function that is not one of them would score nothing
    # (the run used to fail as it started).
    data = builder_data(
        tiny_config(),
        owner,
        reward_weight__tiny_arithmetic="1",
        custom_reward="house_rewards.py:length_penalty",
    )
    form = ExperimentForm(data, owner=owner)
    assert not form.is_valid() and list(form.errors) == ["custom_reward"]
    assert "add {name: custom, weight: ...}" in form.errors["custom_reward"][0]


def test_a_reward_model_component_with_kwargs_is_refused_on_its_row(owner):
    data = builder_data(
        tiny_config(**REWARD_MODEL_ON),
        owner,
        reward_weight__reward_model="1",
        reward_kwargs__reward_model="{scale: 2}",
    )
    form = ExperimentForm(data, owner=owner)
    assert not form.is_valid()
    assert form.errors == {  # on the kwargs box, where the fix is
        "reward_kwargs__reward_model": [
            "a reward-model component takes no kwargs: the model scores each (prompt, response) "
            "pair as it is; remove them"
        ]
    }


def test_a_reward_module_that_does_not_parse_is_named_with_its_error_not_dropped(
    client_in, studio_dirs
):
    rewards = studio_dirs / "rewards"
    (rewards / "broken.py").write_text("def score(solution_str, ground_truth):\n    return (\n")
    (rewards / "latin1.py").write_bytes(b"# caf\xe9\ndef score(s, g):\n    return 0.0\n")
    assert [f.module for f in list_reward_functions()] == ["house_rewards.py"]
    problems = {m.module: m.error for m in unreadable_reward_modules()}
    assert problems.keys() == {"broken.py", "latin1.py"}
    assert "line 2" in problems["broken.py"] and "UTF-8" in problems["latin1.py"]
    page = client_in.get(reverse("experiments:new")).content.decode()
    assert "broken.py is not offered:" in page and "latin1.py is not offered: not UTF-8" in page
    assert "house_rewards.py:length_penalty" in page  # the good module is still offered


def test_the_preview_endpoint_renders_yaml_and_the_validators_errors(client_in, owner):
    url = reverse("experiments:preview")
    good = client_in.post(url, builder_data(tiny_config(), owner)).json()
    assert "adv_estimator: grpo" in good["yaml"] and good["errors"] == {}
    data = builder_data(tiny_config(), owner, actor_rollout_ref__rollout__n="1", name="")
    bad = client_in.post(url, data).json()
    assert "n: 1" in bad["yaml"]
    assert list(bad["errors"]) == ["actor_rollout_ref__rollout__n"]
    assert "needs groups" in bad["errors"]["actor_rollout_ref__rollout__n"][0]


def test_yaml_import_opens_the_builder_and_refuses_files_outside_the_presets(client_in):
    url = reverse("experiments:import")
    text = "defaults: [grpo_tiny, _self_]\ntrainer:\n  experiment_name: imported\n  total_training_steps: 7\n"
    response = client_in.post(url, {"yaml_text": text})
    assert response.status_code == 200
    form = response.context["form"]
    assert form.initial["trainer__total_training_steps"] == "7"
    assert form.initial["name"] == "imported"
    response = client_in.post(url, {"yaml_text": "defaults: [/etc/passwd]\n"})
    assert response.status_code == 400
    assert "may build only on the presets" in response.content.decode()
    response = client_in.post(url, {"yaml_text": "trainer: {nope: 1}\n"})
    assert "trainer.nope" in response.content.decode()


def test_builder_page_lists_presets_and_puts_advanced_fields_in_a_collapsible_section(client_in):
    response = client_in.get(reverse("experiments:new") + "?preset=ppo_tiny")
    html = response.content.decode()
    assert response.status_code == 200
    assert 'value="ppo_tiny" selected' in html
    assert '<details class="advanced"' in html
    assert html.index('name="algorithm__adv_estimator"') < html.index('<details class="advanced"')
    assert html.index('name="actor_rollout_ref__actor__clip_ratio_c"') > html.index(
        '<details class="advanced"'
    )
    assert client_in.get(reverse("experiments:new") + "?preset=../../x").status_code == 404
