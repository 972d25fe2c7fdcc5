"""Score a model or checkpoint on a dataset with the training reward functions.

    python -m engine.eval --model tiny://model --data tiny://val.parquet
    python -m engine.eval --model checkpoints/p/e/global_step_60 --data val.parquet --n 8

Greedy accuracy is the mean greedy reward (the share of correct answers for 0/1 rewards); with
``--n`` > 1 it also samples n responses per prompt and reports mean@n and best@n (pass@n).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from engine.data.dataset import DatasetError, RLHFDataset, collate_prompts
from engine.rollout.hf import eos_token_ids
from engine.rollout.sampling import sample_sequences
from engine.trainer.metrics import compute_validation_metrics
from engine.workers.models import load_tokenizer, resolve_device, resolve_path


def model_folder(path: str) -> str:
    """Return the Hugging Face folder for a model folder or a ``global_step_<N>`` checkpoint."""
    local = Path(resolve_path(path) or path)
    for candidate in (local, local / "actor" / "huggingface", local / "huggingface"):
        if (candidate / "config.json").exists():
            return str(candidate)
    raise FileNotFoundError(
        f"--model {path!r} is neither a Hugging Face folder nor a checkpoint with "
        "actor/huggingface (save checkpoints with "
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model])"
    )


@torch.no_grad()
def evaluate(
    model: str,
    data_files: list[str],
    *,
    n: int = 1,
    temperature: float = 1.0,
    max_prompt_length: int = 512,
    max_response_length: int = 256,
    batch_size: int = 64,
    data_key_map: dict[str, str] | None = None,
    device: str = "auto",
    seed: int = 1,
) -> dict[str, Any]:
    """Return greedy accuracy and, for ``n`` > 1, mean@n and best@n per data source."""
    from engine.rewards import RewardManager

    folder = model_folder(model)
    torch_device = resolve_device(device)
    tokenizer = load_tokenizer(types.SimpleNamespace(path=folder, tokenizer=None))
    policy = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(torch_device)
    policy.eval()
    data_config = types.SimpleNamespace(
        max_prompt_length=max_prompt_length,
        truncation="left",
        filter_overlong_prompts=False,
        data_key_map=data_key_map or {},
        prompt_key="prompt",
        reward_fn_key="data_source",
    )
    dataset = RLHFDataset([resolve_path(f) for f in data_files], tokenizer, data_config)
    reward_fn = RewardManager(tokenizer)
    eos = eos_token_ids(tokenizer, policy)
    generator = torch.Generator().manual_seed(seed)
    results: dict[str, Any] = {"model": folder, "num_prompts": len(dataset)}
    passes = [("greedy", 1, False)] + ([("sampled", n, True)] if n > 1 else [])
    for name, repeat, do_sample in passes:
        sources, uids, scores = [], [], []
        for start in range(0, len(dataset), batch_size):
            items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
            prompts = collate_prompts(items, tokenizer.pad_token_id).repeat(repeat)
            out = sample_sequences(
                policy,
                prompts.batch["input_ids"].to(torch_device),
                prompts.batch["attention_mask"].to(torch_device),
                max_new_tokens=max_response_length,
                eos_token_ids=eos,
                pad_token_id=tokenizer.pad_token_id,
                do_sample=do_sample,
                temperature=temperature,
                generator=generator if torch_device.type == "cpu" else None,
            )
            prompts.batch["responses"] = out.responses.cpu()
            prompts.batch["response_mask"] = out.response_mask.cpu()
            reward = reward_fn(prompts, return_dict=True)["reward_tensor"].sum(-1)
            sources += [str(s) for s in prompts.non_tensor_batch["data_source"]]
            uids += [str(i) for i in prompts.non_tensor_batch["index"]]
            scores += reward.tolist()
        metrics = compute_validation_metrics(sources, uids, scores)
        if name == "greedy":
            results["greedy_accuracy"] = float(np.mean(scores))
            results["greedy"] = metrics
        else:
            results["sampled"] = metrics
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.eval", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True, help="HF folder, tiny://model or a checkpoint")
    parser.add_argument("--data", required=True, nargs="+", help="parquet / jsonl / csv files")
    parser.add_argument("--n", type=int, default=1, help="samples per prompt for mean@n / best@n")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-prompt-length", type=int, default=512)
    parser.add_argument("--max-response-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--key-map", default="{}", help='JSON data_key_map, e.g. {"prompt": "question"}'
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    from engine.env import apply_cpu_process_env

    apply_cpu_process_env()
    try:
        result = evaluate(
            args.model,
            args.data,
            n=args.n,
            temperature=args.temperature,
            max_prompt_length=args.max_prompt_length,
            max_response_length=args.max_response_length,
            batch_size=args.batch_size,
            data_key_map=json.loads(args.key_map),
            device=args.device,
        )
    except (FileNotFoundError, DatasetError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print(f"model: {result['model']}  prompts: {result['num_prompts']}")
        print(f"greedy accuracy: {result['greedy_accuracy']:.4f}")
        for key, value in result.get("sampled", {}).items():
            print(f"{key}: {value:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
