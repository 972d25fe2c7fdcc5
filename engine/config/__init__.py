"""PostTrain Studio's configuration: verl's keys as typed dataclasses, one schema for all.

The CLI (``python -m engine.main_ppo key=value ...``), the YAML presets in ``engine/configs`` and
the web form all load, check and describe a run through this package.
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
from engine.config.overrides import apply_overrides, parse_override
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
