"""Build the embedded tiny assets if needed and print their paths and measured accuracy.

Usage: ``python -m engine.tiny [--force] [--data-dir DIR]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.env import apply_cpu_process_env


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m engine.tiny", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="data directory (default: $POSTTRAIN_DATA_DIR or ~/.cache/posttrain-studio)",
    )
    args = parser.parse_args(argv)
    apply_cpu_process_env()

    from engine.tiny import ensure_tiny_assets

    assets = ensure_tiny_assets(args.data_dir, force=args.force)
    manifest = assets.manifest
    print(f"recipe        {manifest['recipe_hash']}")
    print(f"root          {assets.root}")
    print(f"model         {assets.model_dir}")
    print(f"train.parquet {assets.train_parquet}")
    print(f"val.parquet   {assets.val_parquet}")
    print(f"train.jsonl   {assets.train_jsonl}")
    print(f"val.jsonl     {assets.val_jsonl}")
    print(f"parameters    {manifest['parameters']:,}")
    print(f"sft steps     {manifest['sft_steps']}")
    print(
        f"val accuracy  {manifest['val_accuracy']:.1%} (greedy, {manifest['recipe']['val_rows']})"
    )
    print(f"build seconds {manifest['build_seconds']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
