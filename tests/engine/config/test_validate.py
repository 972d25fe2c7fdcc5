"""validate_config and resolve_config on CPU: every check with its message, and derived values."""

from __future__ import annotations

import pytest

from engine.algorithms.names import GROUP_ESTIMATORS
from engine.config import (
    ConfigFieldError,
    ConfigValidationError,
    PPOConfig,
    config_to_dict,
    load_config,
    resolve_config,
    validate_config,
)

# The batch shape the hand-computed numbers below assume (8 prompts x 4 samples, one mini-batch),
# pinned so that tuning the preset does not change what these tests check.
SHAPE = {
    "grpo_tiny": [
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
    ],
    "ppo_tiny": ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"],
}


def problems(overrides, preset="grpo_tiny", check_files=False):
    """Return {key: message} of the errors validate_config raises ({} when it passes)."""
    try:
        overrides = SHAPE.get(preset, []) + list(overrides)
        validate_config(load_config(preset, overrides), check_files=check_files)
    except ConfigValidationError as exc:
        return {error.key: error.message for error in exc.errors}
    return {}


def notes(overrides, preset="grpo_tiny"):
    overrides = SHAPE.get(preset, []) + list(overrides)
    return validate_config(load_config(preset, overrides), check_files=False)


@pytest.mark.parametrize("preset", ["grpo_tiny", "ppo_tiny"])
def test_tiny_presets_validate_with_file_checks(preset):
    assert validate_config(load_config(preset), check_files=True) == []


@pytest.mark.usefixtures("vllm_importable")  # its rollout is vLLM
def test_gsm8k_preset_validates_without_file_checks():
    assert validate_config(load_config("grpo_gsm8k"), check_files=False) == []


def test_unknown_choices_list_valid_values():
    found = problems(["algorithm.adv_estimator=grpoo"])
    assert "must be one of gae, grpo, rloo" in found["algorithm.adv_estimator"]
    assert "did you mean grpo?" in found["algorithm.adv_estimator"]
    assert (
        "console, jsonl, wandb" in problems(["trainer.logger=[console,wandbb]"])["trainer.logger"]
    )
    found = problems(["reward.components=[{name: gsm8kk}]"])
    assert "did you mean gsm8k?" in found["reward.components[0].name"]
    assert "fsdp, fsdp2" in problems(["critic.strategy=megatron"])["critic.strategy"]


def test_kl_estimators_validate_with_and_without_the_k2_gradient_suffix():
    for name in ("k3_unclamped", "low_var_kl+", "k3_unclamped+"):
        assert problems([f"actor_rollout_ref.actor.kl_loss_type={name}"]) == {}
        assert problems(["algorithm.use_kl_in_reward=True", f"algorithm.kl_penalty={name}"]) == {}
    found = problems(["actor_rollout_ref.actor.kl_loss_type=k3++"])
    assert "must be one of kl, k1" in found["actor_rollout_ref.actor.kl_loss_type"]


@pytest.mark.parametrize("estimator", GROUP_ESTIMATORS)
def test_group_estimators_need_groups(estimator):
    found = problems([f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=1"])
    assert "set actor_rollout_ref.rollout.n>=2" in found["actor_rollout_ref.rollout.n"]
    allowed = [
        f"algorithm.adv_estimator={estimator}",
        "actor_rollout_ref.rollout.n=1",
        "algorithm.allow_single_sample_groups=True",
    ]
    # The token-baseline estimators are refused on their own key until their input exists.
    assert set(problems(allowed)) <= {"algorithm.adv_estimator"}


def test_reinforce_plus_plus_runs_single_samples():
    assert (
        problems(["algorithm.adv_estimator=reinforce_plus_plus", "actor_rollout_ref.rollout.n=1"])
        == {}
    )


def test_batch_split_over_workers():
    # 6 prompts x 1 sample over 4 workers; the mini-batch (clamped to 6) cannot be split either.
    found = problems(["data.train_batch_size=6", "trainer.n_gpus_per_node=4"], preset="ppo_tiny")
    assert "6 samples cannot be split evenly over 4 workers" in found["data.train_batch_size"]
    assert "6 samples" in found["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert "critic.ppo_mini_batch_size" in found


def test_batch_must_be_multiple_of_mini_batch():
    found = problems(["actor_rollout_ref.actor.ppo_mini_batch_size=3"])
    message = found["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert "data.train_batch_size=8 is not a multiple of it; use a divisor such as 2" in message


def test_micro_batch_divides_per_worker_mini_batch():
    # 8 prompts x 4 samples on 1 worker = 32 samples per mini-batch.
    found = problems(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"])
    message = found["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]
    assert "32 samples, not a multiple of 5; use a divisor of 32" in message
    assert problems(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]) == {}
    # On 2 workers each has 16 samples.
    found = problems(
        ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"]
    )
    assert "16 samples" in found["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]
    # With dynamic batching micro-batches are packed by tokens instead.
    assert (
        problems(
            [
                "actor_rollout_ref.actor.use_dynamic_bsz=True",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",
            ]
        )
        == {}
    )


ULYSSES_KEYS = [
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "critic.ulysses_sequence_parallel_size",
]


def test_ulysses_size_divides_the_ranks_and_needs_packed_rows():
    packed = [
        "actor_rollout_ref.model.use_remove_padding=True",
        "critic.model.use_remove_padding=True",
    ]
    on_four = ["trainer.n_gpus_per_node=4", *packed]
    assert problems([*on_four, *(f"{key}=2" for key in ULYSSES_KEYS)], preset="ppo_tiny") == {}
    found = problems([*on_four, *(f"{key}=3" for key in ULYSSES_KEYS)], preset="ppo_tiny")
    for key in ULYSSES_KEYS:
        assert found[key] == (
            "must divide the 4 ranks (trainer.nnodes x trainer.n_gpus_per_node), whose "
            "data-parallel size is ranks / it; use one of [1, 2, 4] (1: off) or more ranks"
        )
    found = problems(
        ["trainer.n_gpus_per_node=2", *(f"{key}=2" for key in ULYSSES_KEYS)], preset="ppo_tiny"
    )
    assert found == {
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": (
            "splits packed rows only: set actor_rollout_ref.model.use_remove_padding=True (verl "
            "asks the same), or keep 1"
        ),
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size": (
            "splits packed rows only: set actor_rollout_ref.model.use_remove_padding=True (verl "
            "asks the same), or keep 1"
        ),
        "critic.ulysses_sequence_parallel_size": (
            "splits packed rows only: set critic.model.use_remove_padding=True (verl asks the "
            "same), or keep 1"
        ),
    }
    found = problems(["actor_rollout_ref.actor.ulysses_sequence_parallel_size=0"])
    assert "actor_rollout_ref.actor.ulysses_sequence_parallel_size" in found


def test_with_ulysses_a_mini_batch_is_split_over_the_data_parallel_ranks():
    # 4 workers, sequences split over 2: 2 data-parallel ranks, each with half a mini-batch.
    split = [
        "trainer.n_gpus_per_node=4",
        "data.train_batch_size=4",
        "actor_rollout_ref.model.use_remove_padding=True",
        "critic.model.use_remove_padding=True",
        *(f"{key}=2" for key in ULYSSES_KEYS),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "critic.ppo_micro_batch_size_per_gpu=1",
    ]
    mini = "actor_rollout_ref.actor.ppo_mini_batch_size"
    assert problems([*split, f"{mini}=2"], preset="ppo_tiny") == {}
    found = problems([*split, f"{mini}=1"], preset="ppo_tiny")
    assert found[mini] == (
        "a mini-batch of 1 samples (ppo_mini_batch_size * rollout.n) cannot be split evenly over "
        "2 data-parallel ranks (4 workers / actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        "=2); make it a multiple of 2"
    )
    found = problems(
        [*split, f"{mini}=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"],
        preset="ppo_tiny",
    )
    assert found == {
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": (
            "each worker's mini-batch has 1 samples, not a multiple of 2; use a divisor of 1"
        )
    }


def test_critic_micro_batch_checked_when_critic_runs():
    found = problems(["critic.ppo_micro_batch_size_per_gpu=3"], preset="ppo_tiny")
    assert "8 samples, not a multiple of 3" in found["critic.ppo_micro_batch_size_per_gpu"]
    assert problems(["critic.ppo_micro_batch_size_per_gpu=3"], preset="grpo_tiny") == {}


def test_dynamic_batch_token_budget_fits_a_sequence():
    found = problems(
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20",
        ]
    )
    assert (
        "at least max_prompt_length + max_response_length = 24"
        in found["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]
    )


def test_a_rollout_response_length_beyond_data_max_response_length_is_refused():
    limit = load_config("grpo_tiny", SHAPE.get("grpo_tiny", [])).data.max_response_length
    found = problems([f"actor_rollout_ref.rollout.response_length={limit + 1}"])
    assert found["actor_rollout_ref.rollout.response_length"].startswith(
        f"is longer than data.max_response_length={limit}"
    )
    assert problems([f"actor_rollout_ref.rollout.response_length={limit - 1}"]) == {}
    assert problems([f"actor_rollout_ref.rollout.response_length={limit}"]) == {}


def test_positive_lengths_and_learning_rates():
    found = problems(
        [
            "data.max_prompt_length=0",
            "data.max_response_length=-1",
            "actor_rollout_ref.actor.optim.lr=0",
        ]
    )
    assert found == {
        "data.max_prompt_length": "must be > 0",
        "data.max_response_length": "must be > 0",
        "actor_rollout_ref.actor.optim.lr": "must be > 0",
    }
    assert problems(["critic.optim.lr=0"], preset="ppo_tiny") == {"critic.optim.lr": "must be > 0"}
    assert problems(["critic.optim.lr=0"], preset="grpo_tiny") == {}  # no critic in GRPO


def test_the_critic_bounds_are_checked_only_when_the_critic_runs():
    bad = ["critic.optim.weight_decay=-0.1", "critic.optim.min_lr_ratio=2", "critic.grad_clip=0"]
    assert problems(bad, preset="ppo_tiny") == {
        "critic.optim.weight_decay": "must be >= 0",
        "critic.optim.min_lr_ratio": "must be between 0 and 1",
        "critic.grad_clip": "must be > 0",
    }
    assert problems(bad, preset="grpo_tiny") == {}


def test_bounds_rules_read_like_the_checks():
    from engine.config.validate import bounds_rule

    assert bounds_rule({"gt": 0}) == "> 0"
    assert bounds_rule({"ge": 0}) == ">= 0"
    assert bounds_rule({"ge": 0, "le": 1}) == "between 0 and 1"
    assert bounds_rule({"gt": 0, "le": 1}) == "in (0, 1]"
    assert bounds_rule({"ge": 0, "lt": 1}) == "in [0, 1)"
    assert bounds_rule({"lt": 5}) == "< 5"
    assert bounds_rule({"help": "no bounds"}) is None


def test_ranges():
    found = problems(
        [
            "algorithm.gamma=1.5",
            "actor_rollout_ref.rollout.top_p=0",
            "trainer.save_freq=0",
            "actor_rollout_ref.actor.optim.betas=[0.9]",
        ]
    )
    assert found["algorithm.gamma"] == "must be between 0 and 1"
    assert found["actor_rollout_ref.rollout.top_p"] == "must be in (0, 1]"
    assert found["trainer.save_freq"] == "must be -1 (off) or a positive number of steps"
    assert "two numbers" in found["actor_rollout_ref.actor.optim.betas"]


def test_clip_ratio_c_above_one():
    found = problems(["actor_rollout_ref.actor.clip_ratio_c=1.0"])
    assert "must be > 1" in found["actor_rollout_ref.actor.clip_ratio_c"]


def test_gae_needs_a_critic():
    found = problems(["critic.enable=False"], preset="ppo_tiny")
    assert "gae needs a value model; set critic.enable=True" in found["critic.enable"]


def test_missing_files_and_model_folder(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "train.parquet"
    data.write_bytes(b"PAR1")
    ok = [f"actor_rollout_ref.model.path={model}", f"data.train_files={data}"]
    found = problems(ok, check_files=True)
    assert "has no readable config.json" in found["actor_rollout_ref.model.path"]
    (model / "config.json").write_text("{}")
    assert problems(ok, check_files=True) == {}
    found = problems(
        [
            f"actor_rollout_ref.model.path={tmp_path}/nope",
            f"data.val_files=[{data},{tmp_path}/v.csv]",
        ],
        check_files=True,
    )
    assert (
        "point actor_rollout_ref.model.path at a local Hugging Face folder"
        in found["actor_rollout_ref.model.path"]
    )
    assert f"{tmp_path}/v.csv does not exist" in found["data.val_files"]
    assert problems([f"actor_rollout_ref.model.path={tmp_path}/nope"], check_files=False) == {}


def test_model_path_not_needed_with_a_loaded_model():
    cfg = load_config("grpo_tiny", ["actor_rollout_ref.model.path=null"])
    with pytest.raises(ConfigValidationError, match="point actor_rollout_ref.model.path"):
        validate_config(cfg)
    cfg.actor_rollout_ref.model.hf_model = object()
    assert validate_config(cfg) == []


def test_data_files_required():
    found = problems(["data.train_files=null"])
    assert "tiny://train.parquet" in found["data.train_files"]
    found = problems(
        ["data.val_files=null", "trainer.val_before_train=False", "trainer.test_freq=5"]
    )
    assert "trainer.test_freq=5" in found["data.val_files"]
    assert "turn validation off with trainer.test_freq=-1" in found["data.val_files"]
    off = ["data.val_files=null", "trainer.val_before_train=False", "trainer.test_freq=-1"]
    assert problems(off) == {}
    # verl's default validation before training, with no validation data: trained, and said.
    before = ["data.val_files=null", "trainer.val_before_train=True", "trainer.test_freq=-1"]
    assert problems(before) == {}
    config = load_config("grpo_tiny.yaml", overrides=before)
    warnings = validate_config(config, check_files=False)
    assert any("validation before training" in w and "skipped" in w for w in warnings)


def test_other_input_checks():
    found = problems(
        [
            "+data.data_key_map.question=prompt",
            "reward.components=[{name: custom}, {name: reward_model}]",
            "actor_rollout_ref.rollout.temperature=0",
            "trainer.resume_mode=resume_path",
        ]
    )
    assert "targets are prompt, ground_truth" in found["data.data_key_map.question"]
    assert "custom_reward_function.path" in found["reward.components[0].name"]
    assert "reward_model.enable=True" in found["reward.components[1].name"]
    assert "do_sample=False" in found["actor_rollout_ref.rollout.temperature"]
    assert "checkpoint folder" in found["trainer.resume_from_path"]


def test_per_file_key_maps_are_checked_and_an_entry_for_a_file_not_read_is_refused():
    config = load_config("grpo_tiny")
    config.data.file_key_maps = {
        "tiny://train.parquet": {"question": "prompt"},
        "/elsewhere.jsonl": {"prompt": "q"},
    }
    config.data.file_data_sources = {"tiny://val.parquet": "tiny_arithmetic"}
    with pytest.raises(ConfigValidationError) as info:
        validate_config(config, check_files=False)
    errors = {(e.key, str(e.value)): e.message for e in info.value.errors}
    assert len(errors) == 2, errors
    train = errors["data.file_key_maps", str({"tiny://train.parquet": {"question": "prompt"}})]
    assert "tiny://train.parquet: targets are prompt, ground_truth" in train
    elsewhere = errors["data.file_key_maps", "/elsewhere.jsonl"]
    assert "neither data.train_files nor data.val_files lists" in elsewhere


def test_all_errors_reported_at_once():
    with pytest.raises(ConfigValidationError) as info:
        validate_config(
            load_config(
                "grpo_tiny",
                ["actor_rollout_ref.rollout.n=1", "data.max_prompt_length=0", "trainer.device=gpu"],
            )
        )
    assert [e.key for e in info.value.errors] == [
        "trainer.device",
        "data.max_prompt_length",
        "actor_rollout_ref.rollout.n",
    ]
    assert "3 configuration error(s)" in str(info.value)


def test_wrong_type_assigned_in_python():
    cfg = load_config("grpo_tiny")
    cfg.data.train_batch_size = "8"
    with pytest.raises(ConfigValidationError) as info:
        validate_config(cfg)
    (error,) = info.value.errors
    assert (error.key, error.value) == ("data.train_batch_size", "8")
    assert "expected int" in error.message


def test_warnings():
    both = notes(["algorithm.use_kl_in_reward=True"])
    assert any("penalised twice" in n for n in both)
    assert any(
        "GRPO without a KL term" in n for n in notes(["actor_rollout_ref.actor.use_kl_loss=False"])
    )
    assert any(
        "every advantage is 0" in n for n in notes(["actor_rollout_ref.rollout.do_sample=False"])
    )
    assert notes([]) == []


def test_resolve_fills_derived_values_and_is_idempotent():
    cfg = load_config("ppo_tiny", [*SHAPE["ppo_tiny"], "trainer.experiment_name=run1"])
    resolve_config(cfg)
    assert cfg.trainer.default_local_dir == "checkpoints/posttrain/run1"
    assert cfg.critic.enable is True
    assert (cfg.critic.ppo_mini_batch_size, cfg.critic.ppo_epochs, cfg.critic.strategy) == (
        8,
        1,
        "fsdp2",
    )
    assert cfg.critic.model.path == "tiny://model"
    assert cfg.actor_rollout_ref.model.tokenizer_path == "tiny://model"
    assert (
        cfg.actor_rollout_ref.rollout.prompt_length,
        cfg.actor_rollout_ref.rollout.response_length,
    ) == (16, 8)
    assert (
        cfg.actor_rollout_ref.actor.clip_ratio_low
        == cfg.actor_rollout_ref.actor.clip_ratio_high
        == 0.2
    )
    assert cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 16384
    assert cfg.actor_rollout_ref.actor.checkpoint.load_contents == ["model", "optimizer", "extra"]
    once = config_to_dict(cfg)
    assert config_to_dict(resolve_config(cfg)) == once
    assert resolve_config(load_config("grpo_tiny")).critic.enable is False


def test_resolve_keeps_explicit_values():
    cfg = PPOConfig()
    cfg.critic.ppo_mini_batch_size = 64
    cfg.critic.enable = False
    cfg.trainer.default_local_dir = "/ckpt"
    resolve_config(cfg)
    assert (cfg.critic.ppo_mini_batch_size, cfg.critic.enable, cfg.trainer.default_local_dir) == (
        64,
        False,
        "/ckpt",
    )


def test_validate_does_not_change_the_config():
    cfg = load_config("grpo_tiny")
    before = config_to_dict(cfg)
    validate_config(cfg)
    assert config_to_dict(cfg) == before
    assert cfg.critic.enable is None


def test_bad_reference_is_a_validation_error():
    cfg = load_config("grpo_tiny", ["trainer.default_local_dir=ckpt/${trainer.nope}"])
    with pytest.raises(ConfigValidationError, match=r"\$\{trainer.nope\} names no config key"):
        validate_config(cfg)


def test_a_reference_takes_the_type_of_the_key_it_fills():
    # A path key that names an int key holds that number as a path, checked as one.
    cfg = load_config("grpo_tiny", ["data.train_files=${trainer.seed}"])
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(cfg, check_files=True)
    assert "data.train_files" in str(caught.value)
    assert "1 does not exist" in str(caught.value)  # grpo_tiny.yaml has trainer.seed: 1
    # A number key that names a text key is a type error naming the key, when it is loaded.
    with pytest.raises(ConfigFieldError, match=r"data\.train_batch_size.*expected int"):
        load_config("grpo_tiny", ["data.train_batch_size=${trainer.project_name}"])


def test_reward_component_choices_are_the_reward_registry():
    from engine.rewards import list_reward_fns
    from engine.rewards.names import REWARD_COMPONENTS

    assert set(REWARD_COMPONENTS) == {*list_reward_fns(), "reward_model", "custom"}


def test_every_registered_policy_loss_validates():
    from engine.algorithms.policy_loss.base import POLICY_LOSS_REGISTRY

    assert "gpg" in POLICY_LOSS_REGISTRY
    for mode in POLICY_LOSS_REGISTRY:
        # bypass_mode is the loss that rollout_correction.bypass_mode=True trains with.
        extra = ["algorithm.rollout_correction.bypass_mode=True"] if mode == "bypass_mode" else []
        assert problems([f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}", *extra]) == {}


def test_importing_the_config_schema_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, engine.config.schema, engine.algorithms.names, engine.rewards.names; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
