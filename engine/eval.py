"""Score a model or checkpoint on a dataset with the training reward functions.

    python -m engine.eval --model tiny://model --data tiny://val.parquet
    python -m engine.eval --model checkpoints/p/e/global_step_60 --data val.parquet --n 8
    python -m engine.eval --model tiny://model --data tiny://val.parquet --max-samples 50

Greedy accuracy is the mean greedy reward (the share of correct answers for 0/1 rewards); with
``--n`` > 1 it also samples n responses per prompt at ``--temperature`` and reports mean@n and
best@n (pass@n).

``--max-samples N`` scores N prompts drawn as ``data.val_max_samples=N`` draws them
(``RLHFDataset``'s draw without replacement, ``numpy.random.default_rng(--seed)``; the default
seed 1 is ``data.seed``'s), so it scores the prompts a run with that setting validates on; all
prompts when the files hold N or fewer. Arguments are checked before the model loads: a bad
one is an error naming the flag and the fix, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from engine.config import DataConfig, ModelConfig
from engine.data.dataset import (
    MAP_TARGETS,
    DatasetError,
    RLHFDataset,
    collate_prompts,
    data_format,
    iter_raw_rows,
)
from engine.roles.model_loading import load_tokenizer, resolve_device, resolve_path
from engine.rollout.hf import eos_token_ids
from engine.rollout.sampling import sample_sequences
from engine.trainer.metrics import compute_validation_metrics

EXAMPLE_KEY_MAP = '{"prompt": "question", "ground_truth": "answer"}'


class EvalError(ValueError):
    """An argument ``engine.eval`` cannot use; the message names the flag and the fix."""


def check_arguments(
    *,
    n: int,
    temperature: float,
    max_prompt_length: int,
    max_response_length: int,
    batch_size: int,
    max_samples: int | None,
    device: str,
) -> None:
    """Raise EvalError for a numeric argument out of range or a device that is not there."""
    at_least_one = {
        "--n": (n, "samples per prompt; 1 scores greedy answers only"),
        "--batch-size": (batch_size, "prompts per generation batch; lower it to save memory"),
        "--max-prompt-length": (max_prompt_length, "longer prompts keep their last tokens"),
        "--max-response-length": (max_response_length, "tokens generated per response"),
        "--max-samples": (max_samples, "prompts scored; leave it out to score them all"),
    }
    for flag, (value, meaning) in at_least_one.items():
        if value is not None and value < 1:
            raise EvalError(f"{flag} must be at least 1, got {value} ({meaning})")
    if n > 1 and not temperature > 0:
        raise EvalError(
            f"--temperature must be above 0 with --n {n}, got {temperature}: at 0 or below "
            "sampling is greedy and the n samples are one answer n times; use e.g. "
            "--temperature 1.0, or --n 1"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise EvalError("--device cuda: no CUDA GPU is visible; use --device cpu (or auto)")


def parse_key_map(text: str) -> dict[str, str]:
    """Return ``--key-map``'s JSON object (target -> column); EvalError when it is not one."""
    try:
        key_map = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvalError(
            f"--key-map is not JSON ({exc.msg}): write an object target -> column, e.g. "
            f"--key-map '{EXAMPLE_KEY_MAP}'"
        ) from None
    if not isinstance(key_map, dict) or not all(isinstance(v, str) for v in key_map.values()):
        raise EvalError(
            f"--key-map must be a JSON object of column names, got {text!r}; e.g. "
            f"--key-map '{EXAMPLE_KEY_MAP}'"
        )
    unknown = sorted(set(key_map) - set(MAP_TARGETS))
    if unknown:
        raise EvalError(
            f"--key-map has unknown target(s) {unknown}; the targets are {list(MAP_TARGETS)}, "
            f"each mapped to a column of the data, e.g. --key-map '{EXAMPLE_KEY_MAP}'"
        )
    return key_map


def check_data_files(data_files: list[str], key_map: dict[str, str]) -> list[str]:
    """Return the local paths of ``--data``; EvalError for a file that is missing, of an
    unknown type, or whose first row lacks a column the prompt or ``--key-map`` needs."""
    paths = []
    for name in data_files:
        try:
            path = resolve_path(name) or name
        except ValueError as exc:  # an unknown tiny:// asset
            raise EvalError(f"--data {name}: {exc}") from None
        if not Path(path).is_file():
            raise EvalError(
                f"--data {name}: no such file; pass existing parquet, JSON Lines or CSV files "
                "(or tiny://val.parquet)"
            )
        try:
            data_format(path)
            location, row = next(iter_raw_rows(path), ("", None))
        except DatasetError as exc:  # the message names the file
            raise EvalError(f"--data: {exc}") from None
        columns = {"prompt": "prompt", **key_map}
        for target, column in columns.items():
            if row is not None and column not in row:
                raise EvalError(
                    f"--data: {location} has no column '{column}' for the {target} "
                    f"(columns: {list(row)}); name the column with "
                    f'--key-map \'{{"{target}": "<column>"}}\''
                )
        paths.append(path)
    return paths


def load_prompts(
    paths: list[str],
    tokenizer: Any,
    *,
    max_prompt_length: int,
    data_key_map: dict[str, str],
    max_samples: int | None,
    seed: int,
) -> RLHFDataset:
    """Return the prompts to score: every row, or ``max_samples`` of them drawn as a run's
    ``data.val_max_samples`` draws them (``data.shuffle`` on, ``data.seed=seed``)."""
    data_config = DataConfig(
        max_prompt_length=max_prompt_length,
        truncation="left",
        filter_overlong_prompts=False,
        data_key_map=data_key_map,
        prompt_key="prompt",
        reward_fn_key="data_source",
        shuffle=True,
        seed=seed,
    )
    return RLHFDataset(paths, tokenizer, data_config, max_samples=max_samples or -1)


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
    max_samples: int | None = None,
) -> dict[str, Any]:
    """Return greedy accuracy and, for ``n`` > 1, mean@n and best@n per data source.

    ``max_samples`` scores that many prompts of the files (see the module docstring); ``seed``
    seeds that draw and the sampled pass. EvalError for an argument it cannot use.
    """
    from engine.rewards import RewardManager

    check_arguments(
        n=n,
        temperature=temperature,
        max_prompt_length=max_prompt_length,
        max_response_length=max_response_length,
        batch_size=batch_size,
        max_samples=max_samples,
        device=device,
    )
    folder = model_folder(model)
    paths = check_data_files(list(data_files), data_key_map or {})
    torch_device = resolve_device(device)
    tokenizer = load_tokenizer(ModelConfig(path=folder))
    dataset = load_prompts(
        paths,
        tokenizer,
        max_prompt_length=max_prompt_length,
        data_key_map=data_key_map or {},
        max_samples=max_samples,
        seed=seed,
    )
    policy = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    # transformers wraps PreTrainedModel.to with functools.wraps, whose typeshed stub does not
    # bind self, so mypy reads the device as the model.
    policy.to(torch_device)  # type: ignore[arg-type]
    policy.eval()
    reward_fn = RewardManager(tokenizer)
    eos = eos_token_ids(tokenizer, policy)
    generator = torch.Generator().manual_seed(seed)
    results: dict[str, Any] = {"model": folder, "num_prompts": len(dataset)}
    passes = [("greedy", 1, False)] + ([("sampled", n, True)] if n > 1 else [])
    for name, repeat, do_sample in passes:
        sources: list[str] = []
        uids: list[str] = []
        scores: list[float] = []
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
            scored = reward_fn(prompts, return_dict=True)
            assert isinstance(scored, dict)  # return_dict=True
            reward = scored["reward_tensor"].sum(-1)
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
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature when --n > 1"
    )
    parser.add_argument("--max-prompt-length", type=int, default=512)
    parser.add_argument("--max-response-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per generation batch")
    parser.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help="score N prompts, drawn as data.val_max_samples=N draws them (default: all)",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the --max-samples draw and of sampling"
    )
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
            data_key_map=parse_key_map(args.key_map),
            device=args.device,
            seed=args.seed,
            max_samples=args.max_samples,
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
