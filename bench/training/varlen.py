"""The engine against TRL's GRPOTrainer where response lengths vary from a few tokens to 256.

``compare_trl.py``'s tasks answer in nearly fixed lengths; long chain-of-thought responses vary by
10x inside one batch, and that is where token-budget micro-batches (``use_dynamic_bsz``) and the
padding-free forward (``use_remove_padding``) pay. This script runs, side by side in one
invocation and each arm in its own process (so peak memory is per arm):

* the engine with dynamic batching and packing, and TRL, at each maximum response length of
  ``--lengths`` (default 32 64 128 256): how step time grows with the longest response;
* at the longest length, the engine with packing only, dynamic batching only, and neither.

The task: a Qwen2 of ``--shape`` (``medium``: ``compare_trl``'s 27M-parameter shape; ``small``:
hidden 256, 4 layers, 3.5M; ``tiny``: the embedded model's shape, 1M), randomly initialised
(seeded, nothing downloaded), whose EOS embedding (tied to its output row) is set along the mean
final hidden state, so that EOS has a near-constant logit of ``EOS_LOGIT`` (about 1.6% a token
against 262 near-uniform others): responses end after a geometric number of tokens, from one to
the cap (median about 40). The prompts are ``compare_trl``'s doubling-chain questions; the reward,
the same in both arms, is the fraction of digits in the response (it varies between samples, so
GRPO's advantages are not zero). Every other setting is ``compare_trl``'s (``compare_arms``): 8
prompts x 4 samples, one on-policy update per batch, the k3 KL loss to a reference, token-mean
loss, AdamW, fp32.

Figures per arm: the median step time over the steps after the first (wall, and CPU time, which
waiting for a busy core does not inflate), mean response length, peak RSS, the step breakdown.
Ratios are TRL over engine. Each arm runs after the other, so a drifting host moves them: the
machine load is recorded per arm (``cpu_during_train``).

```bash
.venv/bin/python -m bench.training.varlen --shape medium --steps 6          # the full run
.venv/bin/python -m bench.training.varlen --shape small --steps 4 --threads 2
```

This module imports only the standard library at the top: the engine loads it as its custom
reward file (``varlen_score``) in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
EOS_LOGIT = 2.5
SHAPES = {
    "medium": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 8,
               "intermediate_size": 1536},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 4,
              "intermediate_size": 768},
    "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
             "intermediate_size": 512},
}  # fmt: skip
MAX_POSITIONS = 512  # prompt (<= 16) + 256 new tokens
# (framework, dynamic batching, packing) of each engine variant; TRL has neither.
VARIANTS = {
    "engine": ("engine", True, True),
    "engine_packing_only": ("engine", False, True),
    "engine_dynamic_only": ("engine", True, False),
    "engine_neither": ("engine", False, False),
    "trl": ("trl", False, False),
}


# -- reward (the engine imports this file as its custom reward) ----------------------------------
def varlen_reward(text: str, answer: str) -> float:
    """Return the fraction of the response's characters that are digits (0 for an empty one)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def varlen_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **_: Any
) -> float:
    """Score a response (the engine's ``custom_reward_function`` signature)."""
    return varlen_reward(solution_str, str(ground_truth))


# -- the task -----------------------------------------------------------------------------------
def prepare(root: Path, shape: str) -> Any:
    """Build (or reuse) the model of ``shape`` and the prompts; return ``compare_tasks.TaskData``."""
    import random

    from bench.training.compare_tasks import (
        SEED,
        TaskData,
        doubling_answer,
        doubling_question,
        doubling_splits,
        write_train_parquet,
    )

    model_dir = root / f"varlen-{shape}" / "model"
    if not (model_dir / "config.json").exists():
        build_model(model_dir, shape)
    train_items, _, _ = doubling_splits()
    train = [(doubling_question(it), doubling_answer(it)) for it in train_items]
    random.Random(SEED + 2).shuffle(train)
    parquet = root / f"varlen-{shape}" / "train.parquet"
    if not parquet.exists():
        write_train_parquet(parquet, train, "varlen")
    return TaskData(str(model_dir), train, [], str(parquet), "varlen")


def build_model(out_dir: Path, shape: str) -> None:
    """Save a seeded random Qwen2 of ``shape`` whose EOS logit is about ``EOS_LOGIT`` everywhere."""
    import torch

    from engine.tiny import build_model as build_qwen2
    from engine.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_qwen2(tokenizer, 0, **SHAPES[shape], max_positions=MAX_POSITIONS).eval()
    ids = torch.randint(10, len(tokenizer), (8, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state.flatten(0, 1)  # (512, H)
        mean = hidden.mean(0)  # (H,) the states' common direction: h . mean / |mean|^2 ~ 1
        model.model.embed_tokens.weight[tokenizer.eos_token_id] = EOS_LOGIT * mean / mean.dot(mean)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


# -- one arm (a child process) ------------------------------------------------------------------
def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    """Train one arm for ``--steps`` steps and return ``compare_arms``' figures for it."""
    import torch

    torch.set_num_threads(args.threads)
    from bench.training import compare_arms
    from bench.training.compare_tasks import SCALES, Scale

    framework, dynamic, packing = VARIANTS[args.arm]
    SCALES["varlen"] = Scale("varlen", args.max_len, args.steps, args.lr, 1, "varlen")
    compare_arms.SKIP = 1  # the first step (allocations, first calls) is left out of medians
    task = prepare(Path(args.root), args.shape)
    settings = argparse.Namespace(
        scale="varlen",
        steps=args.steps,
        lr=args.lr,
        beta=0.04,
        engine_kl="low_var_kl",
        seed=args.seed,
        threads=args.threads,
        root=str(Path(args.root) / f"varlen-{args.shape}" / args.arm),
        eval_steps=[],
    )
    if framework == "trl":
        compare_arms.reward_for = lambda scale: varlen_reward
        result = compare_arms.run_trl(settings, task)
    else:
        shared = compare_arms.engine_overrides
        # Every micro-batch holds the whole mini-batch's tokens: one packed row per pass.
        budget = (
            compare_arms.PROMPTS_PER_STEP * compare_arms.SAMPLES_PER_PROMPT * (16 + args.max_len)
        )

        def overrides(*a: Any) -> list[str]:
            rows = [o for o in shared(*a) if not o.startswith("custom_reward_function.")]
            rows += [f"custom_reward_function.path={Path(__file__)}"]
            rows += ["custom_reward_function.name=varlen_score"]
            if dynamic:
                rows += ["actor_rollout_ref.actor.use_dynamic_bsz=True"]
                rows += [f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}"]
            if packing:
                rows += ["actor_rollout_ref.model.use_remove_padding=True"]
            return rows

        compare_arms.engine_overrides = overrides
        result = compare_arms.run_engine(settings, task)
    result.update(variant=args.arm, max_len=args.max_len, dynamic=dynamic, packing=packing)
    return result


# -- the passes alone, in one process ------------------------------------------------------------
def run_passes(args: argparse.Namespace) -> dict[str, Any]:
    """Time the actor's update and reference passes on one variable-length batch, taking turns.

    The rollout and the machine's drift out of the picture: a batch of 8 prompts x 4 responses
    whose lengths are drawn geometric (mean ``--mean-len``, capped at ``--max-len``), then, round
    after round, each variant's update (``update_policy`` with lr 0, so the weights stay put) and
    reference pass (``compute_log_prob``): ``padded`` (the engine's length buckets and shared
    prompt pass), ``packed`` (``use_remove_padding``), and ``full`` (the model's forward over the
    whole padded batch, as TRL runs it, with the same loss). Returns the median CPU and wall
    seconds per variant and the median per-round CPU ratios against ``packed``.
    """
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from engine.algorithms.torch_functional import logprobs_from_logits
    from engine.config.schema import PPOConfig
    from engine.data import DataProto
    from engine.roles.actor import PolicyActor

    torch.set_num_threads(args.threads)
    task = prepare(Path(args.root), args.shape)
    model = AutoModelForCausalLM.from_pretrained(task.model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(args.seed)
    rows, prompt = 32, 10
    p = 1.0 / args.mean_len
    draws = torch.empty(rows).exponential_(generator=g) / -torch.log1p(torch.tensor(-p))
    lengths = (draws.floor().long() + 1).clamp(max=args.max_len)  # geometric, >= 1
    width = int(lengths.max())
    prompts = torch.randint(10, 200, (rows // 4, prompt), generator=g).repeat_interleave(4, 0)
    responses = torch.randint(10, 200, (rows, width), generator=g)
    response_mask = (torch.arange(width)[None] < lengths[:, None]).long()
    responses = responses * response_mask
    attention_mask = torch.cat([torch.ones_like(prompts), response_mask], -1)
    batch = DataProto.from_dict(
        {
            "input_ids": torch.cat([prompts, responses], -1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": response_mask,
            "advantages": torch.randn(rows, 1, generator=g) * response_mask,
            "ref_log_prob": -torch.rand(rows, width, generator=g) * response_mask,
        }
    )
    cfg = copy.deepcopy(PPOConfig().actor_rollout_ref.actor)
    cfg.use_kl_loss, cfg.kl_loss_coef, cfg.loss_agg_mode = True, 0.04, "token-mean"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    actors = {
        name: PolicyActor(model, cfg, optimizer, remove_padding=name == "packed")
        for name in ("padded", "packed")
    }

    def full_update() -> None:  # one padded forward + the same loss, as TRL computes it
        b = batch.batch
        model.train()
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False
        ).logits[:, prompt - 1 : -1]  # (32, R, V)
        log_prob = logprobs_from_logits(logits, b["responses"])
        ratio = torch.exp(log_prob - log_prob.detach())
        kl = torch.exp(b["ref_log_prob"] - log_prob) - (b["ref_log_prob"] - log_prob) - 1
        token = -b["advantages"] * ratio + 0.04 * kl
        loss = (token * b["response_mask"]).sum() / b["response_mask"].sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def full_ref() -> None:
        model.eval()
        b = batch.batch
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        logprobs_from_logits(logits[:, prompt - 1 : -1], b["responses"])

    def update(name: str) -> Any:
        if name == "full":
            return full_update
        return lambda: actors[name].update_policy(
            batch, mini_batch_size=rows, micro_batch_size=rows, temperature=1.0
        )

    def ref(name: str) -> Any:
        if name == "full":
            return full_ref
        return lambda: actors[name].compute_log_prob(
            batch, micro_batch_size=rows, temperature=1.0, with_entropy=False
        )

    times: dict[str, list[tuple[float, float]]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name in ("padded", "packed", "full"):
            for part, make in (("update", update), ("ref", ref)):
                fn = make(name)
                wall, cpu = time.perf_counter(), time.process_time()
                fn()
                if round_:
                    times.setdefault(f"{part}/{name}", []).append(
                        (time.process_time() - cpu, time.perf_counter() - wall)
                    )
    import statistics

    def ratio(key: str, base: str) -> float:
        return round(
            statistics.median(a[0] / b[0] for a, b in zip(times[key], times[base], strict=True)),
            2,
        )

    return {
        "shape": args.shape,
        "params": sum(p.numel() for p in model.parameters()),
        "lengths": sorted(lengths.tolist()),
        "real_tokens": int(attention_mask.sum()),
        "padded_tokens": rows * (prompt + width),
        "median_cpu_s": {k: round(statistics.median(c for c, _ in v), 4) for k, v in times.items()},
        "median_wall_s": {
            k: round(statistics.median(w for _, w in v), 4) for k, v in times.items()
        },
        "cpu_ratio_over_packed": {
            k: ratio(k, k.split("/")[0] + "/packed") for k in times if not k.endswith("packed")
        },
        "threads": args.threads,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


# -- the driver ---------------------------------------------------------------------------------
def plan(lengths: list[int]) -> list[tuple[str, int]]:
    """Return the (variant, max length) arms in run order: the sweep, then the ablations."""
    longest = max(lengths)
    arms = [(variant, n) for n in lengths for variant in ("engine", "trl")]
    arms += [(v, longest) for v in ("engine_packing_only", "engine_dynamic_only", "engine_neither")]
    return arms


def run_child(args: argparse.Namespace, variant: str, max_len: int) -> dict[str, Any]:
    """Run one arm in a fresh process and return the JSON line it prints."""
    from bench.training.compare_trl import child_env

    cmd = [
        sys.executable, "-m", "bench.training.varlen", "--arm", variant,
        f"--max-len={max_len}", f"--shape={args.shape}", f"--steps={args.steps}",
        f"--lr={args.lr}", f"--seed={args.seed}", f"--threads={args.threads}",
        f"--root={args.root}",
    ]  # fmt: skip
    print(f"[varlen] {variant} max_len={max_len}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=child_env(args.threads))
    if proc.returncode != 0:
        raise SystemExit(f"the {variant} arm failed with exit code {proc.returncode}")
    result = json.loads([r for r in proc.stdout.splitlines() if r.startswith('{"')][-1])
    result["process_wall_s"] = round(time.perf_counter() - start, 1)
    return result


def summarise(rows: list[dict[str, Any]], lengths: list[int]) -> dict[str, Any]:
    """Return the per-arm figures and the ratios (TRL over each engine arm, per step)."""
    by = {(r["variant"], r["max_len"]): r for r in rows}
    longest = max(lengths)

    def ratio(num: str, den: str, n: int, key: str = "median_s_per_step") -> float:
        return round(by[(num, n)][key] / by[(den, n)][key], 2)

    return {
        "trl_over_engine_by_length": {n: ratio("trl", "engine", n) for n in lengths},
        "trl_over_engine_cpu_by_length": {
            n: ratio("trl", "engine", n, "median_cpu_s_per_step") for n in lengths
        },
        "trl_over_variant_at_longest": {
            v: ratio("trl", v, longest) for v in VARIANTS if v != "trl"
        },
        "packing_off_over_on": {
            "with dynamic batching": ratio("engine_dynamic_only", "engine", longest),
            "without dynamic batching": ratio("engine_neither", "engine_packing_only", longest),
        },
        "dynamic_off_over_on": {
            "with packing": ratio("engine_packing_only", "engine", longest),
            "without packing": ratio("engine_neither", "engine_dynamic_only", longest),
        },
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """Return the per-arm table."""
    lines = [
        "| arm | max len | s/step (median) | CPU s/step | mean response | peak RSS MiB | "
        "generate / ref / update s | foreign CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        parts = r["step_breakdown_median_s"]
        split = " / ".join(
            f"{parts.get(k) or 0:.2f}" for k in ("generate_s", "ref_log_prob_s", "update_s")
        )
        lines.append(
            f"| {r['variant']} | {r['max_len']} | {r['median_s_per_step']:.3f} | "
            f"{r['median_cpu_s_per_step']:.3f} | {r['mean_completion_len_tokens']:.1f} | "
            f"{r['peak_rss_mib']:.0f} | {split} | {r['cpu_during_train']['foreign_cpu_frac']} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="medium", choices=sorted(SHAPES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--steps", type=int, default=6, help="per arm; the first is left out")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 1)))
    parser.add_argument("--root", default=None, help="default <POSTTRAIN_DATA_DIR>/compare_trl")
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument(
        "--passes", action="store_true", help="only the update and reference passes, in turns"
    )
    parser.add_argument("--rounds", type=int, default=5, help="--passes: timed rounds")
    parser.add_argument("--mean-len", type=int, default=60, help="--passes: mean response")
    parser.add_argument("--arm", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--max-len", type=int, default=256, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if max(args.lengths) > MAX_POSITIONS - 16:
        parser.error(f"--lengths: at most {MAX_POSITIONS - 16} new tokens")
    if args.root is None:
        data = os.environ.get("POSTTRAIN_DATA_DIR", str(Path.home() / ".posttrain"))
        args.root = str(Path(data) / "compare_trl")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.passes:
        print(json.dumps(run_passes(args), indent=1))
        return 0
    if args.arm:
        from bench.training.compare_arms import print_result

        print_result(run_arm(args))
        return 0
    started = time.perf_counter()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    rows = [run_child(args, variant, n) for variant, n in plan(args.lengths)]
    summary = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("arm", "max_len")},
        "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "wall_s": round(time.perf_counter() - started, 1),
        **summarise(rows, args.lengths),
        "arms": rows,
    }
    out = Path(args.results_dir) / f"varlen_{args.shape}_{time.strftime('%Y%m%d_%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(markdown(rows))
    print(json.dumps({k: v for k, v in summary.items() if k != "arms"}, indent=1))
    print(f"[varlen] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
