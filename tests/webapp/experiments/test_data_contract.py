"""The dataset <-> reward contract: a member's own data checked where a config is created.

An uploaded train set beside the preset's validation set, an upload whose data_source has no
reward, prompts over ``data.max_prompt_length``: each used to pass the builder and fail (or
score nothing) once the run started.
"""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from engine.config import ConfigValidationError, config_to_dict
from tests.webapp.api.helpers import ApiClient, token_of
from tests.webapp.fixtures import builder_data, errors_by_key, tiny_config
from webapp.datasets.services import dataset_create
from webapp.experiments.configs import config_check
from webapp.experiments.forms import ExperimentForm
from webapp.experiments.models import Experiment

pytestmark = pytest.mark.django_db

QA_MAP = {"prompt": "question", "ground_truth": "answer"}


def upload(owner, rows, *, data_source="tiny_arithmetic", key_map=QA_MAP, name="sums.jsonl"):
    text = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return dataset_create(
        owner=owner,
        name="",
        upload=SimpleUploadedFile(name, text),
        key_map=key_map,
        data_source=data_source,
    )


SUMS = [{"question": f"{a}+{a}=", "answer": str(2 * a)} for a in range(1, 9)]


def test_an_uploaded_train_set_keeps_the_presets_validation_set_readable(owner):
    dataset = upload(owner, SUMS)
    form = ExperimentForm(builder_data(tiny_config(), owner, train_dataset=dataset.pk), owner=owner)
    assert form.is_valid(), form.errors
    data = form.config.data
    assert (data.train_files, data.val_files) == (dataset.path, "tiny://val.parquet")
    assert data.data_key_map == {}  # nothing that would apply to tiny://val.parquet
    assert data.file_key_maps == {dataset.path: QA_MAP}
    assert data.file_data_sources == {dataset.path: "tiny_arithmetic"}


def test_a_key_map_that_does_not_fit_a_file_is_refused_on_that_files_key(owner):
    dataset = upload(owner, SUMS)
    config = tiny_config(data__train_files=dataset.path, data__data_key_map=QA_MAP)
    with pytest.raises(ConfigValidationError) as caught:
        config_check(owner=owner, config=config)
    errors = errors_by_key(caught.value)
    assert list(errors) == ["data.val_files"]
    assert "column 'question' (data.data_key_map.prompt) not found" in errors["data.val_files"]
    assert "applies to every file without its own map" in errors["data.val_files"]


def test_a_data_source_with_no_reward_is_refused_unless_a_custom_function_scores_it(owner):
    dataset = upload(owner, SUMS, data_source="")
    config = tiny_config(data__train_files=dataset.path)
    with pytest.raises(ConfigValidationError) as caught:
        config_check(owner=owner, config=config)
    message = errors_by_key(caught.value)["data.train_files"]
    assert "data_source 'sums' has no reward" in message
    assert "gsm8k" in message and "custom reward function" in message
    custom = tiny_config(
        data__train_files=dataset.path,
        custom_reward_function__path=str(_house_rewards()),
        custom_reward_function__name="length_penalty",
    )
    config_check(owner=owner, config=custom)


def _house_rewards():
    from webapp.experiments.rewards import reward_modules_dir

    return reward_modules_dir() / "house_rewards.py"


def test_a_dataset_class_reads_the_files_its_own_way(owner):
    dataset = upload(owner, SUMS)
    classes = _house_rewards().parent / "house_data.py"
    classes.write_text("from torch.utils.data import Dataset\n\nclass Sums(Dataset):\n    pass\n")
    mapped = {"data__train_files": dataset.path, "data__data_key_map": QA_MAP}
    with pytest.raises(ConfigValidationError):  # the key map does not fit tiny://val.parquet
        config_check(owner=owner, config=tiny_config(**mapped))
    config = tiny_config(
        **mapped, data__custom_cls__path=str(classes), data__custom_cls__name="Sums"
    )
    warnings = config_check(owner=owner, config=config)
    assert (
        "the data files were not checked against their key maps, rewards and "
        "data.max_prompt_length: data.custom_cls reads them with its own dataset class, which "
        "the run builds as it starts"
    ) in warnings


def test_prompts_over_max_prompt_length_are_counted_and_filter_overlong_is_offered(owner):
    long = [{"question": "1+" * 40 + "1=", "answer": "41"}] * 3
    dataset = upload(owner, SUMS + long)
    config = tiny_config(data__train_files=dataset.path, data__max_prompt_length=40)
    with pytest.raises(ConfigValidationError) as caught:
        config_check(owner=owner, config=config)
    message = errors_by_key(caught.value)["data.max_prompt_length"]
    assert "prompts sampled from the data files are longer than data.max_prompt_length=40" in (
        message
    )
    assert message.startswith("3 of the ")
    assert "data.filter_overlong_prompts=True" in message
    config.data.filter_overlong_prompts = True
    warnings = config_check(owner=owner, config=config)
    assert any("data.filter_overlong_prompts=True drops them" in w for w in warnings)


def test_an_api_config_naming_an_upload_brings_the_uploads_key_map(owner):
    dataset = upload(owner, SUMS)
    api = ApiClient(token_of(owner))
    config = config_to_dict(tiny_config(data__train_files=dataset.path))
    response = api.post("/experiments", {"name": "mine", "config": config})
    assert response.status_code == 201, response.content
    stored = Experiment.objects.get().config["data"]
    assert stored["file_key_maps"] == {dataset.path: QA_MAP}
    assert stored["file_data_sources"] == {dataset.path: "tiny_arithmetic"}


def test_the_builder_page_shows_the_contract_errors_next_to_the_data_files(client_in, owner):
    dataset = upload(owner, SUMS, data_source="")
    data = builder_data(tiny_config(), owner, train_dataset=dataset.pk)
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    assert "has no reward" in response.context["form"].errors["train_dataset"][0]


def test_a_sweep_member_whose_prompts_do_not_fit_is_refused_by_name(owner):
    from webapp.experiments.services import experiment_create
    from webapp.sweeps.services import SweepInvalid, sweep_create

    long = [{"question": "1+" * 40 + "1=", "answer": "41"}]
    dataset = upload(owner, SUMS + long)
    experiment = experiment_create(
        owner=owner,
        name="mine",
        config=tiny_config(data__train_files=dataset.path, data__max_prompt_length=128),
    )
    spec = {"mode": "grid", "params": {"data.max_prompt_length": [40, 128]}}
    with pytest.raises(SweepInvalid) as caught:
        sweep_create(experiment=experiment, name="lengths", spec=spec, concurrency=1)
    message = str(caught.value)
    assert "member 1 of 2 (data.max_prompt_length=40)" in message
    assert "1 of the " in message and "prompts sampled" in message and "member 2" not in message


def test_a_custom_chat_template_is_not_rendered_in_the_web_process(owner):
    """A member's Jinja template could loop for minutes: the run measures those prompts."""
    long = [{"question": "1+" * 40 + "1=", "answer": "41"}]
    dataset = upload(owner, SUMS + long)
    config = tiny_config(
        data__train_files=dataset.path,
        data__max_prompt_length=40,
        actor_rollout_ref__model__custom_chat_template="{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    warnings = config_check(owner=owner, config=config)
    assert any("prompt lengths were not checked" in w for w in warnings)


def test_the_builder_says_how_each_upload_is_read_and_which_sources_have_a_reward(client_in, owner):
    upload(owner, SUMS)
    html = client_in.get(reverse("experiments:new")).content.decode()
    assert "sums (prompt←question, ground_truth←answer; data_source tiny_arithmetic)" in html
    assert "The data_source values with a reward: <code>openai/gsm8k</code>" in html
