"""Synchronous, one-step-off and fully-async GRPO on the tiny task, side by side in one run.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.training.async_compare --steps 12 --repeats 2

Arms, alternated ``--repeats`` times so both see the same machine load:

- ``sync``: ``PPOTrainer`` (``actor_rollout_ref.hybrid_engine=True``): generate, then train, in
  one process with one thread.
- ``one_step_off``: ``OneStepOffPPOTrainer`` (``hybrid_engine=False``): a rollout worker process
  (one thread) generates batch t+1 while the trainer (one thread) trains on batch t.
- ``fully_async``: ``FullyAsyncPPOTrainer`` (``hybrid_engine=False`` with ``async_training.*``):
  the worker streams batches into a queue of floor(T x (1 + ``--staleness``)) batches, the
  weights sync every T = ``--sync-step`` steps (``require_batches=1``: a step is one batch, as in
  the other arms, so all three train on the same number of samples).

``--controller ray`` runs every arm over ``--ranks`` FSDP ranks of the Ray controller
(``RayPPOTrainer`` and ``engine.trainer.ray_async``): the ranks train (and, synchronously,
generate) with one thread each, the asynchronous arms' rollout worker runs beside them.
``--task varlen`` trains ``bench.training.varlen``'s variable-length task instead of the tiny
one (``task_overrides``).

Each arm runs in its own process (``python -m bench.training.async_compare arm <name> ...``) and
prints one JSON line. A step's time is the wall time between the ends of consecutive steps; the
medians skip ``--skip`` warm-up steps (the rollout worker's start falls in the first) and the last
step (it validates); ``total_s`` is the whole run, the worker's start included.
``sync_weights_s_per_step`` is the trainer's time sending its weights, averaged over the steps.
``trainer_cpu_s_per_step`` and ``worker_gen_cpu_s`` are CPU seconds: on a shared machine the
wall time less the CPU time is the wait for a core (and two processes get a larger share of a
loaded machine than one). Samples/s is ``train_batch_size x rollout.n`` over the median step. The
limit of the overlap is the slower side: the worker's generation (``timing_s/rollout_worker_gen``)
or the trainer's work (the step less its wait for the batch, ``timing_s/gen``); ``bound_s`` is the
larger, and ``of_bound`` says how close the step gets to it. ``heldout_reward`` is the validation
reward (greedy, the tiny task's held-out set) after the last step.
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

ARMS = ("sync", "one_step_off", "fully_async")
TASKS = ("tiny", "varlen")
VARLEN_VAL = 64  # held-out prompts of the varlen task (greedy, up to --response-length tokens)
ASYNC_ARMS = ("one_step_off", "fully_async")


def overrides(args: Any, arm: str, out_dir: Path) -> list[str]:
    """Return the verl overrides of ``arm`` on the tiny GRPO preset.

    The asynchronous arms take pi_old from the rollout (``actor.use_rollout_log_probs``, as
    verl's one-step-off preset does with bypass mode and its fully-async config by default)
    unless ``--recompute-old``: then pi_old is the actor's own policy when the step begins, from
    a pass of its own or, where the update sees the batch once in one mini-batch and the
    correction is IS alone, from the update's forward (``rollout_is_in_update``).
    """
    pi_old_from_rollout = arm in ASYNC_ARMS and not args.recompute_old
    fully_async = (
        [
            f"async_training.staleness_threshold={args.staleness}",
            f"async_training.trigger_parameter_sync_step={args.sync_step}",
            "async_training.require_batches=1",
        ]
        if arm == "fully_async"
        else []
    )
    ray = (
        [
            "trainer.controller=ray",
            "trainer.device=cpu",
            f"trainer.n_gpus_per_node={args.ranks}",
            f"ray_init.num_cpus={args.ranks}",
        ]
        if args.controller == "ray"
        else []
    )
    correction = (
        [f"algorithm.rollout_correction.rollout_is={args.rollout_is}"]
        if args.rollout_is and arm in ASYNC_ARMS
        else []
    )
    return (
        fully_async
        + correction
        + ray
        + task_overrides(args)
        + [
            f"actor_rollout_ref.actor.use_rollout_log_probs={pi_old_from_rollout}",
            f"data.train_batch_size={args.batch}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
            f"actor_rollout_ref.rollout.n={args.n}",
            f"data.max_response_length={args.response_length}",
            f"actor_rollout_ref.actor.optim.lr={args.lr}",
            f"trainer.total_training_steps={args.steps}",
            f"trainer.test_freq={args.steps}",
            "trainer.val_before_train=False",
            "trainer.save_freq=-1",
            "trainer.logger=[]",
            f"trainer.seed={args.seed}",
            f"trainer.default_local_dir={out_dir}",
            f"actor_rollout_ref.hybrid_engine={arm == 'sync'}",
            f"actor_rollout_ref.rollout.ignore_eos={args.ignore_eos}",
        ]
    )


def task_overrides(args: Any) -> list[str]:
    """Return the overrides that put the ``--task`` in place of the tiny preset's own.

    ``varlen`` is ``bench.training.varlen``'s task: a random Qwen2 of ``--shape`` whose responses
    end after a geometric number of tokens (median about 40, up to the cap), its reward the
    fraction of digits in the response; the held-out set is ``VARLEN_VAL`` of the doubling
    task's validation prompts, two samples each scored with the same reward.
    """
    if args.task == "tiny":
        return []
    from bench.training import varlen
    from bench.training.compare_tasks import (
        doubling_answer,
        doubling_question,
        doubling_splits,
        write_train_parquet,
    )

    root = Path(args.root)
    task = varlen.prepare(root, args.shape)
    budget = args.batch * args.n * (16 + args.response_length)
    val = root / f"varlen-{args.shape}" / f"val{VARLEN_VAL}.parquet"
    if not val.exists():
        items = doubling_splits()[1][:VARLEN_VAL]
        write_train_parquet(
            val, [(doubling_question(i), doubling_answer(i)) for i in items], "varlen"
        )
    return [
        f"actor_rollout_ref.model.path={task.model_dir}",
        f"data.train_files={task.train_parquet}",
        f"data.val_files={val}",
        "data.max_prompt_length=16",
        f"custom_reward_function.path={Path(varlen.__file__)}",
        "custom_reward_function.name=varlen_score",
        # Held-out: sampled as in training (greedy decoding of the random model writes no
        # digits at all), two samples a prompt, the same seed in every arm.
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        # varlen's engine arm: packed rows, every pass one micro-batch of the batch's tokens.
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={budget}",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={budget}",
    ]


def median_of(rows: list[dict[str, float]], key: str) -> float | None:
    """Return the median of ``row[key]`` over the rows that have it (None if none)."""
    values = [row[key] for row in rows if key in row]
    return round(statistics.median(values), 4) if values else None


def run_arm(args: Any) -> dict[str, Any]:
    """Train one arm in this process; return its figures."""
    from bench.training.step_clock import StepClock
    from engine.config import load_config
    from engine.trainer.run import trainer_class

    out_dir = Path(args.root) / args.arm
    config = load_config("grpo_tiny.yaml", overrides=overrides(args, args.arm, out_dir))
    clock = StepClock()
    start = time.perf_counter()
    status = trainer_class(config)(config, clock).fit()
    total = time.perf_counter() - start
    steady = slice(args.skip, len(clock.wall) - 1)  # the last step validates
    wall, rows = clock.wall[steady], clock.metrics[steady]
    median = statistics.median(wall)
    samples = args.batch * args.n
    result: dict[str, Any] = {
        "arm": args.arm,
        "status": status,
        "median_s_per_step": round(median, 4),
        "trainer_cpu_s_per_step": round(statistics.median(clock.cpu[steady]), 4),
        "samples_per_s": round(samples / median, 2),
        "wait_or_gen_s": median_of(rows, "timing_s/gen"),
        "update_s": median_of(rows, "timing_s/update_actor"),
        "old_log_prob_s": median_of(rows, "timing_s/old_log_prob"),
        "response_length_mean": median_of(rows, "response_length/mean"),
        "total_s": round(total, 2),
        "step_wall_all_s": [round(w, 4) for w in clock.wall],
        "heldout_reward": next(
            (round(v, 4) for k, v in clock.metrics[-1].items() if k.startswith("val-core/")),
            None,
        ),
        "reward_all_steps": [round(m["critic/score/mean"], 4) for m in clock.metrics],
    }
    if args.arm in ASYNC_ARMS:
        gen = [m["timing_s/rollout_worker_gen"] for m in rows]
        train = [m["timing_s/step"] - m["timing_s/gen"] for m in rows]
        bound = statistics.median([max(g, t) for g, t in zip(gen, train, strict=True)])
        result |= {
            "worker_gen_s": round(statistics.median(gen), 4),
            "worker_gen_cpu_s": median_of(rows, "timing_s/rollout_worker_gen_cpu"),
            "trainer_busy_s": round(statistics.median(train), 4),
            "bound_s": round(bound, 4),
            "of_bound": round(bound / median, 3),
            "staleness_mean": median_of(rows, "async/staleness_mean"),
            "staleness_max": max(m["async/staleness_max"] for m in clock.metrics),
            # Per step on average: one-step-off syncs every step, fully-async every T steps.
            "sync_weights_s_per_step": round(
                statistics.mean(m["timing_s/sync_rollout_weights"] for m in rows), 4
            ),
        }
    if args.arm == "fully_async":
        result |= {
            "queue_size_median": median_of(rows, "async/queue_size"),
            "dropped_stale_samples": clock.metrics[-1]["async/dropped_stale_samples_total"],
        }
    return result


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=TASKS, default="tiny", help="tiny: the tiny preset's")
    parser.add_argument(
        "--shape", choices=("tiny", "small", "medium"), default="small", help="varlen: the model"
    )
    parser.add_argument(
        "--controller",
        choices=("local", "ray"),
        default="local",
        help="ray: every arm over --ranks FSDP ranks of the Ray controller (one thread each)",
    )
    parser.add_argument("--ranks", type=int, default=2, help="ray: ranks of the worker group")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each arm, alternated")
    parser.add_argument("--batch", type=int, default=32, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--ignore-eos", action="store_true", help="every response runs to --response-length"
    )
    parser.add_argument(
        "--recompute-old", action="store_true", help="asynchronous arms: pi_old is the actor's"
    )
    parser.add_argument(
        "--staleness", type=float, default=0.5, help="fully_async: staleness_threshold"
    )
    parser.add_argument(
        "--rollout-is",
        choices=("token", "sequence"),
        default=None,
        help="asynchronous arms: algorithm.rollout_correction.rollout_is (with --recompute-old: "
        "pi_old / pi_rollout weighs each token or sequence)",
    )
    parser.add_argument(
        "--sync-step", type=int, default=2, help="fully_async: trigger_parameter_sync_step"
    )
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms to run")
    parser.add_argument("--root", default="/tmp/async_compare")
    parser.add_argument("--out", default=None, help="write the results here as JSON")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    if argv[:1] == ["arm"]:
        args = parse(argv[2:])
        args.arm = argv[1]
        print(json.dumps(run_arm(args)))
        return
    args = parse(argv)
    if args.steps < args.skip + 2:
        raise SystemExit(f"--steps must be at least --skip + 2 ({args.skip + 2})")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    load = os.getloadavg()[0]
    results = []
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or "sync" not in arms:
        raise SystemExit(f"--arms: {', '.join(ARMS)}, sync among them (got {args.arms})")
    for repeat in range(args.repeats):
        for arm in arms:
            done = subprocess.run(
                [sys.executable, "-m", "bench.training.async_compare", "arm", arm, *argv],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(f"arm {arm} failed:\n{done.stderr[-4000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["repeat"] = repeat
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("all_s")}))
    summary: dict[str, float] = {}
    for arm in arms:
        rates = [r["samples_per_s"] for r in results if r["arm"] == arm]
        summary[arm] = round(statistics.median(rates), 2)
    for arm in arms:
        if arm != "sync":
            summary[f"{arm}_speedup"] = round(summary[arm] / summary["sync"], 3)
    summary["load_average_at_start"] = round(load, 2)
    summary["load_average_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps({"samples_per_s_median": summary}))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "runs": results}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
