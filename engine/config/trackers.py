"""``trainer.logger``'s names and the library each tracker needs: what the schema offers and the
validator checks before a run starts. The trackers themselves are ``engine.trainer.trackers``."""

from __future__ import annotations

import importlib.util

# trainer.logger's names: the built-in recorders, then the trackers of verl's Tracking.
TRACKERS = ("console", "jsonl", "wandb", "tensorboard", "mlflow", "swanlab", "clearml", "posttrain")
# The module each tracker imports (all in the ``trackers`` extra); console and jsonl need none.
TRACKER_MODULES = {
    "wandb": "wandb",
    "tensorboard": "tensorboard",  # torch.utils.tensorboard writes with it
    "mlflow": "mlflow",
    "swanlab": "swanlab",
    "clearml": "clearml",
    "posttrain": "httpx",  # posttrain_client, reporting to a studio (POSTTRAIN_URL, _TOKEN)
}


def tracker_install_problems(loggers: list[str] | str | None) -> list[str]:
    """Return, for each tracker ``loggers`` names whose library is missing, what to install."""
    names = [loggers] if isinstance(loggers, str) else list(loggers or [])
    return [
        f"names {name!r} but {TRACKER_MODULES[name]} is not installed: pip install -e .[trackers]"
        for name in dict.fromkeys(names)
        if name in TRACKER_MODULES and importlib.util.find_spec(TRACKER_MODULES[name]) is None
    ]
