#!/usr/bin/env python3
"""Where the engine's policy update spends its time on one GPU: variants of one mini-batch.

``gpu_grpo`` measured the engine's update at several times TRL's on the 0.5B model while
its reference pass (the same forward, no backward) was on a par. This probe builds the engine's
CUDA rank (FSDP2, bf16 compute, fp32 masters) on the model ``gpu_grpo.py prepare`` wrote, feeds
it one mini-batch shaped like a step's (groups of ``n`` rows sharing a prompt, full-length
responses) and times, each after a warm-up, with the device synchronised:

- ``ref``: the reference log-prob pass (forward only);
- ``update``: ``update_actor`` as the trainer runs it, then the same under torch's profiler
  (the top operators by GPU and by CPU time are printed);
- ``update_micro_<k>``: larger micro-batches (fewer FSDP2 gathers and reductions);
- ``update_no_shared_prompt``: every row run whole (no prompt pass shared by a group);
- ``plain_autocast``: the same update on an unsharded fp32 module under ``torch.autocast``
  (bf16), as TRL trains: what FSDP2 costs on one rank.

    python -m bench.training.gpu_update_probe --work DIR [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def log(*parts: Any) -> None:
    print("[probe]", *parts, file=sys.stderr, flush=True)


def step_batch(size: Any, prompt_len: int, vocab: int, seed: int = 0) -> Any:
    """Return a mini-batch like a step's: ``prompts`` x ``samples`` rows, full responses."""
    import torch

    from engine.data import DataProto

    g = torch.Generator().manual_seed(seed)
    rows = size.prompts * size.samples
    prompts = torch.randint(300, vocab, (size.prompts, prompt_len), generator=g)
    prompts = prompts.repeat_interleave(size.samples, dim=0)  # (rows, P) groups share a prompt
    responses = torch.randint(300, vocab, (rows, size.max_new_tokens), generator=g)
    input_ids = torch.cat([prompts, responses], dim=-1)
    attention_mask = torch.ones_like(input_ids)
    response_mask = torch.ones_like(responses)
    advantages = torch.randn(rows, 1, generator=g).expand(rows, size.max_new_tokens).contiguous()
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": attention_mask.cumsum(-1) - 1,
            "responses": responses,
            "response_mask": response_mask,
            "advantages": advantages,
            "ref_log_prob": torch.zeros(rows, size.max_new_tokens),
        }
    )


def timed(fn: Any, repeats: int = 1) -> float:
    """Return the median seconds of ``fn()`` after one warm-up call, the device synchronised."""
    import statistics

    import torch

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", required=True)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    import engine.roles.actor as actor_module
    from bench.training.gpu_grpo import SIZES, engine_overrides
    from engine.config import load_config
    from engine.distributed.local_group import LocalWorkerGroup
    from engine.roles.actor import PolicyActor

    work = Path(args.work)
    prep = json.loads((work / "prepare.json").read_text())
    size = SIZES[prep["size"]]
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    config = load_config(
        "grpo_tiny.yaml",
        overrides=engine_overrides(argparse.Namespace(steps=1, seed=0), size, work, device),
    )
    results: dict[str, Any] = {"size": prep["size"]}

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))

    group = LocalWorkerGroup(device)
    group.execute_all("build_role", "actor_rollout_ref", config, total_steps=10, need_ref=True)
    role = group.worker.roles["actor_rollout_ref"]
    worker = role.worker
    batch = step_batch(size, round(prep["prompt_tokens_mean"]), prep["shape"]["vocab_size"])
    on_device = batch.to(device)
    results["rows"], results["micro_batch"] = len(batch), worker.micro_batch_size

    results["ref"] = timed(lambda: role.compute_ref_log_prob(on_device))
    log("ref", results["ref"])
    results["update"] = timed(lambda: role.update_actor(on_device), repeats=2)
    log("update", results["update"])
    save()

    if cuda:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            role.update_actor(on_device)
            torch.cuda.synchronize()
        averages = prof.key_averages()
        results["profile_by_gpu"] = averages.table(sort_by="self_cuda_time_total", row_limit=25)
        results["profile_by_cpu"] = averages.table(sort_by="self_cpu_time_total", row_limit=15)
        print(results["profile_by_gpu"])
        print(results["profile_by_cpu"])
        save()

    micro = worker.micro_batch_size
    for k in (micro * 2, micro * 4):
        worker.micro_batch_size = k
        results[f"update_micro_{k}"] = timed(lambda: role.update_actor(on_device))
        log(f"update micro {k}", results[f"update_micro_{k}"])
        save()
    worker.micro_batch_size = micro

    shared = actor_module.shared_prompts
    actor_module.shared_prompts = lambda *_a, **_k: None
    try:
        results["update_no_shared_prompt"] = timed(lambda: role.update_actor(on_device))
        log("update no shared prompt", results["update_no_shared_prompt"])
    finally:
        actor_module.shared_prompts = shared
    save()

    # The same update on a plain fp32 module under autocast (bf16 on CUDA), no FSDP2.
    from transformers import AutoModelForCausalLM

    from engine.roles.optim import build_optimizer

    group.shutdown()
    role = worker = None  # free the sharded models before the plain one loads
    if cuda:
        torch.cuda.empty_cache()
    plain = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32).to(device)
    arr = config.actor_rollout_ref
    actor = PolicyActor(plain, arr.actor, build_optimizer(plain.parameters(), arr.actor.optim))
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=cuda)

    def plain_update() -> None:
        with autocast:
            actor.update_policy(
                on_device,
                mini_batch_size=len(batch),
                micro_batch_size=micro,
                temperature=1.0,
            )

    results["plain_autocast"] = timed(plain_update)
    log("plain autocast", results["plain_autocast"])
    if cuda:
        results["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    save()
    print(json.dumps({k: v for k, v in results.items() if not k.startswith("profile")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
