"""What a config may name on a shared server: paths on the resolved config, server keys, bounds.

Every check runs against real PostgreSQL rows (datasets, runs) and real folders and symlinks.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils.html import escape

from engine.config import ConfigValidationError
from engine.config.fields import RESOURCES
from engine.config.keys import schema_keys
from engine.config.yaml_io import MAX_YAML_BYTES
from tests.engine.config.test_yaml_bounds import alias_bomb
from tests.webapp.fixtures import (
    builder_data,
    errors_by_key,
    make_run,
    tiny_config,
)
from webapp.datasets.services import dataset_create
from webapp.experiments.configs import (
    STUDIO_MANAGED_KEYS,
    config_check,
    preset_load,
    resource_keys,
)
from webapp.experiments.forms import ExperimentForm, field_name
from webapp.experiments.models import Experiment
from webapp.experiments.services import experiment_create
from webapp.runs.models import Run, RunStatus, run_dir

pytestmark = pytest.mark.django_db

MODEL = "actor_rollout_ref.model.path"
NO_ROOTS = (
    "not a place a run may read: a run reads only your uploaded datasets, your own runs' "
    "checkpoints and exports, tiny:// assets and the model roots an administrator lists in "
    "POSTTRAIN_MODEL_ROOTS (none yet)"
)


def finished_run(user) -> Run:
    """Return a finished run of ``user`` whose folder holds an exported model."""
    run = make_run(user, RunStatus.SUCCEEDED)
    model_folder(run_dir(run.pk) / "checkpoints" / "global_step_1" / "huggingface")
    return run


def model_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def studio_errors(owner, **values) -> dict[str, str]:
    """Return config_check's errors by key for grpo_tiny with dotted keys set ({}: it passes)."""
    try:
        config_check(owner=owner, config=tiny_config(**values))
    except ConfigValidationError as exc:
        return errors_by_key(exc)
    return {}


def test_every_schema_key_that_names_a_file_folder_code_or_host_is_classified():
    keys = set(schema_keys())
    classified = {key for resource in RESOURCES for key in resource_keys(resource)}
    named_like_a_path = {key for key in keys if re.search(r"(path|files|dir|tokenizer)$", key)}
    assert named_like_a_path - classified == set(), "give these keys a resource= in the schema"
    named_like_a_host = {k for k in keys if re.search(r"(address|host|port|url|uri)$", k)}
    assert named_like_a_host <= set(resource_keys("server")) | set(resource_keys("endpoint"))
    # A reward service: only an entry of POSTTRAIN_REWARD_ENDPOINTS (the engine's validator).
    assert resource_keys("endpoint") == ("reward_model.sandbox_fusion.url",)
    assert set(resource_keys("path")) == {
        "data.tokenizer",
        "data.train_files",
        "data.val_files",
        "actor_rollout_ref.model.path",
        "actor_rollout_ref.model.tokenizer_path",
        "critic.model.path",
        "critic.model.tokenizer_path",
        "reward_model.model.path",
        "reward_model.model.input_tokenizer",
        "trainer.resume_from_path",
        # Refused keys (docs/config.md): only their default (null) ever passes.
        "data.tool_config_path",
        "actor_rollout_ref.model.hf_config_path",
        "actor_rollout_ref.model.lora_adapter_path",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    }
    assert set(resource_keys("code")) == {
        "custom_reward_function.path",
        "actor_rollout_ref.rollout.multi_turn.interaction_path",
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path",  # imports its class_names
        "data.custom_cls.path",  # a dataset class
        "data.sampler.class_path",  # a sampler class
        # Refused keys: verl's custom classes and servers are never loaded.
        "actor_rollout_ref.rollout.agent.agent_loop_config_path",
        "actor_rollout_ref.rollout.agent.custom_async_server.path",
        "data.datagen.path",
        "reward_manager.module.path",
        "reward_model.reward_loop_module_path",
    }
    assert {k for k in resource_keys("server") if "profiler" not in k} == {
        "trainer.default_local_dir",
        "ray_init.num_cpus",
        "ray_init.address",
        "ray_init.include_dashboard",
        "ray_kwargs.ray_init.num_cpus",
        "ray_kwargs.timeline_json_file",
        "actor_rollout_ref.rollout.prometheus.file",
        "actor_rollout_ref.rollout.prometheus.port",
        "actor_rollout_ref.rollout.skip_dump_dir",
        "trainer.default_hdfs_dir",
        "trainer.rollout_data_dir",
        "trainer.validation_data_dir",
    }
    assert set(resource_keys("server")) <= set(STUDIO_MANAGED_KEYS)


def test_another_users_run_folder_is_refused_however_the_path_is_spelled(
    owner, other_user, studio_dirs, monkeypatch
):
    theirs = finished_run(other_user)
    mine = finished_run(owner)
    target = run_dir(theirs.pk) / "checkpoints" / "global_step_1" / "huggingface"
    link = run_dir(mine.pk) / "checkpoints" / "theirs"
    link.symlink_to(target)
    monkeypatch.setenv("HOME", str(studio_dirs / "data"))
    spellings = [
        {MODEL: str(target)},
        {
            MODEL: f"{studio_dirs}/data/uploads/../runs/{theirs.pk}/checkpoints/global_step_1/huggingface"
        },
        {MODEL: f"~/runs/{theirs.pk}/checkpoints/global_step_1/huggingface"},
        {MODEL: str(link)},
        {MODEL: "${trainer.project_name}/global_step_1/huggingface"},
        {"actor_rollout_ref.model.tokenizer_path": str(target)},
        {"critic.model.path": str(target)},
        {"reward_model.model.path": str(target)},
        {"data.tokenizer": str(target)},
    ]
    for values in spellings:
        project = {"trainer.project_name": str(run_dir(theirs.pk) / "checkpoints")}
        dotted = {k.replace(".", "__"): v for k, v in {**project, **values}.items()}
        found = studio_errors(owner, **dotted)
        (key,) = values
        assert found == {key: NO_ROOTS}, values  # the engine's "does not exist" is left out
    with pytest.raises(ConfigValidationError) as exc:
        config_check(owner=owner, config=tiny_config(actor_rollout_ref__model__path=str(link)))
    assert str(target) not in str(exc.value)  # the link's target is not shown
    assert studio_errors(owner, actor_rollout_ref__model__path="/etc") == {MODEL: NO_ROOTS}
    assert studio_errors(owner, actor_rollout_ref__model__path="models/qwen") == {MODEL: NO_ROOTS}


def test_the_owners_datasets_runs_and_tiny_assets_are_allowed_and_empty_values_pass(
    owner, other_user
):
    mine = finished_run(owner)
    exported = run_dir(mine.pk) / "checkpoints" / "global_step_1" / "huggingface"
    upload = SimpleUploadedFile("math.jsonl", b'{"prompt": "1+1=", "ground_truth": "2"}\n')
    dataset = dataset_create(owner=owner, name="math", upload=upload)
    theirs = dataset_create(owner=other_user, name="theirs", upload=upload)
    assert (
        studio_errors(
            owner,
            actor_rollout_ref__model__path=str(exported),
            critic__model__path=str(exported),
            data__train_files=dataset.path,
            data__val_files="tiny://val.parquet",
            data__tokenizer="",
        )
        == {}
    )
    assert studio_errors(owner, data__val_files=[dataset.path, theirs.path]) == {
        "data.val_files": (
            "this file is not one of your datasets; upload it or pick one (a run reads only your "
            "uploaded datasets, your own runs' checkpoints and exports, tiny:// assets and the "
            "model roots an administrator lists in POSTTRAIN_MODEL_ROOTS (none yet))"
        )
    }


def test_a_tiny_tools_yaml_is_allowed_and_a_tools_yaml_elsewhere_on_the_server_is_not(
    owner, studio_dirs
):
    config_check(owner=owner, config=preset_load("grpo_tiny_calculator"))  # raises on a problem
    key = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    elsewhere = studio_dirs / "tools.yaml"
    elsewhere.write_text("tools: []\n")
    for path in (str(elsewhere), "/etc/passwd", "${trainer.project_name}/tools.yaml"):
        found = studio_errors(
            owner,
            actor_rollout_ref__rollout__multi_turn__enable=True,
            actor_rollout_ref__rollout__multi_turn__tool_config_path=path,
            trainer__project_name=str(studio_dirs),
        )
        assert found == {key: NO_ROOTS}, path


def test_model_roots_are_read_at_call_time_and_named_as_configured(
    owner, settings, studio_dirs, monkeypatch
):
    monkeypatch.setenv("HOME", str(studio_dirs / "home"))
    shared = model_folder(studio_dirs / "home" / "models" / "qwen")
    served = model_folder(studio_dirs / "srv" / "tok")
    outside = model_folder(studio_dirs / "private" / "m")
    (studio_dirs / "srv" / "escape").symlink_to(outside)
    settings.POSTTRAIN_MODEL_ROOTS = f"~/models:{studio_dirs}/srv, "
    assert (
        studio_errors(
            owner, actor_rollout_ref__model__path="~/models/qwen", data__tokenizer=str(served)
        )
        == {}
    )
    found = studio_errors(owner, actor_rollout_ref__model__path=f"{studio_dirs}/srv/escape")
    assert found == {
        MODEL: (
            "not a place a run may read: a run reads only your uploaded datasets, your own runs' "
            f"checkpoints and exports, tiny:// assets and the model roots ~/models, {studio_dirs}/srv"
        )
    }
    assert str(shared) not in found[MODEL]
    settings.POSTTRAIN_MODEL_ROOTS = "models"
    with pytest.raises(ImproperlyConfigured, match="entry 'models' is not an absolute path"):
        studio_errors(owner, actor_rollout_ref__model__path="~/models/qwen")


def test_code_runs_only_from_the_reward_modules_after_interpolation(owner, studio_dirs):
    rewards = studio_dirs / "rewards"
    (studio_dirs / "elsewhere.py").write_text("def compute_score(*a):\n    return 1.0\n")
    key = "actor_rollout_ref.rollout.multi_turn.interaction_path"
    for path in (f"{rewards}/../elsewhere.py", "${trainer.project_name}/elsewhere.py"):
        found = studio_errors(
            owner,
            actor_rollout_ref__rollout__multi_turn__interaction_path=path,
            trainer__project_name=str(studio_dirs),
        )
        assert found[key].startswith("code runs only from the reward modules installed in")
    inside = f"{rewards}/house_rewards.py"
    assert (
        studio_errors(owner, actor_rollout_ref__rollout__multi_turn__interaction_path=inside) == {}
    )


@pytest.mark.parametrize(
    ("path_key", "name_key", "more"),
    [
        ("data.custom_cls.path", "data.custom_cls.name", {}),
        ("data.sampler.class_path", "data.sampler.class_name", {"data.dataloader_num_workers": 0}),
    ],
)
def test_a_dataset_or_sampler_class_runs_only_from_the_reward_modules(
    owner, studio_dirs, path_key, name_key, more
):
    """The command line loads a member's own file (engine.data.custom); the studio refuses it,
    wherever it lies, as every code key: only the installed modules folder is read."""
    rewards = studio_dirs / "rewards"
    own = studio_dirs / "data" / "uploads" / "my_classes.py"
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text("from torch.utils.data import Dataset\n\nclass Mine(Dataset):\n    pass\n")
    values = {name_key.replace(".", "__"): "Mine"}
    values |= {key.replace(".", "__"): value for key, value in more.items()}
    for path in (
        str(own),
        f"{rewards}/../data/uploads/my_classes.py",
        "pkg://engine.data.sampler",  # verl's spelling of an importable module
    ):
        found = studio_errors(owner, **{path_key.replace(".", "__"): path}, **values)
        assert found == {
            path_key: f"code runs only from the reward modules installed in {rewards}; choose "
            "one of them (an administrator adds new ones there)"
        }
    (rewards / "house_data.py").write_text(own.read_text())
    inside = str(rewards / "house_data.py")
    assert studio_errors(owner, **{path_key.replace(".", "__"): inside}, **values) == {}


@pytest.mark.parametrize(
    ("key", "value", "default"),
    [
        ("ray_init.address", "ray://10.0.0.9:10001", "None"),
        ("ray_init.num_cpus", 64, "None"),
        ("ray_init.include_dashboard", True, "False"),
        (
            "trainer.default_local_dir",
            "/tmp/elsewhere",
            "'checkpoints/${trainer.project_name}/${trainer.experiment_name}'",
        ),
    ],
)
def test_server_keys_keep_their_defaults_and_the_form_does_not_show_them(
    owner, key, value, default
):
    assert studio_errors(owner, **{key.replace(".", "__"): value}) == {
        key: f"the server sets {key}, not the experiment; leave it at its default ({default})"
    }
    assert field_name(key) not in ExperimentForm(owner=owner).fields


def test_a_resumed_runs_config_keeps_its_own_checkpoint_folder(owner, other_user):
    mine, theirs = finished_run(owner), finished_run(other_user)
    own = str(run_dir(mine.pk) / "checkpoints")
    assert studio_errors(owner, trainer__default_local_dir=own) == {}
    found = studio_errors(owner, trainer__default_local_dir=str(run_dir(theirs.pk)))
    assert list(found) == ["trainer.default_local_dir"]


@pytest.mark.parametrize("steps", [2**31, 10**12])
def test_the_builder_shows_a_step_count_over_the_maximum_next_to_its_field(client_in, owner, steps):
    data = builder_data(tiny_config(), owner, trainer__total_training_steps=str(steps))
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    message = "must be <= 2147483647 (step numbers are stored as 32-bit integers); lower it"
    assert response.context["form"].errors["trainer__total_training_steps"] == [message]
    assert escape(message) in response.content.decode()
    assert not Experiment.objects.exists() and not Run.objects.exists()


def test_the_preview_refuses_an_alias_bomb_with_a_400_in_well_under_a_second(client_in, owner):
    url = reverse("experiments:preview")
    flow = "{" + alias_bomb().replace("\n", ", ") + "}"
    fields = {
        "actor_rollout_ref__model__override_config": flow,
        "data__train_files": "[" + flow + "]",
        "reward_kwargs__format": flow,
    }
    for name, text in fields.items():
        data = builder_data(tiny_config(), owner, **{name: text})
        if name.startswith("reward_kwargs"):
            data["reward_weight__format"] = "1"
        response = client_in.post(url, data)
        assert response.status_code == 400, name
        body = response.json()
        assert body["yaml"] == ""
        assert "an alias (*l0) is not accepted" in body["errors"][name][0], name
    data = builder_data(tiny_config(), owner, actor_rollout_ref__model__override_config=flow)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        assert client_in.post(url, data).status_code == 400
        times.append(time.perf_counter() - start)
    print(f"preview refuses the alias bomb in {statistics.median(times) * 1000:.1f} ms (median)")
    assert statistics.median(times) < 1.0
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400 and "an alias (*l0) is not accepted" in response.text
    assert not Experiment.objects.exists()


def test_a_yaml_import_with_aliases_or_over_the_size_limit_is_refused(client_in):
    url = reverse("experiments:import")
    response = client_in.post(url, {"yaml_text": alias_bomb()})
    assert response.status_code == 400
    assert "an alias (*l0) is not accepted" in response.text
    big = SimpleUploadedFile("big.yaml", b"#" * (MAX_YAML_BYTES + 1))
    response = client_in.post(url, {"yaml_file": big})
    assert response.status_code == 400
    assert "the file is 262,145 bytes, over the limit of 262,144" in response.text


def test_an_experiment_stored_before_these_rules_fails_its_launch_with_the_key(owner):
    experiment = experiment_create(owner=owner, name="ok", config=tiny_config())
    Experiment.objects.filter(pk=experiment.pk).update(
        config={**experiment.config, "ray_init": {"address": "ray://elsewhere:10001"}}
    )
    experiment.refresh_from_db()
    from webapp.runs.services import run_create

    with pytest.raises(ConfigValidationError) as exc:
        run_create(experiment=experiment)
    assert "ray_init.address" in errors_by_key(exc.value)


@pytest.mark.usefixtures("vllm_importable")
def test_vllm_engine_arguments_that_name_a_path_or_code_are_refused(owner):
    from engine.rollout.names import VLLM_ENGINE_KWARGS

    arguments = {"download_dir": "/srv/models", "worker_extension_cls": "evil.Extension"}
    found = studio_errors(
        owner,
        actor_rollout_ref__rollout__name="vllm",
        actor_rollout_ref__rollout__engine_kwargs__vllm={
            **arguments,
            "kv_cache_memory_bytes": 2**26,  # a size: allowed
        },
    )
    prefix = "actor_rollout_ref.rollout.engine_kwargs.vllm."
    assert set(found) == {prefix + name for name in arguments}
    for name in arguments:
        assert found[prefix + name].startswith(
            "is not passed to vLLM: engine_kwargs.vllm takes only"
        )
        assert ", ".join(VLLM_ENGINE_KWARGS) in found[prefix + name]


def test_a_file_a_reward_functions_keyword_names_is_checked_as_a_path_key(owner, other_user):
    from engine.config.mappings import MAPPING_RULES

    own, theirs = finished_run(owner), finished_run(other_user)
    places = {
        "/etc/passwd": True,
        "~/.ssh/id_rsa": True,
        f"{run_dir(theirs.pk)}/checkpoints": True,
        f"{run_dir(own.pk)}/../{theirs.pk}/checkpoints": True,
        f"{run_dir(own.pk)}/rewards.log": False,
    }
    keys = [key for key, rule in MAPPING_RULES.items() if rule.files]
    assert set(keys) == {
        "reward_model.reward_kwargs",
        "custom_reward_function.reward_kwargs",
        "reward.components[].kwargs",
    }
    for place, refused in places.items():
        kwargs = {"options": {"reference": place}}
        found = studio_errors(
            owner,
            reward_model__reward_manager="batch",
            custom_reward_function__path=None,
            reward_model__reward_kwargs=kwargs,
            custom_reward_function__reward_kwargs=kwargs,
            reward__components=[{"name": "gsm8k", "kwargs": kwargs}],
        )
        expected = {
            "reward_model.reward_kwargs.options.reference",
            "custom_reward_function.reward_kwargs.options.reference",
            "reward.components[0].kwargs.options.reference",
        }
        paths = {key for key, message in found.items() if "not a place a run may read" in message}
        assert paths == (expected if refused else set()), (place, found)


def test_a_judge_reads_only_from_the_model_roots(owner, settings, studio_dirs):
    judge = model_folder(studio_dirs / "srv" / "judge")
    (judge / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    outside = model_folder(studio_dirs / "private" / "judge")
    settings.POSTTRAIN_MODEL_ROOTS = f"{studio_dirs}/srv"
    values = {
        "reward_model__enable": True,
        "reward_model__judge__prompt_template": "Is {response} right? yes or no",
        "reward_model__judge__parser": "verdict",
    }
    found = studio_errors(owner, reward_model__model__path=str(outside), **values)
    assert found == {
        "reward_model.model.path": (
            "not a place a run may read: a run reads only your uploaded datasets, your own runs' "
            f"checkpoints and exports, tiny:// assets and the model roots {studio_dirs}/srv"
        )
    }
    assert "reward_model.model.path" not in studio_errors(
        owner, reward_model__model__path=str(judge), **values
    )
