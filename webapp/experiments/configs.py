"""The studio's rules on top of the engine's config validator.

The engine's ``validate_config`` is the one validator for the CLI, the form and the API; the
studio adds only what a shared server needs, reported in the same ``ConfigFieldError`` shape so a
form shows every problem next to its field. The schema says what each string names (its
``resource``), so a new key is covered by the rule of its kind:

- ``path`` (data files, model and tokenizer folders, a checkpoint to resume from): checked on the
  resolved config (``${...}`` substituted, ``~``, ``..`` and symlinks resolved). A run reads only
  the owner's uploaded datasets, the folders of the owner's own runs (checkpoints, exports),
  ``tiny://`` assets and the folders an administrator lists in ``POSTTRAIN_MODEL_ROOTS``.
- ``code`` (the custom reward function, the multi-turn interaction): Python code runs only from
  the installed reward modules (``POSTTRAIN_REWARD_MODULES_DIR``).
- ``module`` (``external_lib``): importing a module by name is not available from the studio.
- ``server`` (``ray_init.*``, the checkpoint folder): the server sets them; any other value than
  the schema's default is refused (the folder ``run_create`` gave one of the owner's runs passes).

What a dict-valued key holds (``override_config``, engine and reward kwargs) is the engine's
rule (``engine.config.mappings``): data only, never a loader argument or code, so the rules above
cannot be stepped around from inside one; a file a reward function's keyword names (the rules
with ``files``) is checked here as a ``path`` is.

An error names the key, the value as typed and the places allowed, never where a refused value
leads on the server. Empty values are always allowed.
"""

from __future__ import annotations

import copy
import re
import warnings
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from engine.config import (
    ConfigFieldError,
    ConfigValidationError,
    PPOConfig,
    config_from_dict,
    get_value,
    resolve_config,
    validate_config,
)
from engine.config.keys import resolve_key, schema_keys
from engine.config.mappings import MAPPING_RULES, files_named, mapping_values
from webapp.experiments.rewards import reward_modules_dir

_TINY = "tiny://"


@cache
def resource_keys(resource: str) -> tuple[str, ...]:
    """Return the schema's keys whose field names a ``resource`` (path, code, module, server)."""
    return tuple(
        key
        for key in schema_keys()
        if (field := resolve_key(key).field) is not None
        and field.metadata.get("resource") == resource
    )


# Keys the studio sets for each run; the form does not show them.
STUDIO_MANAGED_KEYS = (
    *resource_keys("server"),
    "trainer.resume_mode",
    "trainer.resume_from_path",
)


def as_config(config: PPOConfig | dict[str, Any]) -> PPOConfig:
    """Return ``config`` as a ``PPOConfig`` (a dict is read with ``config_from_dict``)."""
    return config if isinstance(config, PPOConfig) else config_from_dict(dict(config))


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def model_roots() -> list[tuple[str, Path]]:
    """Return ``POSTTRAIN_MODEL_ROOTS`` as (entry as configured, resolved folder) pairs.

    Raise ``ImproperlyConfigured`` for an entry that is not an absolute path (``~`` allowed).
    """
    roots = []
    for entry in re.split(r"[:,]", str(getattr(settings, "POSTTRAIN_MODEL_ROOTS", "") or "")):
        entry = entry.strip()
        if not entry:
            continue
        folder = Path(entry).expanduser()
        if not folder.is_absolute():
            raise ImproperlyConfigured(
                f"POSTTRAIN_MODEL_ROOTS entry {entry!r} is not an absolute path; list folders "
                "such as /srv/models or ~/models, separated by ':' or ','"
            )
        roots.append((entry, folder.resolve()))
    return roots


def allowed_places() -> str:
    """Return, for an error message, where a run may read from (roots as configured)."""
    roots = [entry for entry, _ in model_roots()]
    admin = (
        f"the model roots {', '.join(roots)}"
        if roots
        else "the model roots an administrator lists in POSTTRAIN_MODEL_ROOTS (none yet)"
    )
    return (
        "a run reads only your uploaded datasets, your own runs' checkpoints and exports, "
        f"tiny:// assets and {admin}"
    )


def _own_run_folder(owner: Any, path: Path) -> bool:
    """Return True when ``path`` lies in the folder of a run ``owner`` may read (their own or a
    project's: its checkpoints are exports a reader may download anyway)."""
    from webapp.projects.access import visible_runs
    from webapp.runs.models import run_dir

    runs = run_dir(0).parent.expanduser().resolve()
    if not _inside(path, runs) or path == runs:
        return False
    run_id = path.relative_to(runs).parts[0]
    return (
        run_id.isdecimal()
        and _inside(path, run_dir(int(run_id)).expanduser().resolve())
        and visible_runs(owner).filter(pk=int(run_id)).exists()
    )


def _path_error(owner: Any, key: str, value: str) -> ConfigFieldError | None:
    """Return why ``owner``'s run may not read ``value`` (resolved), or None if it may."""
    from webapp.datasets.selectors import DatasetUnusable, dataset_usable_for

    if value.startswith(_TINY):
        return None
    place = Path(value).expanduser()
    if place.is_absolute():
        resolved = place.resolve()
        uploads = Path(settings.MEDIA_ROOT).expanduser().resolve()
        if _inside(resolved, uploads):
            try:
                dataset_usable_for(owner=owner, path=str(resolved))
            except DatasetUnusable as exc:
                return ConfigFieldError(key, value, f"{exc} ({allowed_places()})")
            return None
        if _own_run_folder(owner, resolved):
            return None
        if any(_inside(resolved, root) for _, root in model_roots()):
            return None
    return ConfigFieldError(key, value, f"not a place a run may read: {allowed_places()}")


def _values(value: Any) -> list[str]:
    return [v for v in ([value] if isinstance(value, str) else value or []) if v]


def studio_config_errors(*, owner: Any, config: PPOConfig) -> list[ConfigFieldError]:
    """Return the problems the studio's own rules find in ``config`` for ``owner``."""
    try:
        resolved = resolve_config(copy.deepcopy(config))
    except ConfigFieldError as exc:
        return [exc]  # the paths cannot be checked before the references are fixed
    errors = []
    defaults = PPOConfig()
    for key in resource_keys("server"):
        value = get_value(config, key)
        if value == get_value(defaults, key):
            continue
        if isinstance(value, str) and _own_run_folder(owner, Path(value).expanduser().resolve()):
            continue  # the checkpoint folder run_create gave this owner's run
        errors.append(
            ConfigFieldError(
                key,
                value,
                f"the server sets {key}, not the experiment; leave it at its default "
                f"({get_value(defaults, key)!r})",
            )
        )
    for key in resource_keys("module"):
        if get_value(config, key):
            errors.append(
                ConfigFieldError(
                    key,
                    get_value(config, key),
                    "importing a Python module is not available from the studio; leave it "
                    "empty or ask an administrator to install the code as a reward module",
                )
            )
    loggers = config.trainer.logger
    if "posttrain" in ([loggers] if isinstance(loggers, str) else list(loggers or [])):
        errors.append(
            ConfigFieldError(
                "trainer.logger",
                loggers,
                "posttrain reports a run started by hand to a studio; a run the studio "
                "launches records itself here already: remove posttrain from trainer.logger",
            )
        )
    modules = reward_modules_dir()
    for key in resource_keys("code"):
        typed, value = get_value(config, key), get_value(resolved, key)
        if typed and not _inside(Path(value).expanduser().resolve(), modules):
            errors.append(
                ConfigFieldError(
                    key,
                    typed,
                    f"code runs only from the reward modules installed in {modules}; "
                    "choose one of them (an administrator adds new ones there)",
                )
            )
    for key in resource_keys("path"):
        typed = _values(get_value(config, key))  # null and empty: inherited or unused
        for shown, value in zip(typed, _values(get_value(resolved, key)), strict=False):
            error = _path_error(owner, key, value)
            if error is not None:
                errors.append(ConfigFieldError(key, shown, error.message))
    for key in (key for key, rule in MAPPING_RULES.items() if rule.files):
        for where, mapping in mapping_values(resolved, key):
            for at, value in files_named(where, mapping):
                error = _path_error(owner, at, value)
                if error is not None:
                    errors.append(error)
    return errors


def config_check(*, owner: Any, config: PPOConfig) -> list[str]:
    """Validate ``config`` with the engine and the studio's rules; return the engine's warnings.

    First every upload the config names gets its dataset's key map and data_source
    (``attach_dataset_maps``, which changes ``config``: it is what the run will read); then the
    data files are checked against their key maps, rewards and prompt length
    (``webapp.experiments.datachecks``).

    Raise ``ConfigValidationError`` listing every problem of both. Where the studio refuses a
    key, the engine's findings on it are left out: whether a file the owner may not read exists
    is none of their business.
    """
    from webapp.experiments.datachecks import attach_dataset_maps, data_contract_problems

    attach_dataset_maps(owner=owner, config=config)
    studio = studio_config_errors(owner=owner, config=config)
    refused = {error.key for error in studio}
    # A refused model folder's config.json decided which override_config keys passed: leave
    # those findings out too (the critic reads the policy's folder when it names none).
    hidden = tuple(
        f"{key.removesuffix('.path')}.override_config."
        for key in refused
        if key.endswith("model.path")
    )
    if "actor_rollout_ref.model.path" in refused and not config.critic.model.path:
        hidden += ("critic.model.override_config.",)
    try:
        warnings, engine = validate_config(config, check_files=True), []
    except ConfigValidationError as exc:
        warnings = exc.warnings
        engine = [e for e in exc.errors if e.key not in refused and not e.key.startswith(hidden)]
    contract, contract_warnings = data_contract_problems(
        config=config, skip=refused | {e.key for e in engine}
    )
    warnings = [*warnings, *contract_warnings]
    if engine or studio or contract:
        raise ConfigValidationError([*engine, *studio, *contract], warnings)
    return warnings


def missing_files(config: PPOConfig) -> list[tuple[str, str]]:
    """Return (key, value) for each model folder or data file ``config`` names that this server
    does not have (a preset written for a GPU machine); ``tiny://`` and remote paths excluded."""
    missing = []
    for key in resource_keys("path"):
        for value in _values(get_value(config, key)):
            if value.startswith(_TINY) or "://" in value or "${" in value:
                continue
            if not Path(value).expanduser().exists():
                missing.append((key, value))
    return missing


def model_roots_text() -> str:
    """Return where a model folder may be, for a notice: the model roots, or who sets them."""
    roots = [entry for entry, _ in model_roots()]
    if roots:
        return f"a Hugging Face model folder under {', '.join(roots)} (POSTTRAIN_MODEL_ROOTS)"
    return (
        "a Hugging Face model folder under one of the model roots an administrator lists in "
        "POSTTRAIN_MODEL_ROOTS (none yet), or at tiny://model"
    )


# -- presets and YAML import -------------------------------------------------------------------

PRESET_LABELS = {
    "grpo_tiny": "GRPO on the tiny model (CPU, minutes)",
    "ppo_tiny": "PPO with a critic on the tiny model (CPU)",
    "dapo_tiny": "DAPO (dynamic sampling, overlong penalty) on the tiny model (CPU)",
    "grpo_tiny_otb": "GRPO with the Optimal Token Baseline on the tiny model (CPU)",
    "grpo_tiny_rm": "GRPO rewarded by the tiny reward model alone (CPU; first use builds it)",
    "grpo_tiny_rollout_corr": "GRPO with rollout correction (bypass mode) on the tiny model (CPU)",
    "grpo_tiny_one_step_off": (
        "GRPO one step off-policy: the next batch generates while this one trains (CPU)"
    ),
    "grpo_tiny_fully_async": (
        "GRPO fully async: a rollout worker streams into a bounded queue, at most two updates "
        "stale (CPU)"
    ),
    "grpo_tiny_calculator": (
        "GRPO with a calculator tool on three-digit addition (CPU; first use builds the task)"
    ),
    "grpo_tiny_interpreter": (
        "GRPO with a sandboxed Python interpreter on three-digit multiplication (CPU; first use "
        "builds the task)"
    ),
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


def config_import_yaml(text: str, *, base: str = "") -> PPOConfig:
    """Return ``config_import``'s config."""
    return config_import(text, base=base)[0]


def config_import(text: str, *, base: str = "") -> tuple[PPOConfig, str]:
    """Return the config and the preset it builds on ("" for none).

    Read a config from pasted text as the CLI would: YAML (sections or dotted keys, with
    ``defaults:`` naming presets only), or verl's ``key=value`` override lines (one per line, or
    a ``python3 -m verl.trainer.main_ppo ...`` command line) applied to the preset ``base``
    (verl's ``ppo_trainer`` defaults when empty).

    Raise ``ConfigError`` (a ``ConfigValidationError`` listing every bad line for overrides) with
    the engine's message when the text is not a valid config.
    """
    from engine.config import ConfigError, config_from_yaml, override_lines
    from engine.config.yaml_io import yaml_load

    problem: ConfigError | None = None
    try:
        data = yaml_load(text, "the imported YAML")
    except ConfigError as exc:
        data, problem = None, exc
    if isinstance(data, dict) and not any("=" in str(key) for key in data):
        entries = data.get("defaults", [])
        entries = (entries if isinstance(entries, list) else [entries]) + (
            [data["base"]] if "base" in data else []
        )
        presets = dict(list_presets())
        names = [str(e).removesuffix(".yaml").removesuffix(".yml") for e in entries]
        for entry, name in zip(entries, names, strict=True):
            if entry != "_self_" and name not in presets:
                raise ConfigError(
                    f"defaults entry {entry!r}: an imported config may build only on the "
                    f"presets ({', '.join(presets)})"
                )
        built_on = [n for n in names if n != "_self_"]
        return config_from_yaml(text), built_on[-1] if len(built_on) == 1 else ""
    overrides = override_lines(text)
    if overrides is None:
        raise problem or ConfigError(
            "the text is neither YAML sections (data:, trainer:, ...) nor key=value override "
            "lines (algorithm.adv_estimator=grpo, one per line, as on verl's command line)"
        )
    return _config_from_overrides(base or "ppo_trainer", overrides), base


def _config_from_overrides(base: str, overrides: list[str]) -> PPOConfig:
    from engine.config import load_config

    preset_load(base)  # refuses a name that is not a preset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # +key for unknown keys: kept in extras, as the CLI does
        return load_config(base, overrides, all_errors=True)
