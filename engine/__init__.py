"""PostTrain Studio's RL post-training engine: verl-compatible config, data, rewards, algorithms,
rollout, workers and trainer. It imports nothing from Django, Celery or Channels.

    import engine
    config = engine.load_config("grpo_tiny.yaml", overrides=["trainer.total_training_steps=20"])
    config.data.train_batch_size = 8
    engine.PPOTrainer(config).train()
"""

from typing import Any

__all__ = ["PPOTrainer", "__version__", "load_config", "run_training"]


def _version() -> str:
    """Return the installed package's version (``posttrain-studio``'s metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("posttrain-studio")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


__version__ = _version()


def __getattr__(name: str) -> Any:
    # Imported lazily: the config and trainer pull in torch and transformers.
    if name == "load_config":
        from engine.config import load_config

        return load_config
    if name == "PPOTrainer":
        from engine.trainer.ppo_trainer import PPOTrainer

        return PPOTrainer
    if name == "run_training":
        from engine.trainer.run import run_training

        return run_training
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
