"""The spellings of verl tutorials and blog posts, each mapped to verl's real keys in one table.

Users arrive with snippets that say ``algorithm.name: grpo``, ``trainer.total_steps: 200`` or
``data.train_dataset_path``. verl itself has no such keys; each is translated here to the keys
verl has (``algorithm.adv_estimator``, ``trainer.total_training_steps``, ``data.train_files``),
and a note naming the verl key is printed once per process, so the user learns the real name.

Where they are read: in every YAML file and mapping before its ``defaults:`` are merged (so a
file that sets an alias and its verl key to different values fails, naming both), in
command-line overrides (``trainer.total_steps=5`` sets ``trainer.total_training_steps``, so an
alias overrides a preset as its verl key would), and as attributes of the config sections where
the alias and its keys share a section (``config.data.train_dataset_path = ...``). Anything a
snippet says that has no verl meaning fails with what to write instead: nothing is accepted and
then ignored.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.algorithms.names import ADV_ESTIMATORS
from engine.config.fields import ATTRIBUTE_HINTS, ConfigFieldError
from engine.config.schema import PPOConfig
from engine.config.tree import get_in, put
from engine.rewards.names import REWARD_COMPONENTS


@dataclass(frozen=True)
class Alias:
    """A tutorial key: the verl keys it sets, how its value becomes theirs, and why."""

    key: str
    targets: tuple[str, ...]
    translate: Callable[[Any], dict[str, Any]]
    note: str


def _same(target: str) -> Callable[[Any], dict[str, Any]]:
    return lambda value: {target: value}


def _algorithm_name(value: Any) -> dict[str, Any]:
    name = str(value).strip().lower()
    if name == "ppo":  # PPO proper: GAE advantages from a learned value model
        return {"algorithm.adv_estimator": "gae", "critic.enable": True}
    if name in ADV_ESTIMATORS:
        return {"algorithm.adv_estimator": name}
    raise ConfigFieldError(
        "algorithm.name",
        value,
        f"not an algorithm; use ppo (GAE with a critic) or an advantage estimator: "
        f"{', '.join(ADV_ESTIMATORS)} (verl's key is algorithm.adv_estimator)",
    )


def _kl_coeff(value: Any) -> dict[str, Any]:
    return {"algorithm.kl_ctrl.kl_coef": value, "algorithm.use_kl_in_reward": True}


DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


def _model_dtype(key: str) -> Callable[[Any], dict[str, Any]]:
    def translate(value: Any) -> dict[str, Any]:
        dtype = DTYPES.get(str(value).strip().lower().removeprefix("torch."))
        if dtype is None:
            raise ConfigFieldError(key, value, f"not a dtype; use one of {', '.join(DTYPES)}")
        return {"actor_rollout_ref.rollout.dtype": dtype}

    return translate


MODEL_DTYPE_NOTE = (
    "verl trains fp32 master weights in bf16 on a GPU "
    "(actor_rollout_ref.actor.fsdp_config.mixed_precision) and names the dtype the "
    "model generates in actor_rollout_ref.rollout.dtype"
)


ALIASES: dict[str, Alias] = {
    alias.key: alias
    for alias in (
        Alias(
            "algorithm.name",
            ("algorithm.adv_estimator", "critic.enable"),
            _algorithm_name,
            "verl names the algorithm by its advantage estimator: algorithm.adv_estimator "
            "(ppo is gae with a critic, critic.enable=True)",
        ),
        Alias(
            "algorithm.kl_coeff",
            ("algorithm.kl_ctrl.kl_coef", "algorithm.use_kl_in_reward"),
            _kl_coeff,
            "verl's KL penalty in the reward is algorithm.kl_ctrl.kl_coef with "
            "algorithm.use_kl_in_reward=True (a KL loss instead: "
            "actor_rollout_ref.actor.use_kl_loss and kl_loss_coef)",
        ),
        Alias(
            "algorithm.clip_range",
            ("actor_rollout_ref.actor.clip_ratio",),
            _same("actor_rollout_ref.actor.clip_ratio"),
            "verl's PPO clip range is actor_rollout_ref.actor.clip_ratio",
        ),
        Alias(
            "data.train_dataset_path",
            ("data.train_files",),
            _same("data.train_files"),
            "verl's training data key is data.train_files",
        ),
        Alias(
            "data.val_dataset_path",
            ("data.val_files",),
            _same("data.val_files"),
            "verl's validation data key is data.val_files",
        ),
        Alias(
            "data.data_key_map.answer",
            ("data.data_key_map.ground_truth",),
            _same("data.data_key_map.ground_truth"),
            "the answer column feeds the reward's ground truth: data.data_key_map.ground_truth",
        ),
        Alias(
            "actor_rollout_ref.model.dtype",
            ("actor_rollout_ref.rollout.dtype",),
            _model_dtype("actor_rollout_ref.model.dtype"),
            MODEL_DTYPE_NOTE,
        ),
        Alias(  # verl's CISPO example script writes it (verl itself has no such key)
            "actor_rollout_ref.model.torch_dtype",
            ("actor_rollout_ref.rollout.dtype",),
            _model_dtype("actor_rollout_ref.model.torch_dtype"),
            MODEL_DTYPE_NOTE,
        ),
        Alias(
            "trainer.total_steps",
            ("trainer.total_training_steps",),
            _same("trainer.total_training_steps"),
            "verl's step limit is trainer.total_training_steps",
        ),
        Alias(
            "trainer.log_interval",
            ("trainer.log_freq",),
            _same("trainer.log_freq"),
            "verl records metrics every step; the console prints every trainer.log_freq steps",
        ),
        Alias(
            "trainer.save_interval",
            ("trainer.save_freq",),
            _same("trainer.save_freq"),
            "verl's checkpoint interval is trainer.save_freq",
        ),
    )
}

# ``reward_model: {name: ..., config: {...}}`` is one alias over two keys (read together).
REWARD_ALIAS_NOTE = (
    "verl scores with rule rewards by data_source, a reward.components list (PostTrain) or "
    "custom_reward_function.path/name; reward_model.* is verl's learned reward model"
)
REWARD_NAMES = ("rule_based", "custom_reward")

_noted: set[str] = set()


def note_once(key: str, note: str) -> None:
    """Print ``note`` for alias ``key`` the first time this process meets it."""
    if key not in _noted:
        _noted.add(key)
        print(f"note: {key} is not a verl key; {note}", file=sys.stderr)


def is_alias_key(key: str) -> bool:
    """Return True for a tutorial key this table translates (overrides check it first)."""
    return (
        key in ALIASES
        or key in ("reward_model.name", "reward_model.config")
        or (key.startswith("reward_model.config."))
    )


def translate(key: str, value: Any) -> dict[str, Any]:
    """Return the verl keys and values that alias ``key`` set to ``value`` stands for."""
    alias = ALIASES[key]
    note_once(key, alias.note)
    return alias.translate(value)


def _pop(tree: dict, parts: list[str]) -> None:
    found, parent = get_in(tree, parts[:-1])
    if found and isinstance(parent, dict):
        parent.pop(parts[-1], None)
        if not parent and len(parts) > 1:
            _pop(tree, parts[:-1])  # leave no empty section behind


def _module_file(module_path: Any) -> dict[str, Any]:
    """Return ``custom_reward_function`` keys for ``"package.module.function"``."""
    text = str(module_path or "")
    module, _, function = text.rpartition(".")
    if not module or not function:
        raise ConfigFieldError(
            "reward_model.config.module_path",
            module_path,
            "write module.function, e.g. my_reward.my_reward_fn (a my_reward.py beside the run "
            "or on the Python path); verl's keys are custom_reward_function.path and .name",
        )
    # Found on disk, never imported: reading a config must not run a package's __init__.
    relative = Path(*module.split("."))
    origin = None
    for folder in [Path.cwd(), *(Path(p) for p in sys.path if p)]:
        for candidate in (folder / relative.with_suffix(".py"), folder / relative / "__init__.py"):
            if candidate.is_file():
                origin = str(candidate.resolve())
                break
        if origin:
            break
    if origin is None:
        raise ConfigFieldError(
            "reward_model.config.module_path",
            module_path,
            f"no Python file for module {module!r} (looked in the working folder and on the "
            "Python path); put it there or set custom_reward_function.path to the file",
        )
    return {"custom_reward_function.path": origin, "custom_reward_function.name": function}


def _reward_model(name: object, config: object) -> dict[str, Any]:
    config = config if isinstance(config, dict) else {}
    if name == "rule_based":
        task = config.get("task")
        rules = [c for c in REWARD_COMPONENTS if c not in ("reward_model", "custom")]
        if task not in rules:
            raise ConfigFieldError(
                "reward_model.config.task",
                task,
                f"a rule_based reward needs a task, one of {', '.join(rules)}",
            )
        return {"reward.components": [{"name": task, "weight": 1.0, "kwargs": {}}]}
    if name == "custom_reward":
        return _module_file(config.get("module_path"))
    raise ConfigFieldError(
        "reward_model.name",
        name,
        f"not a reward; use one of {', '.join(REWARD_NAMES)} (or verl's keys: "
        "reward.components, custom_reward_function.path/name, reward_model.enable)",
    )


def apply_aliases(
    tree: dict[str, Any], source: str = "config", *, check: bool = True
) -> dict[str, Any]:
    """Return a copy of a plain config tree with every alias replaced by its verl keys.

    With ``check``, an alias and one of its verl keys both set to different values in the same
    tree is an error naming both (a verl key that is null or empty counts as unset); without it
    (command-line overrides over a preset) the alias wins, as any later override does.
    """
    if not isinstance(tree, dict) or not _has_alias(tree):
        return tree
    tree = copy.deepcopy(tree)
    for key, alias in ALIASES.items():
        parts = key.split(".")
        found, value = get_in(tree, parts)
        if not found:
            continue
        _pop(tree, parts)
        note_once(key, alias.note)
        for target, new in alias.translate(value).items():
            _put_checked(tree, target, new, key, value, source, check)
    reward = tree.get("reward_model")
    if isinstance(reward, dict) and ("name" in reward or "config" in reward):
        name, config = reward.pop("name", None), reward.pop("config", None)
        if not reward:
            tree.pop("reward_model")
        note_once("reward_model.name", REWARD_ALIAS_NOTE)
        for target, new in _reward_model(name, config).items():
            _put_checked(tree, target, new, "reward_model.name", name, source, check)
    return tree


def _has_alias(tree: dict) -> bool:
    reward = tree.get("reward_model")
    if isinstance(reward, dict) and ("name" in reward or "config" in reward):
        return True
    return any(get_in(tree, key.split("."))[0] for key in ALIASES)


def _put_checked(
    tree: dict, target: str, new: Any, alias: str, alias_value: Any, source: str, check: bool
) -> None:
    parts = target.split(".")
    found, old = get_in(tree, parts)
    if check and found and old not in (None, "", [], {}) and old != new:
        raise ConfigFieldError(
            alias,
            alias_value,
            f"{source} also sets {target}={old!r}, which this alias would make {new!r}; "
            f"keep one of the two ({target} is verl's key)",
        )
    put(tree, parts, new)


def install_section_aliases() -> None:
    """Give config sections the aliases that live inside them as properties.

    ``config.data.train_dataset_path = "x.jsonl"`` then sets ``data.train_files`` (printing the
    note once). An alias whose verl keys lie in another section (``algorithm.clip_range`` sets
    ``actor_rollout_ref.actor.clip_ratio``) cannot be a property of its section; setting it
    raises an AttributeError that names the key to set instead.
    """
    root = PPOConfig()
    for key, alias in ALIASES.items():
        section_path, _, name = key.rpartition(".")
        section: Any = root
        for part in section_path.split("."):
            section = getattr(section, part)
        if not hasattr(type(section), "__dataclass_fields__"):
            continue  # inside a dict field (data.data_key_map.answer): YAML and overrides only
        prefix = section_path + "."
        samples = alias.translate(_sample_value(alias))
        if all(target.startswith(prefix) for target in samples):
            setattr(type(section), name, _alias_property(key, prefix))
        else:
            targets = ", ".join(f"config.{t}" for t in alias.targets)
            ATTRIBUTE_HINTS[(type(section), name)] = (
                f"{key} is a tutorial spelling, not a verl key ({alias.note}); set {targets}"
            )


def _sample_value(alias: Alias) -> Any:
    """Return a value the alias accepts, to see which keys it sets (the widest case)."""
    if alias.key in ("actor_rollout_ref.model.dtype", "actor_rollout_ref.model.torch_dtype"):
        return "bf16"
    return {"algorithm.name": "ppo"}.get(alias.key, 1)


def _alias_property(key: str, prefix: str) -> property:
    first = ALIASES[key].targets[0][len(prefix) :].split(".")

    def get(section: Any) -> Any:
        value = section
        for part in first:
            value = getattr(value, part)
        return value

    def put(section: Any, value: Any) -> None:
        for target, new in translate(key, value).items():
            *parents, last = target[len(prefix) :].split(".")
            node = section
            for part in parents:
                node = getattr(node, part)
            setattr(node, last, new)

    return property(get, put, doc=f"Alias of {', '.join(ALIASES[key].targets)} (a tutorial key).")
