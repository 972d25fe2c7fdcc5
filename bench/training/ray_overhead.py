#!/usr/bin/env python3
"""What does the Ray controller cost over the in-process one? Both trainers, step by step, in one driver.

``compare_trl.py`` runs each arm in its own process, minutes apart. On a shared host whose speed
drifts up to 2x within minutes its Ray/in-process ratio moves by more than the effect being
measured (0.95-1.71x between repeats of one run). This script pairs the steps instead: one driver
builds the in-process ``PPOTrainer`` and a ``RayPPOTrainer`` with one rank on the same task and
settings (``compare_arms.engine_overrides``, the tiny scale, one torch thread each) and alternates
their steps, so the two steps of a pair run within a fraction of a second of each other. It
reports each arm's median step and step parts, and the median over the pairs of Ray's step time
over the in-process one.

``--ray-calls`` adds a Ray trainer whose step calls go through Ray actor calls instead of the
direct channel to the rank (``POSTTRAIN_RANK_CHANNEL=0``, see ``engine.distributed.channel``);
``--three-calls`` adds one whose controller also asks the rank for the reference pass in a call
of its own, as every step did before the pass rode in the rollout call. Each shows what its
change saves.

With ``--block 1`` (the default) the in-process trainer is not the one ``compare_trl.py``
times: its thread waits while the other trainers step, so its caches start cold at each step as
the rank's do, and the ratio is the cost of the controller's calls and of the work crossing
processes only. ``--block N`` lets each arm run ``N`` steps in a row before the next takes over:
the in-process trainer then runs hot as it does on its own, a Ray step still waits on the
controller between its calls, and the ratio of the two arms' block times (a block of 10 tiny
steps takes about a second, short against the host's drift) is the whole cost a user of the Ray
path pays.

Usage (from the repository root)::

    .venv/bin/python -m bench.training.ray_overhead --steps 200 --block 10 --ray-calls
    .venv/bin/python -m bench.training.ray_overhead --steps 200 --ray-calls --three-calls

The results JSON goes to ``--results-dir`` (``bench/results``), the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.training.compare_trl import OFFLINE_ENV, RESULTS

for _key, _value in {
    **OFFLINE_ENV,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "",
    "RAY_AUTH_MODE": "disabled",
}.items():
    os.environ.setdefault(_key, _value)

PARTS = ("gen", "ref", "update_actor", "step")
# Logged with the timings: one Ray rank does the in-process work bit for bit, so these must agree.
SAME_WORK = ("actor/pg_loss", "actor/kl_loss", "critic/score/mean")
WARMUP_STEPS = 5  # left out of the medians: first calls, allocator growth


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments, with ``compare_trl.py``'s tiny settings added."""
    from bench.training.compare_trl import fill_scale_defaults
    from bench.training.compare_trl import parse_args as compare_trl_args

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ray-calls", action="store_true", help="add step calls through Ray")
    parser.add_argument("--three-calls", action="store_true", help="add the three-call layout")
    parser.add_argument(
        "--block", type=int, default=1, help="steps each arm runs before the next takes over"
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--root", default=None, help="default <POSTTRAIN_DATA_DIR>/compare_trl")
    parser.add_argument("--results-dir", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must be more than the {WARMUP_STEPS} warm-up steps")
    if args.block < 1:
        parser.error("--block must be at least 1")
    # The settings compare_arms.engine_overrides reads, as compare_trl.py sets them for tiny.
    shared = ["--threads=1", f"--steps={args.steps}", f"--seed={args.seed}"]
    shared += [f"--root={args.root}"] if args.root else []
    settings = fill_scale_defaults(compare_trl_args(shared), "tiny")
    return argparse.Namespace(**{**vars(settings), **vars(args), "root": settings.root})


def build_trainers(args: argparse.Namespace) -> dict[str, Any]:
    """Return the trainers by arm name: ``local``, ``ray`` and, if asked, ``ray_calls`` and
    ``ray_three_calls``."""
    from bench.training.compare_arms import engine_overrides
    from bench.training.compare_tasks import prepare_task
    from engine.config import load_config
    from engine.distributed import channel
    from engine.trainer.ppo_trainer import PPOTrainer
    from engine.trainer.ray_trainer import RayPPOTrainer

    task, _ = prepare_task(args.scale, Path(args.root), args.threads)
    arms = ["local", "ray"]
    arms += ["ray_calls"] * args.ray_calls + ["ray_three_calls"] * args.three_calls

    def config(arm: str) -> Any:
        controller = "local" if arm == "local" else "ray"
        out_dir = Path(args.root) / "ray_overhead" / arm
        cfg = load_config("grpo_tiny.yaml", engine_overrides(args, task, out_dir, controller))
        cfg.ray_init.num_cpus = len(arms) - 1  # one CPU for each Ray trainer's rank
        return cfg

    channel_setting = os.environ.get(channel.ENV_SWITCH, "1")
    trainers: dict[str, Any] = {"local": PPOTrainer(config("local"))}
    try:
        for arm in arms[1:]:
            # Only ray_calls sends its step calls through Ray; the three-call arm differs from
            # the two-call one in the reference call alone.
            os.environ[channel.ENV_SWITCH] = "0" if arm == "ray_calls" else channel_setting
            try:
                trainers[arm] = RayPPOTrainer(config(arm), cpus_per_rank=1.0)
            finally:
                os.environ[channel.ENV_SWITCH] = channel_setting
        if args.three_calls:
            # Without a reference pass to run in the rollout call, the controller asks for it.
            trainers["ray_three_calls"].arr.need_ref = False
    except BaseException:
        shutdown(trainers)
        raise
    return trainers


def shutdown(trainers: dict[str, Any]) -> None:
    """Release the Ray trainers' ranks."""
    for trainer in trainers.values():
        if hasattr(trainer, "shutdown"):
            trainer.shutdown()


def alternate(
    trainers: dict[str, Any], steps: int, block: int = 1
) -> dict[str, list[dict[str, float]]]:
    """Run ``steps`` steps of every trainer, ``block`` steps of each in turn; return each arm's
    timings."""
    batches = {arm: iter(trainer.train_loader) for arm, trainer in trainers.items()}
    timings: dict[str, list[dict[str, float]]] = {arm: [] for arm in trainers}
    for start in range(0, steps, block):
        for arm, trainer in trainers.items():
            for _ in range(min(block, steps - start)):
                trainer.global_step += 1
                metrics, _, _ = trainer.train_step(next(batches[arm]))
                timings[arm].append(
                    {part: metrics[f"timing_s/{part}"] for part in PARTS}
                    | {key: metrics[key] for key in SAME_WORK}
                )
    return timings


def block_ratios(rows: list[float], base: list[float], block: int) -> list[float]:
    """Return, for each block of ``block`` consecutive steps, the ratio of the two arms' times.

    ``rows`` and ``base`` are step times from step ``WARMUP_STEPS + 1`` on; blocks are counted
    from step 1, as :func:`alternate` runs them, so the first one may be cut by the warm-up.
    """
    ratios = []
    for end in range(block - WARMUP_STEPS % block, len(rows) + block, block):
        start = max(0, end - block)
        if start < min(end, len(rows)):
            ratios.append(sum(rows[start:end]) / sum(base[start:end]))
    return sorted(ratios)


def summarise(timings: dict[str, list[dict[str, float]]], block: int = 1) -> dict[str, Any]:
    """Return each arm's median parts (ms) and, for the Ray arms, the ratios of their time over
    the in-process arm's, per pair of blocks.

    Raise RuntimeError unless every arm logged the in-process arm's losses and rewards.
    """
    kept = {arm: rows[WARMUP_STEPS:] for arm, rows in timings.items()}
    summary: dict[str, Any] = {}
    for arm, rows in timings.items():
        differs = [
            (step, key)
            for step, (r, base) in enumerate(zip(rows, timings["local"], strict=True), 1)
            for key in SAME_WORK
            if r[key] != base[key]
        ]
        if differs:
            raise RuntimeError(
                f"{arm} did other work than the in-process trainer (step, metric): {differs[:5]}"
            )
    for arm, rows in kept.items():
        entry: dict[str, Any] = {
            f"{part}_ms": round(statistics.median(r[part] for r in rows) * 1000, 2)
            for part in PARTS
        }
        if arm != "local":
            ratios = block_ratios(
                [r["step"] for r in rows], [r["step"] for r in kept["local"]], block
            )
            quartiles = statistics.quantiles(ratios, n=4)
            entry["step_over_local"] = round(statistics.median(ratios), 3)
            entry["step_over_local_iqr"] = [round(quartiles[0], 3), round(quartiles[2], 3)]
        summary[arm] = entry
    return summary


def markdown(summary: dict[str, Any], steps: int, block: int = 1) -> str:
    """Return the summary as a table."""
    pairs = "per-pair" if block == 1 else f"per-pair ({block}-step blocks)"
    lines = [
        f"Median over steps {WARMUP_STEPS + 1}-{steps} (ms); Ray / in-process: median of the "
        f"{pairs} ratios (interquartile range)",
        "",
        "| arm | step | generate | reference | update | Ray / in-process |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for arm, e in summary.items():
        ratio = (
            f"{e['step_over_local']} ({e['step_over_local_iqr'][0]}-{e['step_over_local_iqr'][1]})"
            if "step_over_local" in e
            else ""
        )
        lines.append(
            f"| {arm} | {e['step_ms']} | {e['gen_ms']} | {e['ref_ms']} | {e['update_actor_ms']} "
            f"| {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    trainers = build_trainers(args)
    try:
        timings = alternate(trainers, args.steps, args.block)
    finally:
        shutdown(trainers)
    summary = summarise(timings, args.block)
    print(markdown(summary, args.steps, args.block))
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"ray_overhead_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "summary": summary, "steps": timings}))
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
