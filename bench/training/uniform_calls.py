"""What the padded forward costs on two FSDP2 ranks: one call a micro-batch against agreed buckets.

Under FSDP2 every forward call is a collective, so ranks sharded together must make the same
calls. ``response_logits(uniform_calls=True)`` has the ranks agree on one plan a micro-batch
(one all-reduce): the most length buckets any rank's rows want. The simpler way, one call a
micro-batch (``max_buckets=1``), pads every row to the micro-batch's longest response. This
script starts two gloo ranks on this machine, shards the tiny model over them and times both
ways on one micro-batch each, taking turns (the machine's speed drifts), for the forward alone
(a log-prob pass) and forward and backward (an update). The ranks hold different rows: rank 0's
response lengths spread evenly from ``--shortest`` to ``--longest`` tokens, rank 1's are skewed
short over the same range. Rank 0 prints one JSON line: the median milliseconds of each way and
the median of the per-round ratios ``one call / agreed``. Example::

    .venv/bin/python -m bench.training.uniform_calls --rounds 15
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

WORLD = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--shortest", type=int, default=8)
    parser.add_argument("--longest", type=int, default=200)
    return parser.parse_args(argv)


def padded_batch(
    rows: int, shortest: int, longest: int, vocab: int, skew: float = 1.0, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Return a right-padded batch whose response lengths spread over the range: evenly, or
    bunched towards ``shortest`` for ``skew`` above 1."""
    g = torch.Generator().manual_seed(seed)
    prompt = 24
    spread = torch.linspace(0, 1, rows) ** skew
    lengths = (shortest + spread * (longest - shortest)).round().long()  # (bs,)
    responses = torch.randint(10, vocab, (rows, longest), generator=g)
    response_mask = (torch.arange(longest)[None] < lengths[:, None]).long()
    mask = torch.cat([torch.ones(rows, prompt, dtype=torch.long), response_mask], dim=1)
    prompts = torch.randint(10, vocab, (rows, prompt), generator=g)
    return {
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }


def _rank(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    """One gloo rank: shard the tiny model, time both ways, rank 0 writes the figures."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from engine.distributed.fsdp import apply_fsdp2
    from engine.distributed.process_group import build_device_mesh, init_process_group
    from engine.roles.actor import response_logits
    from engine.tiny import ensure_tiny_assets

    torch.set_num_threads(1)
    init_process_group(rank=rank, world_size=WORLD, host="127.0.0.1", port=port, backend="gloo")
    model = AutoModelForCausalLM.from_pretrained(
        str(ensure_tiny_assets().model_dir), dtype=torch.float32
    )
    fsdp = SimpleNamespace(param_offload=False, mixed_precision="fp32", reshard_after_forward=True)
    apply_fsdp2(model, build_device_mesh("cpu", WORLD), fsdp, "cpu", "actor")
    vocab = model.config.vocab_size
    batch = padded_batch(args.rows, args.shortest, args.longest, vocab, 1.0 + 2 * rank, rank)
    ways = {"one_call": {"max_buckets": 1}, "agreed": {"uniform_calls": True}}

    def forward(way: str) -> None:
        with torch.no_grad():
            response_logits(model, batch, **ways[way])

    def update(way: str) -> None:
        model.zero_grad(set_to_none=True)
        response_logits(model, batch, **ways[way]).logsumexp(-1).sum().backward()

    lengths = batch["attention_mask"][:, -batch["responses"].shape[1] :].sum(-1)
    result: dict[str, object] = {"rows": args.rows, "lengths": [args.shortest, args.longest]}
    for name, step in (("forward", forward), ("forward_backward", update)):
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds + 1):  # the first round warms up and is left out
            for way in ways:
                dist.barrier()
                start = time.perf_counter()
                step(way)
                dist.barrier()  # a round ends when the slower rank is done
                times[way].append(time.perf_counter() - start)
        one, agreed = times["one_call"][1:], times["agreed"][1:]
        result[name] = {
            "one_call_ms": round(statistics.median(one) * 1000, 1),
            "agreed_ms": round(statistics.median(agreed) * 1000, 1),
            "one_call_over_agreed": round(
                statistics.median(o / a for o, a in zip(one, agreed, strict=True)), 2
            ),
        }
    means = [torch.zeros(1) for _ in range(WORLD)]
    dist.all_gather(means, lengths.float().mean().reshape(1))
    result["rank_mean_lengths"] = [round(float(m), 1) for m in means]
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    # Gloo's threads can still be joinable at interpreter exit, where their destructors call
    # std::terminate; the figures are written, so leave without running destructors.
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    from engine.distributed.process_group import free_port

    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "result.json")
        mp.start_processes(_rank, args=(free_port(), args, out), nprocs=WORLD, start_method="spawn")
        print(Path(out).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
