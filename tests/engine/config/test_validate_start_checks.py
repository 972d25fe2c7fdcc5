"""Checks the validator makes that the run used to make only as it started: the reward model's
own pool and the keys only its Ray role reads, verl's global reward-model micro-batch, reward
components the reward manager would refuse, and ``tiny://`` names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.config import ConfigValidationError, load_config, resolve_config, validate_config
from engine.config.reward_model import IN_PROCESS_OFFLOAD_ON_CPU
from engine.tools.names import EMBEDDED_URIS, TINY_URIS

RM = [
    "reward_model.enable=True",
    "reward_model.model.path=tiny://reward_model",
    "reward_model.micro_batch_size_per_gpu=4",
]
OWN_POOL = [*RM, "trainer.controller=ray", "reward_model.enable_resource_pool=True"]


def errors(overrides, check_files=False) -> dict[str, str]:
    """Return {key: message} of the errors validate_config raises for grpo_tiny ({}: none)."""
    try:
        validate_config(load_config("grpo_tiny", overrides), check_files=check_files)
    except ConfigValidationError as exc:
        return {error.key: error.message for error in exc.errors}
    return {}


def raised(exc: ConfigValidationError) -> dict[str, str]:
    return {error.key: error.message for error in exc.errors}


# -- the reward model's own pool, and the keys only its Ray role reads ------------------------
def test_an_own_reward_pool_needs_at_least_one_rank_per_side():
    # reward_model.nnodes defaults to 0, verl's default: a pool of 0 x 8 ranks.
    found = errors(OWN_POOL)
    assert found == {
        "reward_model.nnodes": "reward_model.enable_resource_pool=True gives the reward model a "
        "pool of reward_model.nnodes x reward_model.n_gpus_per_node ranks, but they are 0 x 8; "
        "set both to at least 1, or reward_model.enable_resource_pool=False to share the "
        "trainer's ranks"
    }
    both = errors([*OWN_POOL, "reward_model.n_gpus_per_node=0"])
    assert both.keys() == {"reward_model.nnodes", "reward_model.n_gpus_per_node"}
    assert "but they are 0 x 0" in both["reward_model.n_gpus_per_node"]
    assert errors([*OWN_POOL, "reward_model.nnodes=1"]) == {}
    # Read only with reward_model.enable=True.
    assert errors(["trainer.controller=ray", "reward_model.enable_resource_pool=True"]) == {}


def test_the_ray_trainer_raises_the_validators_pool_error_before_asking_for_pools():
    from engine.trainer.ray_trainer import default_resource_pool_spec

    config = load_config("grpo_tiny", OWN_POOL)
    with pytest.raises(ConfigValidationError) as caught:
        default_resource_pool_spec(config)
    assert raised(caught.value) == errors(OWN_POOL)
    config.reward_model.nnodes, config.reward_model.n_gpus_per_node = 2, 3
    assert default_resource_pool_spec(config)["reward_pool"] == [3, 3]


def test_the_single_process_trainer_refuses_the_keys_only_the_ray_role_reads():
    local = [*RM, "reward_model.enable_resource_pool=True", "reward_model.nnodes=1"]
    pool = "reward_model.enable_resource_pool"
    found = errors(local)
    assert found == {
        pool: "read where the reward model is a role on Ray ranks, but the single-process "
        "trainer (trainer.controller=local) loads it whole in its own process; set "
        f"trainer.controller=ray, or {pool}=False"
    }
    assert errors([*local, "trainer.controller=ray"]) == {}
    assert errors(["reward_model.enable_resource_pool=True"]) == {}


def test_the_single_process_trainer_offloads_its_reward_model_on_a_gpu_only():
    offload = "reward_model.model.fsdp_config.param_offload=True"
    auto = [*RM, offload, "trainer.device=auto"]
    assert errors(auto) == {}  # asked again when the run starts on a device
    assert errors([*RM, offload, "trainer.device=cuda"]) == {}
    found = errors([*RM, offload, "trainer.device=cpu"])
    assert found == {"reward_model.model.fsdp_config.param_offload": IN_PROCESS_OFFLOAD_ON_CPU}
    from engine.trainer.build import build_reward_scorer

    with pytest.raises(ConfigValidationError) as caught:  # auto resolved to this CPU
        build_reward_scorer(load_config("grpo_tiny", auto), "cpu")
    assert raised(caught.value) == found


def test_the_in_process_scorer_raises_the_validators_errors_before_loading_a_model():
    from engine.trainer.build import build_reward_scorer

    overrides = [*RM, "reward_model.enable_resource_pool=True", "reward_model.nnodes=1"]
    with pytest.raises(ConfigValidationError) as caught:
        build_reward_scorer(load_config("grpo_tiny", overrides))
    assert raised(caught.value) == errors(overrides)


# -- verl's deprecated global reward_model.micro_batch_size -----------------------------------
GLOBAL_RM = [
    "reward_model.enable=True",
    "reward_model.model.path=tiny://reward_model",
    "trainer.n_gpus_per_node=2",
]


def per_gpu(overrides) -> int:
    return resolve_config(load_config("grpo_tiny", overrides)).reward_model.micro_batch_size_per_gpu


def test_the_global_micro_batch_is_shared_by_the_trainers_ranks_on_the_global_pool():
    # verl's RewardModelWorker divides it by its world size: here the global pool's 2 ranks.
    overrides = [*GLOBAL_RM, "reward_model.micro_batch_size=8"]
    assert per_gpu(overrides) == 4
    warnings = validate_config(load_config("grpo_tiny", overrides), check_files=False)
    assert (
        "[DEPRECATED] reward_model.micro_batch_size=8 is a global size; it is divided by the 2 "
        "data-parallel ranks into reward_model.micro_batch_size_per_gpu=4: set "
        "reward_model.micro_batch_size_per_gpu instead"
    ) in warnings
    found = errors([*GLOBAL_RM, "reward_model.micro_batch_size=7"])
    assert "the 2 data-parallel ranks cannot share" in found["reward_model.micro_batch_size"]


def test_the_global_micro_batch_is_shared_by_the_reward_models_own_pool():
    # On its own pool of 1 x 4 ranks (the trainer has 2), 8 samples are 2 per rank, not 4.
    own = [
        *GLOBAL_RM,
        "trainer.controller=ray",
        "reward_model.enable_resource_pool=True",
        "reward_model.nnodes=1",
        "reward_model.n_gpus_per_node=4",
    ]
    assert per_gpu([*own, "reward_model.micro_batch_size=8"]) == 2
    warnings = validate_config(
        load_config("grpo_tiny", [*own, "reward_model.micro_batch_size=8"]), check_files=False
    )
    assert any(
        "divided by the 4 ranks of the reward model's own pool (reward_model.nnodes x "
        "n_gpus_per_node) into reward_model.micro_batch_size_per_gpu=2" in w
        for w in warnings
    )
    # 6 splits over the trainer's 2 ranks but not over the pool's 4.
    found = errors([*own, "reward_model.micro_batch_size=6"])
    assert found == {
        "reward_model.micro_batch_size": "a global size that the 4 ranks of the reward model's "
        "own pool (reward_model.nnodes x n_gpus_per_node) cannot share; make it a multiple of "
        "4, or set reward_model.micro_batch_size_per_gpu"
    }
    # A pool of no ranks is the pool's error alone, and resolving does not divide by zero.
    empty = [*GLOBAL_RM, *OWN_POOL[-2:], "reward_model.micro_batch_size=8"]
    assert errors(empty).keys() == {"reward_model.nnodes"}
    assert per_gpu(empty) == 8


# -- reward components the reward manager would refuse -----------------------------------------
def test_a_reward_model_component_takes_no_kwargs():
    components = "reward.components=[{name: tiny_arithmetic}, {name: reward_model, kwargs: {a: 1}}]"
    assert errors([*RM, components]) == {
        "reward.components[1].kwargs": "a reward-model component takes no kwargs: the model "
        "scores each (prompt, response) pair as it is; remove them"
    }
    assert errors([*RM, components.replace(", kwargs: {a: 1}", "")]) == {}


def test_weighted_components_must_include_the_custom_function_and_the_reward_model(tmp_path):
    # Either would otherwise be loaded and its score count nowhere (the custom function's
    # case failed as the run started).
    custom = f"custom_reward_function.path={tmp_path / 'reward.py'}"
    rule_only = "reward.components=[{name: tiny_arithmetic}]"
    found = errors([custom, rule_only])
    assert found.keys() == {"custom_reward_function.path"}
    assert (
        "add {name: custom, weight: ...} to reward.components"
        in found["custom_reward_function.path"]
    )
    assert errors([custom, "reward.components=[{name: tiny_arithmetic}, {name: custom}]"]) == {}
    found = errors([*RM, rule_only])
    assert found.keys() == {"reward_model.enable"}
    assert "or set reward_model.enable=False" in found["reward_model.enable"]
    # With no components, the reward model's score is the reward (as verl).
    assert errors(RM) == {}


def test_the_custom_function_left_out_of_the_components_failed_at_start(tmp_path):
    # What the validator now refuses is what the reward manager refuses as the run starts.
    from engine.trainer.build import build_reward_manager

    path = tmp_path / "reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    config = load_config(
        "grpo_tiny",
        [f"custom_reward_function.path={path}", "reward.components=[{name: tiny_arithmetic}]"],
    )
    with pytest.raises(ValueError, match="give either compute_score or components"):
        build_reward_manager(resolve_config(config), None)


# -- tiny:// names --------------------------------------------------------------------------
def test_an_unknown_tiny_name_is_refused_naming_the_key_and_every_valid_name():
    found = errors(
        ["data.train_files=tiny://nope.parquet", "data.val_files=[tiny://val.parquet, tiny://x]"],
        check_files=True,
    )
    valid = ", ".join(TINY_URIS)
    assert found == {
        "data.train_files": f"tiny://nope.parquet names no embedded asset; use one of {valid}, "
        "or a local path",
        "data.val_files": f"tiny://x names no embedded asset; use one of {valid}, or a local path",
    }
    assert "tiny://calculator/tools.yaml" in valid and "tiny://reward_model" in valid


@pytest.mark.parametrize(
    "key",
    [
        "actor_rollout_ref.model.path",
        "actor_rollout_ref.model.tokenizer_path",
        "critic.model.path",
        "reward_model.model.path",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
        "trainer.resume_from_path",
    ],
)
def test_every_path_key_is_checked(key):
    assert errors([f"{key}=tiny://nope"]).get(key, "").startswith("tiny://nope names no embedded")


def test_known_names_pass_a_key_filled_by_reference_is_checked_and_code_is_not_an_asset():
    for uri in TINY_URIS:
        assert "data.train_files" not in errors([f"data.train_files={uri}"], check_files=True)
    found = errors(
        [
            "actor_rollout_ref.model.path=tiny://modle",
            "critic.model.path=${actor_rollout_ref.model.path}",
        ]
    )
    assert found.keys() == {"actor_rollout_ref.model.path", "critic.model.path"}
    # A key left null that takes the model's path is not reported a second time.
    assert errors(["actor_rollout_ref.model.path=tiny://modle"]).keys() == {
        "actor_rollout_ref.model.path"
    }
    found = errors(["custom_reward_function.path=tiny://model"])
    assert found == {
        "custom_reward_function.path": "tiny:// names the embedded data and models, not code; "
        "point it at a Python file"
    }


def test_checking_tiny_names_builds_and_imports_nothing():
    code = (
        "import sys\n"
        "from engine.config import ConfigValidationError, load_config, validate_config\n"
        "try:\n"
        "    validate_config(load_config('grpo_tiny', ['data.train_files=tiny://nope']))\n"
        "except ConfigValidationError as exc:\n"
        "    assert [e.key for e in exc.errors] == ['data.train_files'], exc\n"
        "assert 'engine.tiny' not in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_embedded_names_are_engine_tinys():
    from engine.tiny import REWARD_MODEL_URI, URI_FIELDS, URI_PREFIX

    assert (*(URI_PREFIX + name for name in URI_FIELDS), REWARD_MODEL_URI) == EMBEDDED_URIS
