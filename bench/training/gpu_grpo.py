#!/usr/bin/env python3
"""GRPO on a realistic model on one GPU: the engine against TRL's GRPOTrainer, same settings.

``scripts/gpu_check.sh`` runs the phases in order, each in its own process under its own time
limit, so a hang or a crash costs one phase:

    python -m bench.training.gpu_grpo prepare --work DIR --size 0.5b  # model, tokenizer, prompts
    python -m bench.training.gpu_grpo engine  --work DIR              # the engine's trainer
    python -m bench.training.gpu_grpo trl     --work DIR              # TRL's GRPOTrainer
    python -m bench.training.gpu_grpo summary --work DIR --out FILE   # one JSON and a table

(from the repository root; the engine also loads this file by its path as the reward file.)

The model is a randomly initialised Qwen2 with Qwen2-0.5B's shape (or 1.5B's, or a tiny one for
the CPU rehearsal) built from a config in code and saved in bf16, as released checkpoints are:
nothing is downloaded. Its tokenizer is the embedded character-level one padded to the model's
vocabulary with filler tokens, so every sampled id decodes. A random model never ends a
response, so every step samples the full ``--max-new-tokens`` for every row in both arms: the
same work, which is what a speed comparison needs. The reward is the share of digits in the
response text, which varies from sample to sample, so the advantages (and the update) are real.

Settings (both arms): 64 prompts x 8 samples, up to 256 new tokens, temperature 1, one optimizer
step per batch (AdamW, lr 1e-6, clip 1.0), k3 KL to the reference (coefficient 0.04), token-mean
loss, no gradient checkpointing. Precision: the engine keeps fp32 master weights and computes
in bf16 under FSDP2 on a one-rank NCCL group, sampling from a bf16 copy (verl's recipe); TRL
loads the bf16 checkpoint as its defaults do and trains the bf16 weights directly (no fp32
copy, so less work per step than the engine's recipe).

Every arm writes its JSON after each step, so a phase killed at its time limit still leaves the
steps it finished. Step time is the wall time between the ends of consecutive steps; medians
skip the first step (CUDA and allocator warm-up). MFU counts the model FLOPs of the tokens a
phase processes (6 N per token trained, 2 N per token scored, plus attention, PaLM's formula)
against the GPU's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.training.overrides import training_only

SKIP = 1  # warm-up steps left out of the medians
KL_COEF = 0.04
LEARNING_RATE = 1e-6
# Dense bf16 tensor-core peak by the vendor's datasheet (H100 / H200 SXM).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12}


@dataclass(frozen=True)
class Size:
    """A model shape and the batch it trains on."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    prompts: int
    samples: int
    max_new_tokens: int
    micro_batch: int  # sequences per forward/backward of the update
    log_prob_micro_batch: int


SIZES = {
    # Qwen2-0.5B's and Qwen2-1.5B's shapes (hidden, layers, heads, kv heads, MLP, vocabulary).
    "0.5b": Size(896, 24, 14, 2, 4864, 151936, 64, 8, 256, 32, 64),
    "1.5b": Size(1536, 28, 12, 2, 8960, 151936, 64, 8, 256, 16, 32),
    # The CPU rehearsal: the same phases in seconds.
    "tiny": Size(64, 2, 4, 2, 128, 512, 4, 4, 12, 8, 16),
}


def log(*parts: Any) -> None:
    print("[gpu_grpo]", *parts, file=sys.stderr, flush=True)


def digit_share(text: str) -> float:
    """Return the share of characters of ``text`` that are digits (0 for an empty text)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **_: Any
) -> float:
    """The engine's ``custom_reward_function``: :func:`digit_share` of the response."""
    return digit_share(solution_str)


# -- prepare ---------------------------------------------------------------------------------
def build_tokenizer(vocab_size: int) -> Any:
    """Return the embedded character tokenizer padded with filler tokens to ``vocab_size``."""
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    from engine.tiny import tokenizer as tiny

    vocab = tiny.build_vocab()  # special and role tokens included
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the base vocabulary")
    vocab.update({f"<x{i}>": len(vocab) + i for i in range(vocab_size - len(vocab))})
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        pad_token=tiny.PAD_TOKEN,
        bos_token=tiny.BOS_TOKEN,
        eos_token=tiny.EOS_TOKEN,
        unk_token=tiny.UNK_TOKEN,
        extra_special_tokens=list(tiny.ROLE_TOKENS.values()),
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=tiny.CHAT_TEMPLATE,
        model_max_length=4096,
    )


def question(index: int) -> str:
    """Return a prompt of about a hundred characters (a GSM8K-like length in this tokenizer)."""
    a, b = (index * 37) % 100, (index * 53 + 11) % 100
    return (
        f"Problem {index}: a shop sells {a} apples in the morning and {b} apples in the "
        "afternoon. How many apples does it sell in the day? Answer with the number only."
    )


def prepare(args: argparse.Namespace) -> None:
    """Write the random model (bf16), its tokenizer and the prompts under ``--work``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from engine.tiny.recipe import plain_sampling

    size = SIZES[args.size]
    work = Path(args.work)
    model_dir = work / "model"
    tokenizer = build_tokenizer(size.vocab_size)
    if len(tokenizer) != size.vocab_size:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, expected {size.vocab_size}")
    config = Qwen2Config(
        vocab_size=size.vocab_size,
        hidden_size=size.hidden_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        intermediate_size=size.intermediate_size,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    with torch.device(device):  # initialising 0.5B parameters on a CPU takes a while
        model = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16)
    model.generation_config = plain_sampling(tokenizer)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    rows = [
        {
            "data_source": "digits",
            "prompt": [{"role": "user", "content": question(i)}],
            "ability": "bench",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(size.prompts * args.steps)
    ]
    pq.write_table(pa.Table.from_pylist(rows), work / "train.parquet")
    prompt_tokens = [
        len(tokenizer(text, add_special_tokens=False)["input_ids"])
        for text in tokenizer.apply_chat_template(
            [r["prompt"] for r in rows[: size.prompts]], add_generation_prompt=True, tokenize=False
        )
    ]
    write_json(
        work / "prepare.json",
        {
            "size": args.size,
            "shape": asdict(size),
            "parameters": parameters,
            "prompt_tokens_mean": statistics.mean(prompt_tokens),
            "seconds": round(time.perf_counter() - start, 1),
            "device": device,
        },
    )
    log(
        f"{parameters / 1e6:.1f}M parameters, prompts of {statistics.mean(prompt_tokens):.0f} "
        f"tokens, written to {work} in {time.perf_counter() - start:.1f} s"
    )


# -- shared measurement --------------------------------------------------------------------------
def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically (a killed phase never leaves half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def flops_per_token(shape: dict[str, Any], context: float) -> float:
    """Return the forward FLOPs per token: 2 x the matrix parameters plus attention (PaLM, B)."""
    h, layers = shape["hidden_size"], shape["num_layers"]
    head_dim = h // shape["num_heads"]
    kv = shape["num_kv_heads"] * head_dim
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * shape["intermediate_size"]  # q, k, v, o, MLP
    matrix = layers * per_layer + h * shape["vocab_size"]  # the LM head (tied: counted once)
    attention = 2 * layers * h * context  # QK^T and AV over a causal context of this mean length
    return 2 * matrix + attention


def gpu_facts() -> dict[str, Any]:
    """Return the device's name, peak dense bf16 FLOP/s (datasheet) and the library versions."""
    import torch
    import transformers

    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        facts["gpu"] = name
        facts["peak_bf16_flops"] = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    return facts


def peak_gpu_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def median_after_warmup(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return round(statistics.median(values[SKIP:] or values), 4)


def mfu(flops: float, seconds: float | None, peak: float | None) -> float | None:
    if not seconds or not peak:
        return None
    return round(flops / seconds / peak, 4)


def token_counts(prompt_tokens: float, response_tokens: float, rows: int) -> dict[str, float]:
    return {
        "prompt": prompt_tokens * rows,
        "response": response_tokens * rows,
        "total": (prompt_tokens + response_tokens) * rows,
    }


# -- the engine ----------------------------------------------------------------------------------
def engine_overrides(args: argparse.Namespace, size: Size, work: Path, device: str) -> list[str]:
    """Return the verl overrides of the engine arm (the settings in the module docstring)."""
    return [
        f"data.train_files={work / 'train.parquet'}",
        "data.val_files=null",
        "data.shuffle=False",
        f"data.train_batch_size={size.prompts}",
        "data.max_prompt_length=192",
        f"data.max_response_length={size.max_new_tokens}",
        f"actor_rollout_ref.model.path={work / 'model'}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={size.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={size.micro_batch}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.kl_loss_coef={KL_COEF}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.grad_clip=1.0",
        f"actor_rollout_ref.actor.optim.lr={LEARNING_RATE}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={size.log_prob_micro_batch}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={size.log_prob_micro_batch}",
        f"actor_rollout_ref.rollout.n={size.samples}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.dtype={'bfloat16' if device == 'cuda' else 'float32'}",
        # The rollout copy (1 GB at 0.5B) stays on the GPU between steps: there is room for it.
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=True",
        f"custom_reward_function.path={Path(__file__).resolve()}",
        "custom_reward_function.name=compute_score",
        f"trainer.device={device}",
        *training_only(args.steps, args.seed, work / "engine-out"),
    ]


def run_engine(args: argparse.Namespace) -> None:
    """Train with the engine's single-process trainer; write ``engine.json`` after every step."""
    import torch

    from engine.config import load_config
    from engine.trainer import Recorder
    from engine.trainer.ppo_trainer import PPOTrainer

    work = Path(args.work)
    prep = json.loads((work / "prepare.json").read_text())
    size = SIZES[prep["size"]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = work / "engine.json"
    facts = gpu_facts()
    started = time.perf_counter()
    result: dict[str, Any] = {"arm": "engine", "status": "starting", "steps": [], **facts}

    class StepClock(Recorder):
        """Time each step end to end; stop (cancel) when the phase's budget is spent."""

        def __init__(self) -> None:
            self.previous = time.perf_counter()

        def on_start(self, **_: Any) -> None:
            result["setup_s"] = round(time.perf_counter() - started, 2)
            self.previous = time.perf_counter()

        def on_step(self, step: int, metrics: dict[str, float]) -> None:
            now = time.perf_counter()
            row = {
                "step": step,
                "wall_s": round(now - self.previous, 4),
                "response_length": metrics.get("response_length/mean"),
                "prompt_length": metrics.get("prompt_length/mean"),
                "reward": metrics.get("critic/score/mean"),
                "kl_loss": metrics.get("actor/kl_loss"),
                "pg_loss": metrics.get("actor/pg_loss"),
                "grad_norm": metrics.get("actor/grad_norm"),
                **{k: round(v, 4) for k, v in metrics.items() if k.startswith("timing_s/")},
            }
            result["steps"].append(row)
            result["peak_gpu_gib"] = peak_gpu_gib()
            write_json(out, result)
            log(f"engine step {step}: {row['wall_s']:.2f} s, reward {row['reward']:.4f}")
            self.previous = now

        def should_stop(self) -> bool:
            return time.perf_counter() - started > args.budget_s

    config = load_config("grpo_tiny.yaml", overrides=engine_overrides(args, size, work, device))
    write_json(out, result)
    trainer = PPOTrainer(config, StepClock())
    result["status"] = trainer.fit()
    result["total_s"] = round(time.perf_counter() - started, 1)
    result.update(summarise_engine(result, prep, facts))
    write_json(out, result)


def summary_figures(
    prep: dict[str, Any],
    facts: dict,
    *,
    prompt: float,
    response: float,
    step_s: float | None,
    update_s: float | None,
    breakdown: dict[str, float | None],
) -> dict[str, Any]:
    """Return an arm's medians, token throughput and MFU (update and whole step)."""
    size = SIZES[prep["size"]]
    tokens = token_counts(prompt, response, size.prompts * size.samples)
    per_token = flops_per_token(prep["shape"], prompt + response / 2)
    peak = facts.get("peak_bf16_flops")
    return {
        "median_s_per_step": step_s,
        "tokens_per_step": tokens,
        "tokens_per_s": round(tokens["total"] / step_s, 1) if step_s else None,
        "breakdown_median_s": breakdown,
        "mfu_update": mfu(3 * per_token * tokens["total"], update_s, peak),
        "mfu_step_train_flops": mfu(3 * per_token * tokens["total"], step_s, peak),
    }


def summarise_engine(result: dict[str, Any], prep: dict[str, Any], facts: dict) -> dict[str, Any]:
    """Return the medians, throughput and MFU of an engine run's steps."""
    steps = result["steps"]
    if not steps:
        return {}
    prompt = statistics.mean(s["prompt_length"] or prep["prompt_tokens_mean"] for s in steps)
    response = statistics.mean(s["response_length"] for s in steps)
    # A run stopped at its time budget is a cancelled run, and the trainer saves a checkpoint
    # on cancel (7 s at 0.5B): that is no part of a training step, nor of TRL's (which saves
    # nothing here), so it comes off the step that paid it.
    step_s = median_after_warmup(
        [s["wall_s"] - s.get("timing_s/save_checkpoint", 0.0) for s in steps]
    )
    breakdown = {
        key: median_after_warmup([s.get(f"timing_s/{key}") for s in steps])
        for key in ("gen", "update_weights", "reward", "old_log_prob", "ref", "adv", "update_actor")
    }
    figures = summary_figures(
        prep,
        facts,
        prompt=prompt,
        response=response,
        step_s=step_s,
        update_s=breakdown["update_actor"],
        breakdown=breakdown,
    )
    tokens = figures["tokens_per_step"]["total"]
    per_token = flops_per_token(prep["shape"], prompt + response / 2)
    figures["mfu_ref"] = mfu(per_token * tokens, breakdown["ref"], facts.get("peak_bf16_flops"))
    return figures


# -- TRL -----------------------------------------------------------------------------------------
def run_trl(args: argparse.Namespace) -> None:
    """Train with TRL's GRPOTrainer at the engine arm's settings; write ``trl.json`` per step."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.training.trl_profile import capture_trl_profile

    work = Path(args.work)
    prep = json.loads((work / "prepare.json").read_text())
    size = SIZES[prep["size"]]
    cuda = torch.cuda.is_available()
    out = work / "trl.json"
    facts = {**gpu_facts(), "trl": trl.__version__}
    started = time.perf_counter()
    result: dict[str, Any] = {"arm": "trl", "status": "starting", "steps": [], **facts}
    write_json(out, result)

    profile = capture_trl_profile()

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.previous = time.perf_counter()

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            result["setup_s"] = round(time.perf_counter() - started, 2)
            self.previous = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, control: Any, **__: Any) -> None:
            now = time.perf_counter()
            row: dict[str, Any] = {
                "step": state.global_step,
                "wall_s": round(now - self.previous, 4),
            }
            row.update({f"profile/{k}": round(v, 4) for k, v in profile.items()})
            profile.clear()
            result["steps"].append(row)
            result["peak_gpu_gib"] = peak_gpu_gib()
            write_json(out, result)
            log(f"trl step {state.global_step}: {row['wall_s']:.2f} s")
            self.previous = now
            if time.perf_counter() - started > args.budget_s:
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(work / "model")
    count = size.prompts * args.steps
    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": question(i)}] for i in range(count)]}
    )

    def reward(completions: list, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [digit_share(t) for t in texts]

    rows = size.prompts * size.samples
    micro = size.micro_batch
    config = GRPOConfig(
        output_dir=str(work / "trl-out"),
        per_device_train_batch_size=micro,  # completions per forward/backward
        gradient_accumulation_steps=rows // micro,  # one optimizer step per batch of rows
        num_generations=size.samples,
        max_completion_length=size.max_new_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=KL_COEF,
        use_bias_correction_kl=False,
        loss_type="dapo",  # token-mean over the batch
        epsilon=0.2,
        scale_rewards="group",
        num_iterations=1,
        max_steps=args.steps,
        logging_steps=1,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
        data_seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=str(work / "model"),
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    result["model_dtype"] = str(next(trainer.model.parameters()).dtype)
    trainer.train()
    result["status"] = "succeeded" if len(result["steps"]) >= args.steps else "stopped at budget"
    logs = [h for h in trainer.state.log_history if "reward" in h]
    for row, entry in zip(result["steps"], logs, strict=False):
        row["response_length"] = entry.get("completions/mean_length")
        row["reward"] = entry.get("reward")
        row["kl"] = entry.get("kl")
        row["step_time"] = entry.get("step_time")
    result["total_s"] = round(time.perf_counter() - started, 1)
    result.update(summarise_trl(result, prep, facts))
    write_json(out, result)


def summarise_trl(result: dict[str, Any], prep: dict[str, Any], facts: dict) -> dict[str, Any]:
    """Return the medians, throughput and MFU of a TRL run's steps."""
    steps = result["steps"]
    if not steps:
        return {}
    size = SIZES[prep["size"]]
    response = statistics.mean(s.get("response_length") or size.max_new_tokens for s in steps)
    step_s = median_after_warmup([s["wall_s"] for s in steps])

    def profiled(suffix: str) -> float | None:
        return median_after_warmup(
            [
                sum(v for k, v in s.items() if k.startswith("profile/") and k.endswith(suffix))
                for s in steps
            ]
        )

    prepare_s = profiled("_prepare_inputs")
    update_s = round(step_s - prepare_s, 4) if step_s and prepare_s else None
    breakdown = {
        "generate": profiled("transformers.generate"),
        "prepare_inputs": prepare_s,  # generation, rewards, old/ref log-probs
        "update": update_s,
    }
    return summary_figures(
        prep,
        facts,
        prompt=prep["prompt_tokens_mean"],
        response=response,
        step_s=step_s,
        update_s=update_s,
        breakdown=breakdown,
    )


# -- summary -------------------------------------------------------------------------------------
def summary(args: argparse.Namespace) -> int:
    """Merge every phase's JSON into ``--out`` and print a table; exit 1 if an arm is missing."""
    work = Path(args.work)

    def read(name: str) -> dict[str, Any] | None:
        path = work / name
        return json.loads(path.read_text()) if path.exists() else None

    prep, engine, trl_arm = read("prepare.json"), read("engine.json"), read("trl.json")
    merged: dict[str, Any] = {"prepare": prep, "engine": engine, "trl": trl_arm}
    for arm, summarise in ((engine, summarise_engine), (trl_arm, summarise_trl)):
        if arm and prep and "median_s_per_step" not in arm and arm.get("steps"):
            arm.update(summarise(arm, prep, arm))  # a phase killed at its limit: its steps so far
            arm["status"] = f"{arm.get('status')} (killed at the phase limit)"
    ratio = None
    if engine and trl_arm and engine.get("median_s_per_step") and trl_arm.get("median_s_per_step"):
        ratio = round(trl_arm["median_s_per_step"] / engine["median_s_per_step"], 3)
    merged["trl_over_engine_s_per_step"] = ratio
    write_json(Path(args.out), merged)
    print("\n| arm | status | steps | s/step (median) | tokens/s | update MFU | peak GPU GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, arm in (("engine", engine), ("trl", trl_arm)):
        if arm is None:
            print(f"| {name} | did not start | | | | | |")
            continue
        print(
            f"| {name} | {arm.get('status')} | {len(arm.get('steps', []))} | "
            f"{arm.get('median_s_per_step')} | {arm.get('tokens_per_s')} | "
            f"{arm.get('mfu_update')} | {arm.get('peak_gpu_gib')} |"
        )
    print(f"\nTRL / engine, s per step: {ratio}")
    for name, arm in (("engine", engine), ("trl", trl_arm)):
        if arm:
            print(f"{name} breakdown (median s): {arm.get('breakdown_median_s')}")
    return 0 if ratio is not None else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phase", choices=["prepare", "engine", "trl", "summary"])
    parser.add_argument("--work", required=True, help="folder shared by the phases")
    parser.add_argument("--size", default="0.5b", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=6, help="steps per arm at most")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=120.0,
        help="an arm stops after the step that ends past it",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", default=None, help="summary: the merged JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(key, "1")
    args = parse_args(argv)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.phase == "summary":
        if not args.out:
            raise SystemExit("summary needs --out FILE")
        return summary(args)
    {"prepare": prepare, "engine": run_engine, "trl": run_trl}[args.phase](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
