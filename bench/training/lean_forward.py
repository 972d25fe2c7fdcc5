"""The actor's passes with the lean forward against the module's forward, in one process.

On a shared machine whose speed drifts by tens of percent within minutes, a change worth 10-20%
shows only when both variants run in the same process, taking turns, on the same batch. This
script trains ``--warmup`` steps of the tiny GRPO benchmark (``compare_trl.py``'s engine
settings), keeps the last batch the update saw, then runs the rollout of its prompts, the
reference log-prob pass and the policy update ``--rounds`` times for each variant in turn:

* ``lean``: ``engine.llama_forward.LlamaForward`` (the default path);
* ``module``: the model's own forward everywhere, rollout included (``LlamaForward.build``
  answering None);
* ``unshared`` (with ``--unshared``): the lean forward without the shared prompt pass, each row
  running its own prompt.

It prints one JSON line: the median milliseconds of each pass per variant, and the median of
the per-round ratios against ``lean``. Example::

    .venv/bin/python -m bench.training.lean_forward --threads 2 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

WARMUP_ROUNDS = 5  # rounds left out of the medians


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=4, help="training steps before timing")
    parser.add_argument("--unshared", action="store_true", help="also time unshared prompts")
    return parser.parse_args(argv)


def captured_batch(trainer: Any) -> Any:
    """Train the trainer's configured steps; return the last batch its update received."""
    seen: dict[str, Any] = {}
    update = trainer.arr.update_actor

    def keep(batch: Any) -> dict[str, float]:
        seen["batch"] = batch
        return update(batch)

    trainer.arr.update_actor = keep
    trainer.fit()
    trainer.arr.update_actor = update
    return seen["batch"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="lean_forward_"))
    try:
        print(json.dumps(measure(args, root)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Train, capture a batch, and time each variant's passes in turn; return the summary."""
    import engine.roles.actor as actor
    from bench.training.compare_arms import engine_overrides
    from bench.training.compare_tasks import prepare_task
    from bench.training.compare_trl import fill_scale_defaults
    from bench.training.compare_trl import parse_args as compare_trl_args
    from engine.config import load_config
    from engine.data import DataProto
    from engine.llama_forward import LlamaForward
    from engine.trainer.ppo_trainer import PPOTrainer
    from engine.trainer.reporting import Recorder

    # compare_trl.py's tiny settings, trained for the warm-up steps.
    shared = [f"--steps={args.warmup}", f"--threads={args.threads}"]
    settings = fill_scale_defaults(compare_trl_args(shared), "tiny")
    task, _ = prepare_task("tiny", root, args.threads)
    overrides = engine_overrides(settings, task, root / "out", "local")
    trainer = PPOTrainer(load_config("grpo_tiny.yaml", overrides=overrides), Recorder())
    batch = captured_batch(trainer)
    worker = trainer.arr

    build, shared = LlamaForward.build, actor.shared_prompts
    variants: dict[str, tuple[Any, Any]] = {
        "lean": (build, shared),
        "module": (lambda model: None, shared),
    }
    if args.unshared:
        variants["unshared"] = (build, lambda *_: None)
    prompt_length = batch.batch["prompts"].shape[-1]
    prompts = DataProto.from_dict(
        {
            key: batch.batch[key][:, :prompt_length]
            for key in ("input_ids", "attention_mask", "position_ids")
        }
    )  # the rollout's input: the prompts, repeated n times and left padded
    parts = ("generate", "ref", "update")
    times: dict[str, dict[str, list[float]]] = {v: {p: [] for p in parts} for v in variants}
    try:
        for _ in range(args.rounds):
            for name, (lean_build, share) in variants.items():
                # One class serves the rollout and the actor: both switch together.
                actor.LlamaForward.build, actor.shared_prompts = lean_build, share  # type: ignore[method-assign]
                for part, call in (
                    ("generate", lambda: worker.generate_sequences(prompts)),
                    ("ref", lambda: worker.compute_ref_log_prob(batch)),
                    ("update", lambda: worker.update_actor(batch)),
                ):
                    start = time.perf_counter()
                    call()
                    times[name][part].append(time.perf_counter() - start)
    finally:
        actor.LlamaForward.build, actor.shared_prompts = build, shared  # type: ignore[method-assign]

    def steady(values: list[float]) -> list[float]:
        return values[WARMUP_ROUNDS:] or values

    return {
        "threads": args.threads,
        "rounds": args.rounds,
        "rows": len(batch),
        "median_ms": {
            name: {part: round(statistics.median(steady(t)) * 1000, 2) for part, t in parts.items()}
            for name, parts in times.items()
        },
        "ratio_to_lean": {
            name: {
                part: round(
                    statistics.median(
                        other / lean
                        for other, lean in zip(
                            steady(times[name][part]), steady(times["lean"][part]), strict=True
                        )
                    ),
                    3,
                )
                for part in parts
            }
            for name in variants
            if name != "lean"
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
