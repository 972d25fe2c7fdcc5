"""The checks of the files and folders a key names, for the sections' rules (``check_files``).

A ``tiny://`` path is built on demand and always passes here (``validate``'s generic check names
an unknown one); a remote URI (``s3://...``) is not checked, with a warning.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from engine.config.fields import ConfigFieldError, Validation

_REMOTE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def paths_of(value: str | list[str] | None) -> list[str]:
    """Return the paths a key holds: one, a list of them (``data.train_files``), or none."""
    return [v for v in ([value] if isinstance(value, str) else value or []) if v]


def local_path(v: Validation, key: str, value: str) -> Path | None:
    """Return the local path to check, or None for tiny:// (built on demand) and remote URIs."""
    if value.startswith("tiny://"):
        return None
    if _REMOTE.match(value):
        v.warnings.append(f"{key}={value!r} is not a local path and was not checked")
        return None
    return Path(value).expanduser()


def file_problems(v: Validation, key: str, value: str, fix: str) -> list[ConfigFieldError]:
    """Return an error when the file or folder ``value`` does not exist or cannot be read."""
    path = local_path(v, key, value)
    if path is None:
        return []
    if not path.exists():
        return [ConfigFieldError(key, value, f"{path} does not exist; {fix}")]
    if not os.access(path, os.R_OK):
        return [ConfigFieldError(key, value, f"{path} cannot be read (permissions); {fix}")]
    return []


def model_dir_problems(v: Validation, key: str, value: str) -> list[ConfigFieldError]:
    """Return an error when ``value`` is not a readable Hugging Face folder (with config.json)."""
    path = local_path(v, key, value)
    if path is None:
        return []
    fix = f"point {key} at a local Hugging Face folder (with config.json), or use tiny://model"
    if not path.is_dir():
        problem = "is a file, not a folder" if path.exists() else "does not exist"
        return [ConfigFieldError(key, value, f"{path} {problem}; {fix}")]
    if not os.access(path, os.R_OK | os.X_OK) or not (path / "config.json").is_file():
        return [ConfigFieldError(key, value, f"{path} has no readable config.json; {fix}")]
    return []
