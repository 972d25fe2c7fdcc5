"""Tiny tool tasks described as data: the questions, the tool, and how a call on a question reads.

The recipe: the embedded tiny model cannot do the arithmetic, a tool can, and a policy that learns
from scratch never writes a 60-character ``<tool_call>`` block by chance, so a short supervised
pass on transcripts (``TOOL_FRACTION`` of them calling the tool and copying its answer, the rest
answering directly) seeds both behaviours for RL to choose between. A :class:`ToolTask` is that recipe with the parts that differ between
tasks named: the operator of the ``a<op>b=`` questions, the tool's YAML, the name and argument of
the hermes call, how the question becomes the argument (``123*456`` or ``print(123*456)``) and
how the tool's answer reads. The calculator task (``engine.tools.tiny_task``) and the interpreter
task (``engine.tools.tiny_interpreter_task``) are two such tasks.

:func:`ensure_task` builds a task once into ``<data_dir>/tiny_<name>/<hash>/`` and reuses it; the
hash covers this file, the task's fields and the embedded tiny recipe's hash, not the file that
declares the task, so editing its prose rebuilds nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import operator
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import transformers
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from engine import env
from engine.tiny.cache import MANIFEST_NAME, build_once
from engine.tiny.recipe import ensure_tiny_assets, recipe_hash
from engine.tiny.task import split_of
from engine.tiny.tokenizer import build_tokenizer

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

_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def tool_tokenizer() -> PreTrainedTokenizerBase:
    """Return the tiny tokenizer with a chat template that renders ``tool`` messages.

    The tiny chat template has no ``tool`` role (its vocabulary has no token for one), so a tool
    answer renders as a user turn wrapped in ``<tool_response>``, as Qwen2.5's template does.
    """
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


@dataclass(frozen=True)
class ToolTask:
    """One tiny tool task: ``a<op>b=`` questions a tool answers (see the module doc)."""

    name: str  # folder ``tiny_<name>`` and URIs ``tiny://<name>/...``
    data_source: str  # the rows' data_source: the default reward dispatch scores it
    op: str  # the question's operator, one of _OPERATORS
    tools_yaml: str  # verl's tools YAML, with one tool
    tool_name: str  # the function name the call names
    argument: str  # the argument the call passes
    argument_template: str  # the argument's text, ``{expr}`` being ``a<op>b``
    reply_template: str  # the tool's answer, ``{answer}`` being the result
    max_response_length: int
    max_tool_response_length: int

    def __post_init__(self) -> None:
        if self.op not in _OPERATORS:
            raise ValueError(f"ToolTask.op must be one of {sorted(_OPERATORS)}, not {self.op!r}")

    def call_text(self, question: str) -> str:
        """Return the hermes call of the tool on ``question`` (``"123*456="``)."""
        argument = self.argument_template.format(expr=question.rstrip("="))
        call = {"name": self.tool_name, "arguments": {self.argument: argument}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    def make_rows(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        """Return ``n`` verl rows of ``a<op>b=`` with three-digit operands.

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
            question = f"{a}{self.op}{b}="
            rows.append(
                {
                    "data_source": self.data_source,
                    "prompt": [{"role": "user", "content": question}],
                    "ability": "arithmetic",
                    "reward_model": {
                        "style": "rule",
                        "ground_truth": str(_OPERATORS[self.op](a, b)),
                    },
                    "extra_info": {"split": split, "index": len(rows), "question": question},
                }
            )
        return rows

    def transcript(
        self, tokenizer: PreTrainedTokenizerBase, row: dict[str, Any], tool: bool
    ) -> tuple[list[int], list[int]]:
        """Return the ids of one seeding transcript and its labels (-100 off assistant tokens)."""
        question = row["prompt"][0]["content"]
        answer = row["reward_model"]["ground_truth"]
        turns: list[tuple[str, bool]] = [(f"<bos><|user|>{question}<|assistant|>", False)]
        if tool:
            reply = self.reply_template.format(answer=answer)
            turns += [(self.call_text(question) + "<eos>", True)]
            turns += [(f"<|user|><tool_response>{reply}</tool_response><|assistant|>", False)]
        turns += [(answer + "<eos>", True)]
        ids: list[int] = []
        labels: list[int] = []
        for text, learned in turns:
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            labels += piece if learned else [-100] * len(piece)
        return ids, labels

    def recipe_key(self) -> str:
        """Return the hash of what a build depends on (see the module doc)."""
        fields = json.dumps(dataclasses.asdict(self), sort_keys=True)
        key = Path(__file__).read_bytes() + fields.encode() + recipe_hash().encode()
        return hashlib.sha256(key).hexdigest()

    def overrides(self, out_dir: Path) -> list[str]:
        """Return the ``main_ppo`` overrides that train on the task built in ``out_dir``."""
        mt = "actor_rollout_ref.rollout.multi_turn"
        return [
            f"data.train_files={out_dir / 'data' / 'train.parquet'}",
            f"data.val_files={out_dir / 'data' / 'val.parquet'}",
            "data.max_prompt_length=16",
            f"data.max_response_length={self.max_response_length}",
            f"actor_rollout_ref.model.path={out_dir / 'model'}",
            f"{mt}.enable=true",
            f"{mt}.tool_config_path={out_dir / 'tools.yaml'}",
            f"{mt}.max_assistant_turns=2",
            f"{mt}.max_tool_response_length={self.max_tool_response_length}",
            f"trainer.experiment_name=grpo_tiny_{self.name}",
        ]


def seed_tool_use(
    task: ToolTask,
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
            task.transcript(tokenizer, rng.choice(rows), rng.random() < TOOL_FRACTION)
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
    task: ToolTask,
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    seed: int = 0,
) -> dict[str, float]:
    """Return how the seeded model starts on ``rows``, which is what RL has to work with.

    ``sampled_call_rate``: the share of first turns sampled at temperature 1 that open a
    ``<tool_call>``; ``sampled_exact_calls``: the share of those calls whose argument is the
    question's exactly (a call on other operands answers another question, so it earns nothing);
    ``greedy_exact_calls``: the share of greedy calls, forced by starting the turn with
    ``<tool_call>``, whose argument is the question's exactly.
    """
    questions = [row["prompt"][0]["content"] for row in rows]
    prompts = [f"<bos><|user|>{q}<|assistant|>" for q in questions]
    longest = len(tokenizer(task.call_text(max(questions, key=len)))["input_ids"]) + 2

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
        return task.call_text(question) in text

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


def build_task(
    task: ToolTask,
    out_dir: Path,
    *,
    train_rows: int = 1000,
    val_rows: int = 100,
    steps: int = SFT_STEPS,
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
    train, val = task.make_rows(train_rows, 0, "train"), task.make_rows(val_rows, 0, "val")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible sums on one machine, as the tiny recipe's build
    try:
        losses = seed_tool_use(task, model, tokenizer, train, steps=steps)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out_dir / "model", safe_serialization=True)
    tokenizer.save_pretrained(out_dir / "model")
    (out_dir / "data").mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", val)):
        pq.write_table(pa.Table.from_pylist(rows), out_dir / "data" / f"{name}.parquet")
    (out_dir / "tools.yaml").write_text(task.tools_yaml)
    (out_dir / "overrides.txt").write_text(" ".join(task.overrides(out_dir)) + "\n")
    manifest = {
        "task": task.name,
        "sft_steps": steps,
        "sft_loss_first": losses[0],
        "sft_loss_last": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "tool_use": tool_use_rates(task, model, tokenizer, val),
        "seconds": round(time.perf_counter() - started, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def ensure_task(task: ToolTask, data_dir: Path | None = None) -> Path:
    """Return ``<data_dir>/tiny_<name>/<hash>/``, building the task there if needed."""
    base = Path(data_dir if data_dir is not None else env.data_dir()) / f"tiny_{task.name}"
    key = task.recipe_key()[:16]

    def build(staging: Path) -> None:
        build_task(task, staging)
        # The overrides name the folder the build is renamed to, not the staging folder.
        (staging / "overrides.txt").write_text(" ".join(task.overrides(base / key)) + "\n")

    return build_once(base, key, build)


def build_from_command_line(task: ToolTask, description: str, argv: list[str] | None = None) -> int:
    """Build ``task`` into the folder named on the command line; print its manifest and overrides."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=SFT_STEPS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(build_task(task, args.out_dir, steps=args.steps)))
    print(" ".join(task.overrides(args.out_dir)))
    return 0
