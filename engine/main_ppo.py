"""Command-line entry point, spelled like verl's hydra one.

    python -m engine.main_ppo --config-name grpo_tiny actor_rollout_ref.rollout.n=8
    python -m engine.main_ppo algorithm.adv_estimator=grpo data.train_files=... --cfg job

The config is loaded, resolved and validated before anything heavy is imported, so a mistake
costs a second, not a model load: each problem is printed on its own line (no traceback) and the
exit status is 2, as for any usage error. A key found wrong only as the trainer builds (a
``data.custom_cls`` or ``data.sampler`` class file's class) is printed the same way.
``--cfg job`` prints the resolved YAML and exits.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from engine.config import (
    ConfigError,
    ConfigFieldError,
    ConfigValidationError,
    config_to_yaml,
    load_config,
    resolve_config,
    validate_config,
)
from engine.config.loader import DEFAULT_CONFIG

USAGE_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.main_ppo",
        description="Train a policy with PPO, GRPO or a relative (verl-compatible config).",
    )
    parser.add_argument(
        "--config-name", "-cn", default=DEFAULT_CONFIG, help="preset name or YAML path"
    )
    parser.add_argument("--config-path", "-cp", default=None, help="folder holding the preset")
    parser.add_argument(
        "--cfg", "-c", choices=("job", "all"), default=None, help="print the config and exit"
    )
    parser.add_argument("overrides", nargs="*", help="key=value, +key=value, ++key=value, ~key")
    return parser


def _config_source(name: str, folder: str | None) -> str:
    if folder is None:
        return name
    filename = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    return f"{folder.rstrip('/')}/{filename}"


def _fail(lines: list[str]) -> int:
    for line in lines:
        print(f"error: {line}", file=sys.stderr)
    return USAGE_ERROR


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the process exit status."""
    args = _parser().parse_args(argv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            config = load_config(
                _config_source(args.config_name, args.config_path),
                args.overrides,
                all_errors=True,
            )
            notes = [] if args.cfg else validate_config(config, check_files=True)
            resolve_config(config)
        except ConfigValidationError as exc:
            errors = list(exc.errors)
            if exc.config is not None and not args.cfg:  # the rest of the config's problems too
                try:
                    validate_config(exc.config, check_files=True)
                except ConfigValidationError as more:
                    bad = {error.key for error in errors}
                    errors += [e for e in more.errors if e.key not in bad]
            return _fail([str(error) for error in errors])
        except ConfigError as exc:
            return _fail([str(exc)])
    for note in [str(w.message) for w in caught] + notes:
        print(f"warning: {note}", file=sys.stderr)
    if args.cfg:
        print(config_to_yaml(config), end="")
        return 0
    try:
        from engine.trainer import run_training
    except ImportError as exc:
        print(
            f"error: the trainer (engine.trainer.run_training) cannot be imported: {exc}",
            file=sys.stderr,
        )
        return 1
    try:
        run_training(config)
    except ConfigFieldError as exc:  # a key found wrong as the trainer builds (a class file's)
        return _fail([str(exc)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
