"""The studio's rules on top of the engine's config validator.

The engine's ``validate_config`` is the one validator for the CLI, the form and the API; the
studio adds only what a shared server needs, reported in the same ``ConfigFieldError`` shape so a
form shows every problem next to its field:

- Python code runs only from the installed reward modules (``POSTTRAIN_REWARD_MODULES_DIR``):
  ``custom_reward_function.path`` and the multi-turn interaction file must lie there, and the
  model's ``external_lib`` import is not available from the studio.
- A data file under the upload directory must be one of the owner's own datasets.
- Checkpoint and resume locations belong to the run: ``run_create`` sets them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from engine.config import (
    ConfigFieldError,
    ConfigValidationError,
    PPOConfig,
    config_from_dict,
    get_value,
    validate_config,
)
from webapp.experiments.rewards import reward_modules_dir

# Keys the studio sets for each run; the form does not show them.
STUDIO_MANAGED_KEYS = (
    "trainer.default_local_dir",
    "trainer.resume_mode",
    "trainer.resume_from_path",
)
CODE_PATH_KEYS = (
    "custom_reward_function.path",
    "actor_rollout_ref.rollout.multi_turn.interaction_path",
)
FORBIDDEN_KEYS = ("actor_rollout_ref.model.external_lib", "critic.model.external_lib")
DATA_PATH_KEYS = ("data.train_files", "data.val_files")


def as_config(config: PPOConfig | dict[str, Any]) -> PPOConfig:
    """Return ``config`` as a ``PPOConfig`` (a dict is read with ``config_from_dict``)."""
    return config if isinstance(config, PPOConfig) else config_from_dict(dict(config))


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def studio_config_errors(*, owner: Any, config: PPOConfig) -> list[ConfigFieldError]:
    """Return the problems the studio's own rules find in ``config`` for ``owner``."""
    from webapp.datasets.models import Dataset

    errors = []
    modules = reward_modules_dir()
    for key in CODE_PATH_KEYS:
        value = get_value(config, key)
        if value and not _inside(Path(value).expanduser().resolve(), modules):
            errors.append(
                ConfigFieldError(
                    key,
                    value,
                    f"code runs only from the reward modules installed in {modules}; "
                    "choose one of them (an administrator adds new ones there)",
                )
            )
    for key in FORBIDDEN_KEYS:
        value = get_value(config, key)
        if value:
            errors.append(
                ConfigFieldError(
                    key,
                    value,
                    "importing a Python module is not available from the studio; leave it "
                    "empty or ask an administrator to install the code as a reward module",
                )
            )
    uploads = Path(settings.MEDIA_ROOT).expanduser().resolve()
    for key in DATA_PATH_KEYS:
        value = get_value(config, key)
        paths = [value] if isinstance(value, str) else list(value or [])
        for path in paths:
            resolved = Path(path).expanduser().resolve()
            if not _inside(resolved, uploads):
                continue
            owned = Dataset.objects.filter(
                owner=owner, file=str(resolved.relative_to(uploads))
            ).exists()
            if not owned:
                errors.append(
                    ConfigFieldError(
                        key, path, "this file is not one of your datasets; upload it or pick one"
                    )
                )
    return errors


def config_check(*, owner: Any, config: PPOConfig) -> list[str]:
    """Validate ``config`` with the engine and the studio's rules; return the engine's warnings.

    Raise ``ConfigValidationError`` listing every problem of both.
    """
    errors = studio_config_errors(owner=owner, config=config)
    try:
        warnings = validate_config(config, check_files=True)
    except ConfigValidationError as exc:
        raise ConfigValidationError([*exc.errors, *errors], exc.warnings) from None
    if errors:
        raise ConfigValidationError(errors, warnings)
    return warnings


# -- presets and YAML import -------------------------------------------------------------------

PRESET_LABELS = {
    "grpo_tiny": "GRPO on the tiny model (CPU, minutes)",
    "ppo_tiny": "PPO with a critic on the tiny model (CPU)",
    "grpo_gsm8k": "GRPO on GSM8K-style math (GPU)",
    "ppo_trainer": "verl's ppo_trainer defaults",
}
DEFAULT_PRESET = "grpo_tiny"


def preset_dir() -> Path:
    """Return the engine's folder of YAML presets."""
    from engine.config.loader import CONFIG_DIR

    return Path(CONFIG_DIR)


def list_presets() -> list[tuple[str, str]]:
    """Return (name, label) for every preset YAML in the engine, the labelled ones first."""
    names = sorted(p.stem for p in preset_dir().glob("*.yaml"))
    known = [n for n in PRESET_LABELS if n in names]
    return [(n, PRESET_LABELS.get(n, n)) for n in known + [n for n in names if n not in known]]


def preset_load(name: str) -> PPOConfig:
    """Return the preset ``name`` (only names in the engine's preset folder, never a path)."""
    from engine.config import ConfigError, load_config

    if name not in dict(list_presets()):
        choices = ", ".join(n for n, _ in list_presets()) or "none installed"
        raise ConfigError(f"preset {name!r} does not exist; choose one of: {choices}")
    return load_config(name)


def config_import_yaml(text: str) -> PPOConfig:
    """Read a config from YAML text as the CLI would, allowing ``defaults:`` to name presets only.

    Raise ``ConfigError`` with the engine's message when the YAML is not a valid config.
    """
    from engine.config import ConfigError, config_from_yaml
    from engine.config.loader import yaml_load

    data = yaml_load(text, "the imported YAML")
    if isinstance(data, dict):
        entries = data.get("defaults", [])
        entries = (entries if isinstance(entries, list) else [entries]) + (
            [data["base"]] if "base" in data else []
        )
        presets = dict(list_presets())
        for entry in entries:
            name = str(entry).removesuffix(".yaml").removesuffix(".yml")
            if entry != "_self_" and name not in presets:
                raise ConfigError(
                    f"defaults entry {entry!r}: an imported config may build only on the "
                    f"presets ({', '.join(presets)})"
                )
    return config_from_yaml(text)
