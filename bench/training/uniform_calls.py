"""What one forward call a micro-batch costs against length buckets, on the padded path.

Ranks sharded together make one call a micro-batch (``response_logits(uniform_calls=True)``):
every FSDP2 forward is a collective, and how many calls length buckets make depends on a rank's
rows. One process keeps the buckets. This script times both on one micro-batch of the tiny
model, taking turns in one process (the machine's speed drifts), for the forward alone (a
log-prob pass) and forward and backward (an update), and prints one JSON line: the median
milliseconds of each and the median of the per-round ratios ``one call / buckets``. The rows'
response lengths spread from ``--shortest`` to ``--longest`` tokens. Example::

    .venv/bin/python -m bench.training.uniform_calls --rounds 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--shortest", type=int, default=8)
    parser.add_argument("--longest", type=int, default=200)
    return parser.parse_args(argv)


def padded_batch(rows: int, shortest: int, longest: int, vocab: int) -> dict[str, torch.Tensor]:
    """Return a right-padded batch whose response lengths spread evenly over the range."""
    g = torch.Generator().manual_seed(0)
    prompt = 24
    lengths = torch.linspace(shortest, longest, rows).round().long()  # (bs,)
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from engine.roles.actor import response_logits
    from engine.tiny import ensure_tiny_assets

    model = AutoModelForCausalLM.from_pretrained(
        str(ensure_tiny_assets().model_dir), dtype=torch.float32
    )
    batch = padded_batch(args.rows, args.shortest, args.longest, model.config.vocab_size)

    def forward(uniform: bool) -> None:
        with torch.no_grad():
            response_logits(model, batch, uniform_calls=uniform)

    def update(uniform: bool) -> None:
        model.zero_grad(set_to_none=True)
        response_logits(model, batch, uniform_calls=uniform).logsumexp(-1).sum().backward()

    result: dict[str, object] = {"rows": args.rows, "lengths": [args.shortest, args.longest]}
    for name, step in (("forward", forward), ("forward_backward", update)):
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds + 1):  # the first round warms up and is left out
            for uniform in (False, True):
                start = time.perf_counter()
                step(uniform)
                times[uniform].append(time.perf_counter() - start)
        buckets, one = times[False][1:], times[True][1:]
        result[name] = {
            "buckets_ms": round(statistics.median(buckets) * 1000, 1),
            "one_call_ms": round(statistics.median(one) * 1000, 1),
            "one_call_over_buckets": round(
                statistics.median(o / b for o, b in zip(one, buckets, strict=True)), 2
            ),
        }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
