#!/usr/bin/env python3
"""PostTrain Studio's engine against TRL's GRPOTrainer, side by side, on one machine.

Both frameworks train the same model on the same prompts (in the same order), reward, group size,
lengths, learning rate, KL coefficient and step count (``compare_arms`` lists the settings key
by key). For each scale the driver alternates the arms A B A B over ``--repeats``, each arm
in its own process (so peak RSS is per arm), and after each pair times the raw parts of a step
on the model (generate, forward, forward+backward, optimizer step): the sum of those is the
limit a framework can approach.

Timing noise on a shared machine: every arm records the CPU time other processes used during
its run (``foreign_cpu_frac``, from ``/proc/stat``) and a fixed matmul probe before and after
(``machine_calib_s``). A repeat is *clean* when every arm's ``foreign_cpu_frac`` is at most 0.05
and every probe is within 25% of the fastest probe of the run (the rule of the TRL baseline);
medians are taken over clean repeats and, separately, over all repeats. The per-repeat ratio
TRL/engine compares two runs made minutes apart, so it is less sensitive to slow drifts of the
machine than either time alone.

Usage (from the repository root)::

    python -m bench.training.compare_trl all --scale tiny     # 5 repeats x (engine, TRL, raw)
    python -m bench.training.compare_trl all --scale medium   # 3 repeats, 30 steps, 64 tokens
    python -m bench.training.compare_trl all --scale tiny --repeats 1 --steps 200 \
        --eval-steps 60 200
    python -m bench.training.compare_trl all --scale tiny --arms engine ray --no-raw  # Ray, 1 rank
    python -m bench.training.compare_trl all --scale tiny --arms engine vllm trl  # vLLM rollout

Each arm runs in a child process started the same way (``-m``, at the repository root).

Results: ``<results-dir>/compare_<scale>_<time>_seed<seed>.json`` (every repeat, every step;
the seed keeps runs started in the same second apart) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The repository root (children start there) and the ignored results folder, bench/results.
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
ARMS = ("engine", "trl", "ray", "vllm")
CLEAN_FOREIGN_FRAC = 0.05
CLEAN_CALIB_SLACK = 1.25
# Offline (the model and data are the project's own), no telemetry, no tokenizer threads.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def log(*parts: Any) -> None:
    """Print a progress line to stderr."""
    print("[compare]", *parts, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments, with the scale's defaults filled in."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phase", nargs="?", default="all", choices=["all", "prepare", *ARMS, "raw"])
    parser.add_argument("--scale", nargs="+", default=["tiny"], choices=["tiny", "medium"])
    parser.add_argument("--arms", nargs="+", default=["engine", "trl"], choices=ARMS)
    parser.add_argument("--repeats", type=int, default=None, help="tiny 5, medium 3")
    parser.add_argument("--steps", type=int, default=None, help="tiny 60, medium 30")
    parser.add_argument("--lr", type=float, default=None, help="tiny 5e-5, medium 2e-5")
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient (k3)")
    add_engine_kl_argument(parser)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--eval-steps", type=int, nargs="*", default=None, help="greedy evals (default: last step)"
    )
    parser.add_argument("--test-size", type=int, default=None, help="held-out prompts (all: 200)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 1)))
    parser.add_argument("--no-raw", action="store_true", help="skip the raw-parts limit")
    parser.add_argument("--force", action="store_true", help="redo the medium warm start")
    parser.add_argument(
        "--root",
        default=None,
        help="artefacts (medium model, outputs); default <POSTTRAIN_DATA_DIR>/compare_trl",
    )
    parser.add_argument("--results-dir", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.root is None:
        from engine.env import data_dir

        args.root = str(data_dir() / "compare_trl")
    args.root = str(Path(args.root).resolve())  # the arms start at the repository root
    return args


def add_engine_kl_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--engine-kl``: the engine's k3 loss, verl's (the default) or TRL's."""
    parser.add_argument(
        "--engine-kl",
        default="low_var_kl",
        choices=["low_var_kl", "k3_unclamped"],
        help="the engine's k3 loss: verl's (clamped at 10) or TRL's (unclamped)",
    )


def fill_scale_defaults(args: argparse.Namespace, scale: str) -> argparse.Namespace:
    """Return a copy of ``args`` for one scale, its unset settings taken from the scale."""
    from bench.training.compare_tasks import SCALES

    defaults = SCALES[scale]
    out = argparse.Namespace(**vars(args))
    out.scale = scale
    out.repeats = args.repeats or defaults.repeats
    out.steps = args.steps or defaults.steps
    out.lr = args.lr if args.lr is not None else defaults.lr
    out.eval_steps = args.eval_steps if args.eval_steps else [out.steps]
    return out


def child_argv(args: argparse.Namespace) -> list[str]:
    """Return the arguments that make a child process see the same settings."""
    argv = [
        f"--scale={args.scale}",
        f"--steps={args.steps}",
        f"--lr={args.lr}",
        f"--beta={args.beta}",
        f"--engine-kl={args.engine_kl}",
        f"--seed={args.seed}",
        f"--threads={args.threads}",
        f"--root={args.root}",
        "--eval-steps",
        *map(str, args.eval_steps),
    ]
    if args.test_size:
        argv.append(f"--test-size={args.test_size}")
    return argv


def run_child(phase: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one arm in a fresh process and return the JSON it prints."""
    cmd = [sys.executable, "-m", "bench.training.compare_trl", phase, *child_argv(args)]
    log("running", phase, args.scale)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, text=True, env=child_env(args.threads), cwd=ROOT
    )
    if proc.returncode != 0:
        raise SystemExit(f"the {phase} arm failed with exit code {proc.returncode} (see above)")
    line = [row for row in proc.stdout.splitlines() if row.startswith('{"')][-1]
    result = json.loads(line)
    result["process_wall_s"] = round(time.perf_counter() - start, 1)
    return result


def child_env(threads: int) -> dict[str, str]:
    """Return the environment of an arm: fixed threads, offline, no GPU, no telemetry."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    env.update(OFFLINE_ENV, CUDA_VISIBLE_DEVICES="", RAY_AUTH_MODE="disabled")
    return env


def load_task(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Return the scale's prepared task (cut to ``--test-size``) and its preparation info."""
    from bench.training.compare_tasks import prepare_task

    task, info = prepare_task(args.scale, Path(args.root), args.threads, force=args.force)
    if args.test_size:
        task = type(task)(**{**task.__dict__, "test": task.test[: args.test_size]})
    return task, info


def run_phase(args: argparse.Namespace) -> None:
    """Run one child phase and print its JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    from bench.training.compare_arms import print_result, run_engine, run_raw, run_trl

    task, info = load_task(args)
    if args.phase == "prepare":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from bench.training.compare_tasks import greedy_accuracy

        model = AutoModelForCausalLM.from_pretrained(task.model_dir, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
        result = {
            "arm": "prepare",
            **info,
            "params": sum(p.numel() for p in model.parameters()),
            "base_acc": greedy_accuracy(model, tokenizer, task.test, args.scale),
            "n_test": len(task.test),
            "n_train_prompts": len(task.train),
            "versions": versions(),
        }
    elif args.phase == "engine":
        result = run_engine(args, task)
    elif args.phase == "ray":
        result = run_engine(args, task, controller="ray")
    elif args.phase == "vllm":
        result = run_engine(args, task, rollout="vllm")
    elif args.phase == "trl":
        result = run_trl(args, task)
    else:
        result = run_raw(args, task)
    print_result(result)


def versions() -> dict[str, str]:
    """Return the versions of Python and the packages that matter for the comparison."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "trl", "accelerate", "datasets", "tokenizers", "ray"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


# -- the comparison ------------------------------------------------------------------------------
def compare_scale(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """Run ``prepare`` then the alternating repeats for one scale; return the summary.

    The summary so far is written to ``path`` after every repeat, so an interrupted run keeps
    its finished repeats. A failing Ray arm is logged and left out of its repeat; a failing
    engine or TRL arm stops the run.
    """
    prep = run_child("prepare", args)
    repeats: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for r in range(args.repeats):
        log(f"{args.scale}: repeat {r + 1}/{args.repeats}")
        row = {}
        for arm in args.arms:
            try:
                row[arm] = run_child(arm, args)
            except SystemExit as failure:
                if arm != "ray":
                    raise
                log(f"left out of repeat {r}: {failure}")
        if not args.no_raw:
            row["raw"] = run_child("raw", args)
        repeats.append(row)
        summary = summarise(args, prep, repeats)
        path.write_text(json.dumps(summary, indent=1))
    return summary


def is_clean(row: dict[str, Any], best_calib: float) -> bool:
    """Return True when no arm of the repeat shared the cores or met a slow machine."""
    for result in row.values():
        cpu = result.get("cpu_during_train") or result.get("cpu_during_bench")
        if cpu["foreign_cpu_frac"] > CLEAN_FOREIGN_FRAC:
            return False
        if max(result["machine_calib_s"]) > CLEAN_CALIB_SLACK * best_calib:
            return False
    return True


def med(values: list[float | None]) -> float | None:
    """Return the median of the values that are present, rounded (None when there are none)."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def summarise(args: argparse.Namespace, prep: dict, repeats: list[dict]) -> dict[str, Any]:
    """Return per-repeat figures, clean-repeat and all-repeat medians, ratios and accuracies."""
    best_calib = min(min(res["machine_calib_s"]) for row in repeats for res in row.values())
    per_repeat = []
    for i, row in enumerate(repeats):
        entry: dict[str, Any] = {"repeat": i, "clean": is_clean(row, best_calib)}
        for arm, result in row.items():
            if arm == "raw":
                entry["raw_sum_s"] = result["raw_sum_s"]
                entry["raw_sum_cpu_s"] = result["raw_sum_cpu_s"]
                continue
            entry[f"{arm}_s_per_step"] = result["median_s_per_step"]
            entry[f"{arm}_cpu_s_per_step"] = result["median_cpu_s_per_step"]
            cpu = result["cpu_during_train"]
            entry[f"{arm}_foreign_cpu_frac"] = cpu["foreign_cpu_frac"]
            entry[f"{arm}_calib_s"] = result["machine_calib_s"]
        if "engine" in row and "trl" in row:
            entry["trl_over_engine"] = round(
                row["trl"]["median_s_per_step"] / row["engine"]["median_s_per_step"], 3
            )
            entry["trl_over_engine_cpu"] = round(
                row["trl"]["median_cpu_s_per_step"] / row["engine"]["median_cpu_s_per_step"], 3
            )
        if "engine" in row and "raw" in row:
            entry["engine_over_raw_sum"] = round(
                row["engine"]["median_s_per_step"] / row["raw"]["raw_sum_s"], 3
            )
            entry["engine_over_raw_sum_cpu"] = round(
                row["engine"]["median_cpu_s_per_step"] / row["raw"]["raw_sum_cpu_s"], 3
            )
        for other in ("ray", "vllm"):
            if "engine" in row and other in row:
                entry[f"{other}_over_engine"] = round(
                    row[other]["median_s_per_step"] / row["engine"]["median_s_per_step"], 3
                )
        per_repeat.append(entry)
    clean = [e["repeat"] for e in per_repeat if e["clean"]]
    ratio_suffixes = ("_over_engine", "_over_raw_sum", "_over_engine_cpu", "_over_raw_sum_cpu")
    keys = sorted(
        {k for e in per_repeat for k in e if k.endswith(("_s_per_step", *ratio_suffixes))}
    )
    keys += [k for k in ("raw_sum_s", "raw_sum_cpu_s") if k in per_repeat[0]]
    medians = {
        "clean": {k: med([per_repeat[i].get(k) for i in clean]) for k in keys} if clean else None,
        "all": {k: med([e.get(k) for e in per_repeat]) for k in keys},
    }
    arms: dict[str, Any] = {}
    for arm in [*args.arms, *([] if args.no_raw else ["raw"])]:
        results = [row[arm] for row in repeats if arm in row]
        if not results:
            continue
        typical = sorted(results, key=lambda r: r.get("median_s_per_step", r.get("raw_sum_s")))
        arms[arm] = {"typical_repeat": typical[(len(typical) - 1) // 2]}
        if arm != "raw":
            arms[arm]["deterministic_across_repeats"] = all(
                r["reward_all_steps"] == results[0]["reward_all_steps"] for r in results
            )
            arms[arm]["accuracy_at_step"] = results[0]["accuracy_at_step"]
            arms[arm]["peak_rss_mib"] = [r["peak_rss_mib"] for r in results]
    return {
        "bench": "compare_trl",
        "scale": args.scale,
        "settings": {k: v for k, v in vars(args).items() if k not in {"phase", "results_dir"}},
        "versions": prep.get("versions"),
        "prepare": prep,
        "base_acc": prep["base_acc"],
        "clean_repeats": clean,
        "per_repeat": per_repeat,
        "medians": medians,
        "arms": arms,
        "all_runs": repeats,
    }


def markdown(summary: dict[str, Any]) -> str:
    """Return the summary as markdown tables: one row per repeat, then the medians and figures."""
    rows = summary["per_repeat"]
    cols = list(dict.fromkeys(k for row in rows for k in row if k != "repeat"))
    lines = [f"### {summary['scale']}", "", "| repeat | " + " | ".join(cols) + " |"]
    lines.append("|" + " --- |" * (len(cols) + 1))
    for row in rows:
        lines.append(f"| {row['repeat']} | " + " | ".join(fmt(row.get(c, "")) for c in cols) + " |")
    for name, values in summary["medians"].items():
        if values:
            lines.append(
                f"| median ({name}) | " + " | ".join(fmt(values.get(c, "")) for c in cols) + " |"
            )
    lines += ["", "| arm | s/step | completions/s | tokens/s | peak RSS MiB | breakdown (median s) | "
              "held-out acc |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for arm, info in summary["arms"].items():
        run = info["typical_repeat"]
        if arm == "raw":
            parts = {k: run[k] for k in run if k.endswith("_s") and not k.startswith("raw_sum")}
            lines.append(f"| raw parts (sum {run['raw_sum_s']}) | | | | {run['peak_rss_mib']} | "
                         f"{fmt_parts(parts)} | |")  # fmt: skip
            continue
        acc = ", ".join(f"step {s}: {a:.3f}" for s, a in info["accuracy_at_step"].items())
        lines.append(
            f"| {arm} | {run['median_s_per_step']} | {run['completions_per_s']} | "
            f"{run['generated_tokens_per_s']} | {run['peak_rss_mib']} | "
            f"{fmt_parts(run['step_breakdown_median_s'])} | base {summary['base_acc']:.3f}; {acc} |"
        )
    return "\n".join(lines)


def fmt(value: Any) -> str:
    """Format one table cell."""
    if isinstance(value, bool):
        return "clean" if value else "noisy"
    if isinstance(value, list):
        return "/".join(fmt(v) for v in value)
    return str(value)


def fmt_parts(parts: dict[str, Any]) -> str:
    """Format a step breakdown as ``name value`` pairs."""
    return ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in parts.items() if v is not None)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = parse_args(argv)
    if args.phase != "all":
        run_phase(fill_scale_defaults(args, args.scale[0]))
        return 0
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    for scale in args.scale:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = results_dir / f"compare_{scale}_{stamp}_seed{args.seed}.json"
        summary = compare_scale(fill_scale_defaults(args, scale), path)
        print(markdown(summary), flush=True)
        log(f"results written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
