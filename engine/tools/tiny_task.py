"""A tiny task where a tool helps: three-digit addition with the built-in calculator.

The embedded tiny model adds two-digit numbers after its warm start and cannot add three-digit ones;
the calculator can. A policy that learns from scratch never writes a 60-character ``<tool_call>``
block by chance, so the behaviour is seeded, and this is said plainly: a short supervised pass (800
steps, on one torch thread) from the embedded tiny model on transcripts, ``TOOL_FRACTION`` of them
calling the tool and copying its answer, the rest answering directly. RL then has both behaviours to
choose from and is rewarded for the right answer (``engine.rewards.tiny_calculator``: the
calculator's answer when the policy called it), which the tool makes reachable::

    python -m engine.tools.tiny_task /tmp/calc      # builds model/, data/, tools.yaml
    python -m engine.main_ppo --config-name grpo_tiny $(cat /tmp/calc/overrides.txt)

The tiny chat template has no ``tool`` role (its vocabulary has no token for one), so the task's
tokenizer renders a tool answer as a user turn wrapped in ``<tool_response>``, as Qwen2.5's
template does; everything else is the embedded template.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import transformers
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from engine import env
from engine.rewards import tiny_calculator
from engine.tiny.recipe import MANIFEST_NAME, ensure_tiny_assets, recipe_hash
from engine.tiny.task import split_of
from engine.tiny.tokenizer import build_tokenizer

TOOL_NAME = "calc"
ARGUMENT = "expr"
OPERANDS = (100, 999)
TOOL_FRACTION = 0.3  # of the seeding transcripts that call the tool
SFT_STEPS = 800  # 400 seeded copying the operands into the call on one CPU and not on another
SFT_BATCH = 32
SFT_LR = 2e-3
TOOL_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('tiny chat template: unknown role ' + message['role']) }}"
    "{% endif %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|user|><tool_response>' + message['content'] + '</tool_response>' }}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
TOOLS_YAML = f"""tools:
  - class_name: calculator
    config: {{argument: {ARGUMENT}, timeout_s: 5}}
    tool_schema:
      type: function
      function:
        name: {TOOL_NAME}
        description: Evaluate an arithmetic expression exactly.
        parameters:
          type: object
          properties:
            {ARGUMENT}: {{type: string, description: "e.g. 123+456"}}
          required: [{ARGUMENT}]
"""


def tool_tokenizer() -> PreTrainedTokenizerBase:
    """Return the tiny tokenizer with a chat template that renders ``tool`` messages."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def tool_call_text(question: str) -> str:
    """Return the hermes call of the calculator on ``question`` (``"123+456="``)."""
    call = {"name": TOOL_NAME, "arguments": {ARGUMENT: question.rstrip("=")}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def make_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """Return ``n`` verl rows of ``a+b=`` with three-digit operands.

    A pair's split comes from a hash of it (``engine.tiny.task.split_of``), so train and
    validation never share a pair and follow the same distribution of digits.
    """
    rng = random.Random(f"{seed}-{split}")
    rows: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    while len(rows) < n:
        a, b = rng.randint(*OPERANDS), rng.randint(*OPERANDS)
        if (a, b) in seen or split_of(a, b) != split:
            continue
        seen.add((a, b))
        question = f"{a}+{b}="
        rows.append(
            {
                "data_source": tiny_calculator.DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": len(rows), "question": question},
            }
        )
    return rows


def _transcript(
    tokenizer: PreTrainedTokenizerBase, row: dict[str, Any], tool: bool
) -> tuple[list[int], list[int]]:
    """Return the ids of one seeding transcript and its labels (-100 off assistant tokens)."""
    question = row["prompt"][0]["content"]
    answer = row["reward_model"]["ground_truth"]
    turns: list[tuple[str, bool]] = [(f"<bos><|user|>{question}<|assistant|>", False)]
    if tool:
        turns += [(tool_call_text(question) + "<eos>", True)]
        turns += [(f"<|user|><tool_response>{answer}</tool_response><|assistant|>", False)]
    turns += [(answer + "<eos>", True)]
    ids: list[int] = []
    labels: list[int] = []
    for text, learned in turns:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if learned else [-100] * len(piece)
    return ids, labels


def seed_tool_use(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    steps: int = SFT_STEPS,
    seed: int = 0,
) -> list[float]:
    """Fine-tune on transcripts, ``TOOL_FRACTION`` of them tool calls; return the losses."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    losses = []
    model.train()
    for _ in range(steps):
        batch = [
            _transcript(tokenizer, rng.choice(rows), rng.random() < TOOL_FRACTION)
            for _ in range(SFT_BATCH)
        ]
        width = max(len(ids) for ids, _ in batch)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def tool_use_rates(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    seed: int = 0,
) -> dict[str, float]:
    """Return how the seeded model starts on ``rows``, which is what RL has to work with.

    ``sampled_call_rate``: the share of first turns sampled at temperature 1 that open a
    ``<tool_call>``; ``sampled_exact_calls``: the share of those calls whose expression is the
    question exactly (a call with another expression answers another sum, so it earns nothing);
    ``greedy_exact_calls``: the share of greedy calls, forced by starting the turn with
    ``<tool_call>``, whose expression is the question exactly.
    """
    questions = [row["prompt"][0]["content"] for row in rows]
    prompts = [f"<bos><|user|>{q}<|assistant|>" for q in questions]
    longest = len(tokenizer(tool_call_text(max(questions, key=len)))["input_ids"]) + 2

    def first_turns(texts: list[str], sample: bool) -> list[str]:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        # transformers' generate is typed with an explicit self under torch.no_grad, which mypy
        # binds twice.
        out = model.generate(  # type: ignore[misc]
            **enc,
            do_sample=sample,
            temperature=1.0 if sample else None,
            top_k=0 if sample else None,
            top_p=1.0 if sample else None,
            max_new_tokens=longest,
            pad_token_id=tokenizer.pad_token_id,
        )
        return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :])

    def exact(text: str, question: str) -> bool:
        return tool_call_text(question) in text

    torch.manual_seed(seed)
    sampled = first_turns(prompts, sample=True)
    calls = [(t, q) for t, q in zip(sampled, questions, strict=True) if "<tool_call>" in t]
    forced = first_turns([p + "<tool_call>" for p in prompts], sample=False)
    return {
        "sampled_call_rate": len(calls) / len(rows),
        "sampled_exact_calls": sum(exact(t, q) for t, q in calls) / max(1, len(calls)),
        "greedy_exact_calls": sum(
            exact("<tool_call>" + t, q) for t, q in zip(forced, questions, strict=True)
        )
        / len(rows),
    }


def build_calculator_task(
    out_dir: Path, *, train_rows: int = 1000, val_rows: int = 100, steps: int = SFT_STEPS
) -> dict[str, Any]:
    """Write ``model/``, ``data/{train,val}.parquet``, ``tools.yaml``, ``overrides.txt`` and
    ``manifest.json`` (the seeding's settings and losses, and :func:`tool_use_rates` on the
    validation rows); return the manifest."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    assets = ensure_tiny_assets()
    tokenizer = tool_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32)
    train, val = make_rows(train_rows, 0, "train"), make_rows(val_rows, 0, "val")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible sums on one machine, as the tiny recipe's build
    try:
        losses = seed_tool_use(model, tokenizer, train, steps=steps)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out_dir / "model", safe_serialization=True)
    tokenizer.save_pretrained(out_dir / "model")
    (out_dir / "data").mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", val)):
        pq.write_table(pa.Table.from_pylist(rows), out_dir / "data" / f"{name}.parquet")
    (out_dir / "tools.yaml").write_text(TOOLS_YAML)
    overrides = calculator_overrides(out_dir)
    (out_dir / "overrides.txt").write_text(" ".join(overrides) + "\n")
    model.eval()
    manifest = {
        "sft_steps": steps,
        "sft_loss_first": losses[0],
        "sft_loss_last": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "tool_use": tool_use_rates(model, tokenizer, val),
        "seconds": round(time.perf_counter() - started, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def ensure_calculator_task(data_dir: Path | None = None) -> Path:
    """Return ``<data_dir>/tiny_calculator/<hash>/``, building the task there if needed.

    The hash covers this file, the data source its rows carry (the scorer's) and the embedded
    tiny recipe's hash, so the task is rebuilt exactly when one of them changes.
    """
    source = tiny_calculator.DATA_SOURCE.encode()
    key = Path(__file__).read_bytes() + source + recipe_hash().encode()
    digest = hashlib.sha256(key).hexdigest()
    base = Path(data_dir if data_dir is not None else env.data_dir()) / "tiny_calculator"
    root = base / digest[:16]
    if not (root / "overrides.txt").is_file():
        base.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}-build-", dir=base))
        try:
            build_calculator_task(staging)
            (staging / "overrides.txt").write_text(" ".join(calculator_overrides(root)) + "\n")
            if not (root / "overrides.txt").is_file():  # another build may have finished first
                shutil.rmtree(root, ignore_errors=True)
                staging.rename(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return root


def calculator_overrides(out_dir: Path) -> list[str]:
    """Return the ``main_ppo`` overrides that train on the built task with the calculator."""
    mt = "actor_rollout_ref.rollout.multi_turn"
    return [
        f"data.train_files={out_dir / 'data' / 'train.parquet'}",
        f"data.val_files={out_dir / 'data' / 'val.parquet'}",
        "data.max_prompt_length=16",
        "data.max_response_length=128",
        f"actor_rollout_ref.model.path={out_dir / 'model'}",
        f"{mt}.enable=true",
        f"{mt}.tool_config_path={out_dir / 'tools.yaml'}",
        f"{mt}.max_assistant_turns=2",
        f"{mt}.max_tool_response_length=16",
        f"custom_reward_function.path={Path(tiny_calculator.__file__).resolve()}",
        "custom_reward_function.name=compute_score",
        "trainer.experiment_name=grpo_tiny_calculator",
    ]


def main(argv: list[str] | None = None) -> int:
    """Build the task into the folder given on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=SFT_STEPS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(build_calculator_task(args.out_dir, steps=args.steps)))
    print(" ".join(calculator_overrides(args.out_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
