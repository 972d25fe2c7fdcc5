"""Loading presets, verl/hydra overrides, dict/YAML round trips (CPU, no files beyond tmp)."""

from __future__ import annotations

import json

import pytest

from engine.config import (
    ConfigError,
    ConfigFieldError,
    PPOConfig,
    RewardComponent,
    config_from_dict,
    config_from_yaml,
    config_to_dict,
    config_to_yaml,
    load_config,
    parse_override,
    resolve_config,
    validate_config,
)
from engine.config.loader import CONFIG_DIR
from engine.config.yaml_io import yaml_load

VERL_COMMAND_LINE = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/x/train.parquet",
    "data.val_files=/x/val.parquet",
    "data.train_batch_size=16",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "actor_rollout_ref.model.path=/x/model",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.total_epochs=1",
    "trainer.test_freq=1",
    "trainer.save_freq=1",
]


def test_default_yaml_equals_dataclass_defaults():
    text = (CONFIG_DIR / "ppo_trainer.yaml").read_text()
    assert yaml_load(text) == config_to_dict(PPOConfig())
    assert load_config() == PPOConfig()


def test_defaults_follow_verl():
    cfg = PPOConfig()
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.critic.optim.lr == 1e-5
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert cfg.actor_rollout_ref.actor.checkpoint.save_contents == ["model", "optimizer", "extra"]
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.trainer.logger == ["console"]
    # Mutable defaults are per instance.
    other = PPOConfig()
    other.trainer.logger.append("jsonl")
    assert cfg.trainer.logger == ["console"]


def test_verl_command_line_parses():
    cfg = load_config(overrides=VERL_COMMAND_LINE)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.data.train_files == "/x/train.parquet"
    assert cfg.data.train_batch_size == 16
    assert cfg.data.max_response_length == 1024
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True
    assert cfg.actor_rollout_ref.actor.kl_loss_coef == 0.001
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.total_epochs, cfg.trainer.save_freq) == (
        1,
        1,
        1,
    )
    # verl refuses a mini-batch larger than the batch; PostTrain uses the batch and says so.
    notes = validate_config(cfg, check_files=False)
    assert len(notes) == 1
    assert "ppo_mini_batch_size=256 is larger than data.train_batch_size=16" in notes[0]
    assert resolve_config(cfg).actor_rollout_ref.actor.ppo_mini_batch_size == 16


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        ("actor_rollout_ref.actor.optim.lr=1e-6", "lr", 1e-6),
        ("actor_rollout_ref.actor.optim.lr=5e-5", "lr", 5e-5),
        ("actor_rollout_ref.actor.optim.lr=3", "lr", 3.0),
        ("actor_rollout_ref.actor.use_kl_loss=true", "kl", True),
        ("actor_rollout_ref.actor.use_kl_loss=False", "kl", False),
        ("trainer.logger=[console,jsonl]", "logger", ["console", "jsonl"]),
        ("trainer.logger=['console','jsonl']", "logger", ["console", "jsonl"]),
        ('trainer.logger=["console"]', "logger", ["console"]),
        ("trainer.total_training_steps=null", "steps", None),
        ("trainer.total_training_steps=1e3", "steps", 1000),
        ("data.val_files=[/a.parquet,/b.parquet]", "val", ["/a.parquet", "/b.parquet"]),
        ("actor_rollout_ref.actor.optim.betas=[0.9,0.95]", "betas", [0.9, 0.95]),
    ],
)
def test_override_values_are_yaml_typed(override, key, expected):
    cfg = load_config(overrides=[override])
    actual = {
        "lr": cfg.actor_rollout_ref.actor.optim.lr,
        "kl": cfg.actor_rollout_ref.actor.use_kl_loss,
        "logger": cfg.trainer.logger,
        "steps": cfg.trainer.total_training_steps,
        "val": cfg.data.val_files,
        "betas": cfg.actor_rollout_ref.actor.optim.betas,
    }[key]
    assert actual == expected
    assert type(actual) is type(expected)


def test_dict_value_and_plus_entry():
    cfg = load_config(overrides=["data.data_key_map={prompt: question, ground_truth: answer}"])
    assert cfg.data.data_key_map == {"prompt": "question", "ground_truth": "answer"}
    cfg = load_config(overrides=["+data.data_key_map.prompt=question"])
    assert cfg.data.data_key_map == {"prompt": "question"}
    cfg = load_config(
        overrides=[
            "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
            "+custom_reward_function.reward_kwargs.mode=strict",
        ]
    )
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.1}
    assert cfg.custom_reward_function.reward_kwargs == {"mode": "strict"}


def test_dict_entry_without_plus_names_the_fix():
    with pytest.raises(ConfigFieldError) as info:
        load_config(overrides=["data.data_key_map.prompt=question"])
    assert info.value.key == "data.data_key_map.prompt"
    assert "+data.data_key_map.prompt=question" in info.value.message
    # Once the entry exists, a plain override changes it.
    cfg = load_config(
        overrides=["+data.data_key_map.prompt=question", "data.data_key_map.prompt=q2"]
    )
    assert cfg.data.data_key_map == {"prompt": "q2"}


def test_dict_override_merges_like_hydra():
    cfg = load_config(
        overrides=["+data.data_key_map.prompt=question", "data.data_key_map={ground_truth: answer}"]
    )
    assert cfg.data.data_key_map == {"prompt": "question", "ground_truth": "answer"}


def test_unknown_key_names_closest_key():
    with pytest.raises(ConfigFieldError) as info:
        load_config(overrides=["data.max_prompt_len=3"])
    assert info.value.key == "data.max_prompt_len"
    assert "did you mean data.max_prompt_length?" in str(info.value)
    with pytest.raises(ConfigFieldError, match=r"did you mean actor_rollout_ref\.actor\.optim\.lr"):
        load_config(overrides=["actor_rollout_ref.actor.lr=1e-5"])


def test_plus_unknown_key_goes_to_extras_with_warning():
    with pytest.warns(UserWarning) as caught:
        cfg = load_config(overrides=["+trainer.wandb_entity=team", "++ray_init.foo=[1,2]"])
    assert [str(w.message) for w in caught] == [
        "trainer.wandb_entity is not a PostTrain config key; it is kept in config.extras",
        "ray_init.foo is not a PostTrain config key; it is kept in config.extras",
    ]
    assert cfg.extras == {"trainer.wandb_entity": "team", "ray_init.foo": [1, 2]}
    assert config_to_dict(cfg)["extras"] == cfg.extras
    with pytest.warns(UserWarning):
        cfg = load_config(overrides=["+trainer.wandb_entity=team", "~trainer.wandb_entity"])
    assert cfg.extras == {}


def test_plus_and_force_set_existing_keys():
    cfg = load_config(overrides=["+data.train_batch_size=8", "++data.max_prompt_length=64"])
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length) == (8, 64)


def test_delete_resets_to_default():
    cfg = load_config("grpo_tiny", ["~data.train_batch_size", "~actor_rollout_ref.actor.optim"])
    assert cfg.data.train_batch_size == 1024
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.actor_rollout_ref.rollout.n == 8  # untouched keys keep the preset's values
    cfg = load_config(overrides=["+data.data_key_map.prompt=q", "~data.data_key_map.prompt"])
    assert cfg.data.data_key_map == {}
    with pytest.raises(ConfigFieldError, match="no such entry"):
        load_config(overrides=["~data.data_key_map.prompt"])
    with pytest.raises(ConfigFieldError, match="unknown key"):
        load_config(overrides=["~data.nothing_here"])


def test_wrong_type_names_key_value_and_type():
    with pytest.raises(ConfigFieldError) as info:
        load_config(overrides=["data.train_batch_size=abc"])
    assert (info.value.key, info.value.value) == ("data.train_batch_size", "abc")
    assert "expected int" in info.value.message
    with pytest.raises(ConfigFieldError, match="expected bool"):
        load_config(overrides=["actor_rollout_ref.actor.use_kl_loss=maybe"])
    with pytest.raises(ConfigFieldError, match=r"expected float"):
        load_config(overrides=["actor_rollout_ref.actor.optim.lr=[1]"])
    with pytest.raises(ConfigFieldError, match=r"expected int"):
        load_config(overrides=["data.train_batch_size=1.5"])
    with pytest.raises(ConfigFieldError) as info:
        load_config(overrides=["actor_rollout_ref.rollout.n=true"])
    assert info.value.key == "actor_rollout_ref.rollout.n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("data.train_batch_size", "no value"),
        ("=5", "not an override"),
        ("data.train_batch_size=[1,", "not valid YAML"),
        ("actor_rollout_ref.model.hf_model=x", "runtime-only"),
    ],
)
def test_malformed_overrides(text, message):
    with pytest.raises(ConfigFieldError, match=message):
        load_config(overrides=[text])


def test_parse_override_forms():
    assert parse_override("a.b=1").op == "set"
    assert parse_override("+a.b=1").op == "add"
    assert parse_override("++a.b=1").op == "force"
    assert parse_override("~a.b").op == "delete"
    assert parse_override("a.b=").value == ""
    assert parse_override("a.b='1e-6'").value == "1e-6"


def test_presets_load_and_inherit_defaults():
    grpo = load_config("grpo_tiny")
    assert grpo.algorithm.adv_estimator == "grpo"
    assert grpo.actor_rollout_ref.rollout.n == 8
    assert grpo.actor_rollout_ref.actor.optim.lr == 2e-4
    assert grpo.actor_rollout_ref.actor.clip_ratio == 0.2  # inherited from ppo_trainer
    ppo = load_config("ppo_tiny.yaml")
    assert (ppo.algorithm.adv_estimator, ppo.critic.optim.lr) == ("gae", 1e-3)
    gsm8k = load_config("grpo_gsm8k")
    assert (gsm8k.actor_rollout_ref.rollout.name, gsm8k.actor_rollout_ref.rollout.n) == ("vllm", 5)


def test_user_preset_with_hydra_defaults_and_base(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "defaults:\n  - grpo_tiny\n  - _self_\ndata:\n  train_batch_size: 16\n"
    )
    cfg = load_config(str(tmp_path / "mine.yaml"), ["trainer.test_freq=5"])
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (16, 8)
    assert cfg.trainer.test_freq == 5
    (tmp_path / "based.yaml").write_text("base: mine.yaml\ntrainer:\n  seed: 7\n")
    cfg = load_config(str(tmp_path / "based.yaml"))
    assert (cfg.data.train_batch_size, cfg.trainer.seed) == (16, 7)
    # _self_ first: the included config wins.
    (tmp_path / "first.yaml").write_text(
        "defaults: [_self_, grpo_tiny]\ndata:\n  train_batch_size: 16\n"
    )
    preset_batch = load_config("grpo_tiny").data.train_batch_size
    assert preset_batch != 16
    assert load_config(str(tmp_path / "first.yaml")).data.train_batch_size == preset_batch


def test_preset_errors(tmp_path):
    with pytest.raises(ConfigError, match="presets in .*grpo_tiny"):
        load_config("no_such_preset")
    (tmp_path / "a.yaml").write_text("defaults: [b]\n")
    (tmp_path / "b.yaml").write_text("defaults: [a]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(tmp_path / "a.yaml"))
    (tmp_path / "bad.yaml").write_text("data:\n  train_batch_sise: 8\n")
    with pytest.raises(ConfigFieldError, match="did you mean data.train_batch_size"):
        load_config(str(tmp_path / "bad.yaml"))


def test_round_trips():
    cfg = load_config("grpo_tiny", ["+data.data_key_map.prompt=question"])
    cfg.reward.components = [RewardComponent(name="keyword", weight=0.5, kwargs={"words": ["a"]})]
    cfg.actor_rollout_ref.model.hf_model = object()  # runtime-only: dropped, not compared
    data = config_to_dict(cfg)
    assert "hf_model" not in data["actor_rollout_ref"]["model"]
    assert json.loads(json.dumps(data)) == data
    assert config_from_dict(data) == cfg
    assert config_from_yaml(config_to_yaml(cfg)) == cfg
    assert config_from_dict(json.loads(json.dumps(data))) == cfg


def test_config_from_dict_checks_keys_and_types():
    with pytest.raises(ConfigFieldError, match="did you mean trainer.total_epochs"):
        config_from_dict({"trainer": {"total_epoch": 3}})
    with pytest.raises(ConfigFieldError) as info:
        config_from_dict({"reward": {"components": [{"name": "gsm8k", "weight": "heavy"}]}})
    assert info.value.key == "reward.components[0].weight"
    with pytest.raises(ConfigFieldError, match="runtime-only"):
        config_from_dict({"actor_rollout_ref": {"model": {"tokenizer": "x"}}})
    with pytest.raises(ConfigError, match="mapping"):
        config_from_dict([1, 2])


def test_verl_interpolations_in_yaml():
    text = (
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 64\n"
        "critic:\n  ppo_mini_batch_size: ${actor_rollout_ref.actor.ppo_mini_batch_size}\n"
        "  model:\n    path: ${actor_rollout_ref.model.path}\n"
        "hydra:\n  searchpath: [file://verl/trainer/config]\n"
    )
    cfg = config_from_yaml(text)
    assert cfg.critic.ppo_mini_batch_size == 64  # typed field: resolved while loading
    assert cfg.critic.model.path == "${actor_rollout_ref.model.path}"  # string: kept
    cfg.actor_rollout_ref.model.path = "/m"
    assert resolve_config(cfg).critic.model.path == "/m"
    with pytest.raises(ConfigFieldError, match="refers to no config key"):
        config_from_yaml("critic:\n  ppo_epochs: ${oc.env:EPOCHS}\n")


def test_attribute_access_and_assignment():
    cfg = load_config()
    cfg.data.train_batch_size = 8
    assert cfg.data.train_batch_size == 8
    assert config_to_dict(cfg)["data"]["train_batch_size"] == 8


def test_overrides_must_be_a_list():
    with pytest.raises(ConfigError, match="list of strings"):
        load_config(overrides="data.train_batch_size=8")


def test_dotted_top_level_yaml_keys_nest_and_merge_with_their_section():
    from engine.config import config_from_yaml

    text = (
        "defaults: [grpo_tiny, _self_]\nalgorithm.adv_estimator: rloo\nalgorithm:\n  gamma: 0.5\n"
    )
    config = config_from_yaml(text)
    assert (config.algorithm.adv_estimator, config.algorithm.gamma) == ("rloo", 0.5)


def test_override_lines_read_one_per_line_and_a_verl_command_line():
    from engine.config import override_lines

    assert override_lines("a.b=1\n# note\n+c.d=x y\n~e.f\n") == ["a.b=1", "+c.d=x y", "~e.f"]
    script = "python3 -m verl.trainer.main_ppo \\\n  a.b=1 \\\n  c.d='[1, 2]' $@\n"
    assert override_lines(script) == ["a.b=1", "c.d=[1, 2]"]
    assert override_lines("trainer:\n  total_training_steps: 3\n") is None
