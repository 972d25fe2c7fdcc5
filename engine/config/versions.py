"""Which verl releases have each key: verl 0.7 and verl's main branch, one table.

The schema holds every key of both releases' generated FSDP trainer config
(``verl/trainer/config/_generated_ppo_trainer.yaml``), so a file written for either loads
unchanged. Most keys are in both; the tables below name the ones that are not, and the keys that
are in neither (the engine's own, or from verl's recipes such as DAPO). ``docs/config.md`` shows
:func:`verl_releases` beside each key; a test reads both of verl's files and checks these tables
against them.

A table entry names a key or a section (every key under it).
"""

from __future__ import annotations

VERL_RELEASE = "0.7"
VERL_MAIN = "main (0.8.0.dev)"

# In verl main's generated config, not in 0.7's.
ADDED_IN_MAIN = (
    "actor_rollout_ref.actor.use_prefix_grouper",
    "actor_rollout_ref.actor.calculate_sum_pi_squared",
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing",
    "actor_rollout_ref.actor.profiler.tool_config.torch.contents",
    "actor_rollout_ref.actor.profiler.tool_config.torch.discrete",
    "actor_rollout_ref.ref.profiler.tool_config.torch.contents",
    "actor_rollout_ref.ref.profiler.tool_config.torch.discrete",
    "critic.profiler.tool_config.torch.contents",
    "critic.profiler.tool_config.torch.discrete",
    "actor_rollout_ref.model.mtp",
    "actor_rollout_ref.rollout.mtp",
    "actor_rollout_ref.rollout.checkpoint_engine",
    "actor_rollout_ref.rollout.scheduling_policy",
    "actor_rollout_ref.rollout.engine_kwargs.trtllm",
)

# In verl 0.7's generated config, gone from main's (each still read here).
REMOVED_IN_MAIN = (
    "actor_rollout_ref.actor.profiler.tool_config.torch.step_start",
    "actor_rollout_ref.actor.profiler.tool_config.torch.step_end",
    "actor_rollout_ref.ref.profiler.tool_config.torch.step_start",
    "actor_rollout_ref.ref.profiler.tool_config.torch.step_end",
    "critic.profiler.tool_config.torch.step_start",
    "critic.profiler.tool_config.torch.step_end",
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
    "algorithm.rollout_correction.rollout_rs_threshold_lower",
    "algorithm.rollout_correction.rollout_token_veto_threshold",
)

# In neither generated config: the engine's own keys and those of verl's recipes.
NOT_IN_VERL = (
    "data.gen_batch_size",
    "data.data_key_map",
    "data.file_key_maps",
    "data.file_data_sources",
    "actor_rollout_ref.actor.use_rollout_log_probs",
    "rollout",  # verl's one-step-off and fully-async trainers' own configs
    "async_training",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision",
    "actor_rollout_ref.actor.policy_loss.geo_mean_global_batch",
    "actor_rollout_ref.actor.seq_mean_token_sum_norm_times_dp",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision",
    "actor_rollout_ref.rollout.enable_sleep_mode",
    "actor_rollout_ref.rollout.server",  # a field of verl main's RolloutConfig, not its YAML
    "actor_rollout_ref.rollout.sglang_rollout_mode",  # in verl's example configs until #4422
    "actor_rollout_ref.rollout.multi_turn.interaction_path",
    "actor_rollout_ref.rollout.multi_turn.interaction_name",
    "critic.model.fsdp_config.mixed_precision",
    "critic.seq_mean_token_sum_norm_times_dp",
    "reward_model.reward_kwargs",
    "reward_model.overlong_buffer",
    "reward_model.judge",
    # verl's rate_limited reward manager reads these as +reward_model.* (not in its yaml).
    "reward_model.max_rpm",
    "reward_model.max_tpm",
    "reward_model.estimated_tokens_per_request",
    "reward_model.timeout",
    "custom_reward_function.reward_kwargs",
    "reward",
    "algorithm.kl_ctrl.kp",
    "algorithm.kl_ctrl.ki",
    "algorithm.kl_ctrl.kd",
    "algorithm.allow_single_sample_groups",
    "algorithm.filter_groups",
    "trainer.log_freq",
    "trainer.controller",
    "trainer.seed",
    "ray_init",
)


def _listed(key: str, table: tuple[str, ...]) -> bool:
    return any(key == entry or key.startswith(entry + ".") for entry in table)


def verl_releases(key: str) -> str:
    """Return which of verl's releases have ``key``: ``0.7, main``, ``main``, ``0.7`` or ``-``."""
    if _listed(key, NOT_IN_VERL):
        return "-"
    if _listed(key, ADDED_IN_MAIN):
        return f"added in {VERL_MAIN}"
    if _listed(key, REMOVED_IN_MAIN):
        return f"{VERL_RELEASE}; removed in {VERL_MAIN}"
    return f"{VERL_RELEASE}, main"
