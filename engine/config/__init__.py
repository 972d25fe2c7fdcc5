"""PostTrain Studio's configuration: verl's keys as typed dataclasses, one schema for all.

The CLI (``python -m engine.main_ppo key=value ...``), the YAML presets in ``engine/configs`` and
the web form all load, check and describe a run through this package.

A key's section module holds its field (help, default, choices, bounds) and, at its end, the
section's rules (``data_problems``, ...)::

    data.*                                          data.py
    actor_rollout_ref.model.*, .actor.*, .ref.*     actor.py
    actor_rollout_ref.rollout.*                     rollout.py
    critic.*                                        critic.py
    reward_model.*, custom_reward_function.*,
    reward.*, reward_manager.*                      reward.py
    algorithm.*                                     algorithm.py
    trainer.*, ray_init.*, ray_kwargs.*             trainer.py
    rollout.*, async_training.* (one-step-off and
    fully-async; actor_rollout_ref.hybrid_engine)   async_training.py
    verl's sections with no engine behind them      unsupported.py (global_profiler, ...)

``schema.py`` is the root (``PPOConfig``); ``fields.py`` makes the fields and holds the limits and
errors; ``validate.py`` checks what every key's metadata says and gathers the sections' rules;
``resolve.py`` fills in what verl interpolates and checks verl's legacy keys; ``loader.py`` reads
presets, ``overrides.py`` the command line and ``yaml_io.py`` every YAML text; ``keys.py`` maps
dotted keys and their types; ``introspect.py`` lists the fields for forms; ``tables.py`` writes
docs/config.md; ``aliases.py`` maps a tutorial's spellings to verl's keys. Two helpers of the
rules: ``files.py`` checks the files and folders a key names, ``reward_kwargs.py`` what each
reward manager reads from ``reward_model.reward_kwargs``. The package imports no section of the
engine above it: only the name lists of ``engine.*.names``.
"""

from engine.config.actor import ActorConfig, ActorRolloutRefConfig, ModelConfig
from engine.config.algorithm import AlgorithmConfig
from engine.config.aliases import install_section_aliases
from engine.config.critic import CriticConfig
from engine.config.data import DataConfig
from engine.config.fields import ConfigError, ConfigFieldError, ConfigValidationError
from engine.config.introspect import FieldSpec, get_value, iter_field_specs, set_value
from engine.config.keys import config_to_dict
from engine.config.loader import config_from_dict, config_from_yaml, config_to_yaml, load_config
from engine.config.overrides import apply_overrides, override_lines, parse_override
from engine.config.resolve import resolve_config
from engine.config.reward import RewardComponent, RewardConfig
from engine.config.rollout import RolloutConfig
from engine.config.schema import PPOConfig
from engine.config.trainer import TrainerConfig
from engine.config.validate import validate_config

install_section_aliases()

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ConfigError",
    "ConfigFieldError",
    "ConfigValidationError",
    "CriticConfig",
    "DataConfig",
    "FieldSpec",
    "ModelConfig",
    "PPOConfig",
    "RewardComponent",
    "RewardConfig",
    "RolloutConfig",
    "TrainerConfig",
    "apply_overrides",
    "override_lines",
    "config_from_dict",
    "config_from_yaml",
    "config_to_dict",
    "config_to_yaml",
    "get_value",
    "iter_field_specs",
    "load_config",
    "parse_override",
    "resolve_config",
    "set_value",
    "validate_config",
]
