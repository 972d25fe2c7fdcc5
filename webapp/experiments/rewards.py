"""The rewards the builder offers: the weighted components, and the installed custom functions.

``reward.components`` takes the engine's names (:func:`reward_component_names`): its registered
reward functions, the reward model's score and the custom function.

A custom reward is always a function in a ``*.py`` file that an administrator placed in
``POSTTRAIN_REWARD_MODULES_DIR``; the browser only picks one, it never sends code. The files are
read with ``ast`` rather than imported, so listing them runs none of their code. A file that
cannot be read (a syntax error, bad encoding, no permission) is reported by
``unreadable_reward_modules`` rather than dropped, so that the builder can say what is wrong.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from engine.rewards.names import REWARD_COMPONENTS

# What a component that is not a registered reward function stands for, shown on its row.
COMPONENT_NOTES = {
    "reward_model": "The reward model's score; needs reward_model.enable (Reward model group).",
    "custom": "The custom function chosen below (custom_reward_function).",
}


def reward_component_names() -> list[str]:
    """Return the names ``reward.components`` accepts, in the engine's order."""
    return list(REWARD_COMPONENTS)


@dataclass(frozen=True)
class RewardFunction:
    """One public top-level function of an installed reward module."""

    path: str  # absolute path of the module file
    module: str  # the file name, e.g. "length_penalty.py"
    name: str
    doc: str

    @property
    def choice(self) -> str:
        """Return the form value that names this function: ``<file>:<function>``."""
        return f"{self.module}:{self.name}"


def reward_modules_dir() -> Path:
    """Return the directory whose ``*.py`` files are the installed reward modules."""
    return Path(settings.POSTTRAIN_REWARD_MODULES_DIR).expanduser().resolve()


@dataclass(frozen=True)
class UnreadableModule:
    """A ``*.py`` file in the reward modules directory that could not be parsed."""

    module: str  # the file name
    error: str  # what is wrong, with the line where Python can tell

    @property
    def message(self) -> str:
        return (
            f"{self.module} is not offered: {self.error}. An administrator has to fix the file in "
            "the reward modules directory."
        )


def _scan(directory: Path | None) -> tuple[list[RewardFunction], list[UnreadableModule]]:
    directory = directory or reward_modules_dir()
    if not directory.is_dir():
        return [], []
    found, unreadable = [], []
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError as exc:
            unreadable.append(UnreadableModule(path.name, f"{exc.msg} (line {exc.lineno})"))
            continue
        except UnicodeDecodeError as exc:
            unreadable.append(UnreadableModule(path.name, f"not UTF-8 text ({exc.reason})"))
            continue
        except OSError as exc:
            unreadable.append(UnreadableModule(path.name, f"cannot be read ({exc.strerror})"))
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = (ast.get_docstring(node) or "").strip().splitlines()
                found.append(RewardFunction(str(path), path.name, node.name, doc[0] if doc else ""))
    return found, unreadable


def list_reward_functions(directory: Path | None = None) -> list[RewardFunction]:
    """Return the public functions of every readable ``*.py`` file in the directory."""
    return _scan(directory)[0]


def unreadable_reward_modules(directory: Path | None = None) -> list[UnreadableModule]:
    """Return the ``*.py`` files of the directory that could not be parsed, and why."""
    return _scan(directory)[1]


def reward_function_for_path(path: str | None, name: str | None) -> RewardFunction | None:
    """Return the installed function that ``custom_reward_function.path/name`` names, if any."""
    if not path:
        return None
    resolved = str(Path(path).expanduser().resolve())
    for function in list_reward_functions():
        if function.path == resolved and function.name == name:
            return function
    return None
