"""What ``validate_config`` says of a preset with overrides, as one dict to compare."""

from __future__ import annotations

from engine.config import ConfigValidationError, load_config, validate_config


def validation_errors(overrides: list[str], preset: str = "grpo_tiny") -> dict[str, str]:
    """Return {key: message} of the errors validate_config raises for ``preset`` plus
    ``overrides`` ({} when it passes), the files unchecked."""
    try:
        validate_config(load_config(preset, overrides), check_files=False)
    except ConfigValidationError as exc:
        return {error.key: error.message for error in exc.errors}
    return {}
