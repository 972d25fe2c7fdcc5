"""Tasks, models and noise probes shared by both arms of ``compare_trl.py``.

Two scales, each with the data both frameworks see, token for token:

* ``tiny``: the embedded tiny model (``engine.tiny``, about 1M parameters) and its addition task.
  GRPO prompts are the embedded train split, the held-out test set is its validation split (never
  trained on, by construction of the split). At most 8 new tokens.
* ``medium``: the same builders with the dimensions of the TRL baseline's medium model (hidden 512,
  8 layers, 8 heads, intermediate 1536: about 27M parameters) and the baseline's doubling-chain
  task (``13*2^4=`` -> ``26*2^3=52*2^2=104*2^1=208#208``), its data split (seed 1234: 200 test,
  200 SFT-validation, 1,097 train) and its supervised warm start (batch 16, AdamW 1e-3, 30 warm-up
  steps then linear decay to 0 at step 150, stop at the first check reaching 30%). At most 64 new
  tokens.

Prompts are one-turn chats rendered by the tokenizer's chat template: the engine reads verl
parquet rows with chat ``prompt`` messages, and TRL applies the same template to conversational
prompts, so both sample from identical prompt ids. The GRPO prompt order is fixed here and both
arms read it unshuffled, so step ``k`` of each arm trains on the same eight prompts.

This module imports only the standard library at the top: the engine loads it as a custom reward
file (``doubling_score``) in its own process.
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 1234
N_TEST = 200
N_VAL = 200
DBL_START = (1, 499)
DBL_EXP = (4, 6)
MEDIUM_SHAPE = {
    "hidden_size": 512,
    "num_layers": 8,
    "num_heads": 8,
    "num_kv_heads": 8,
    "intermediate_size": 1536,
    "max_positions": 256,
}
MEDIUM_SFT = {
    "batch_size": 16,
    "lr": 1e-3,
    "warmup": 30,
    "max_steps": 150,
    "eval_every": 25,
    "eval_start": 100,
    "target": 0.30,
}
_HASH_INT = re.compile(r"#(-?\d+)")
_FIRST_INT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Scale:
    """What differs between the scales: lengths, step count, learning rate and repeats."""

    name: str
    max_new_tokens: int
    steps: int
    lr: float
    repeats: int
    data_source: str


SCALES = {
    "tiny": Scale("tiny", 8, 60, 5e-5, 5, "tiny_arithmetic"),
    "medium": Scale("medium", 64, 30, 2e-5, 3, "double_chain"),
}


@dataclass(frozen=True)
class TaskData:
    """The prepared task: model folder, GRPO prompts (in step order), held-out test set."""

    model_dir: str
    train: list[tuple[str, str]]  # (question, answer) in the order both arms train on
    test: list[tuple[str, str]]
    train_parquet: str
    data_source: str


# -- rewards ------------------------------------------------------------------------------------
def addition_reward(text: str, answer: str) -> float:
    """Return 1.0 when the first integer in ``text`` equals ``answer``, else 0.0."""
    match = _FIRST_INT.search(text)
    return 1.0 if match and int(match.group(0)) == int(answer) else 0.0


def doubling_reward(text: str, answer: str) -> float:
    """Return 1.0 when the integer right after the first ``#`` equals ``answer``, else 0.0."""
    match = _HASH_INT.search(text)
    return 1.0 if match and int(match.group(1)) == int(answer) else 0.0


def doubling_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **_: Any
) -> float:
    """Score a doubling-chain response (the engine's ``custom_reward_function`` signature)."""
    return doubling_reward(solution_str, str(ground_truth))


def reward_for(scale: str):
    """Return the ``(text, answer) -> float`` reward of the scale."""
    return addition_reward if scale == "tiny" else doubling_reward


# -- the doubling chain -------------------------------------------------------------------------
def doubling_splits() -> tuple[list, list, list]:
    """Return ``(train, val, test)`` lists of ``(s, k)``, split as the TRL baseline does."""
    items = [
        (s, k)
        for s in range(DBL_START[0], DBL_START[1] + 1)
        for k in range(DBL_EXP[0], DBL_EXP[1] + 1)
    ]
    random.Random(SEED).shuffle(items)
    return items[N_TEST + N_VAL :], items[N_TEST : N_TEST + N_VAL], items[:N_TEST]


def doubling_question(item: tuple[int, int]) -> str:
    """Return the prompt text, e.g. ``"13*2^4="``."""
    return f"{item[0]}*2^{item[1]}="


def doubling_chain(item: tuple[int, int]) -> str:
    """Return the worked target, e.g. ``"26*2^3=52*2^2=104*2^1=208#208"``."""
    s, k = item
    parts = []
    while k > 1:
        s, k = 2 * s, k - 1
        parts.append(f"{s}*2^{k}")
    return "=".join(parts) + f"={2 * s}#{2 * s}"


def doubling_answer(item: tuple[int, int]) -> str:
    """Return ``s * 2**k`` as text."""
    return str(item[0] * 2 ** item[1])


# -- prompts and greedy accuracy ----------------------------------------------------------------
def chat_text(tokenizer: Any, question: str) -> str:
    """Return the question as a one-turn chat ending with the assistant role (no tokens added)."""
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def greedy_accuracy(
    model: Any, tokenizer: Any, test: list, scale: str, batch_size: int = 200
) -> float:
    """Return the mean reward of greedy replies to the held-out ``(question, answer)`` pairs."""
    import torch

    reward = reward_for(scale)
    max_new = SCALES[scale].max_new_tokens
    was_training = model.training
    model.eval()
    correct = 0.0
    with torch.inference_mode():
        for start in range(0, len(test), batch_size):
            chunk = test[start : start + batch_size]
            enc = tokenizer(
                [chat_text(tokenizer, q) for q, _ in chunk],
                add_special_tokens=False,
                padding=True,
                padding_side="left",
                return_tensors="pt",
            ).to(model.device)
            out = model.generate(
                **enc,
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(
                out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
            )
            correct += sum(reward(t, a) for t, (_, a) in zip(texts, chunk, strict=True))
    model.train(was_training)
    return correct / len(test)


# -- preparation --------------------------------------------------------------------------------
def write_train_parquet(path: Path, rows: list[tuple[str, str]], data_source: str) -> None:
    """Write the GRPO prompts as verl parquet rows (chat prompt, rule ground truth)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": q}],
            "reward_model": {"style": "rule", "ground_truth": a},
            "extra_info": {"index": i, "question": q},
        }
        for i, (q, a) in enumerate(rows)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(table), path)


def read_jsonl(path: Path) -> list[tuple[str, str]]:
    """Return ``(question, answer)`` pairs from an engine.tiny JSONL split."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(row["question"], row["answer"]) for row in rows]


def prepare_task(
    scale: str, root: Path, threads: int, force: bool = False
) -> tuple[TaskData, dict]:
    """Build (or reuse) the scale's model and data under ``root``; return them and SFT info."""
    info: dict[str, Any] = {}
    if scale == "tiny":
        from engine.tiny import ensure_tiny_assets

        assets = ensure_tiny_assets()
        model_dir = str(assets.model_dir)
        train = read_jsonl(assets.train_jsonl)
        test = read_jsonl(assets.val_jsonl)
        info = {
            "recipe_hash": assets.manifest["recipe_hash"],
            "sft_steps": assets.manifest["sft_steps"],
        }
    else:
        model_dir = str(root / "medium" / "sft")
        train_items, val_items, test_items = doubling_splits()
        if force or not (Path(model_dir) / "config.json").exists():
            info = medium_warm_start(Path(model_dir), train_items, val_items, threads)
        else:
            info = json.loads((Path(model_dir) / "sft_info.json").read_text())
        train = [(doubling_question(it), doubling_answer(it)) for it in train_items]
        test = [(doubling_question(it), doubling_answer(it)) for it in test_items]
    random.Random(SEED + 2).shuffle(train)
    parquet = root / scale / "train.parquet"
    write_train_parquet(parquet, train, SCALES[scale].data_source)
    task = TaskData(model_dir, train, test, str(parquet), SCALES[scale].data_source)
    return task, info


def medium_warm_start(out_dir: Path, train: list, val: list, threads: int) -> dict[str, Any]:
    """Build the medium model and warm-start it on the doubling chain; save it to ``out_dir``."""
    import torch

    from engine.tiny import build_model, build_tokenizer

    torch.set_num_threads(threads)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, 0, **MEDIUM_SHAPE)
    val_pairs = [(doubling_question(it), doubling_answer(it)) for it in val]
    optimizer = torch.optim.AdamW(model.parameters(), lr=MEDIUM_SFT["lr"], weight_decay=0.0)
    rng = random.Random(SEED + 1)
    started = time.perf_counter()
    history, step, accuracy = [], 0, 0.0
    cfg = MEDIUM_SFT
    model.train()
    while step < cfg["max_steps"]:
        batch = [train[rng.randrange(len(train))] for _ in range(cfg["batch_size"])]
        ids, mask, labels = sft_batch(tokenizer, batch)
        lr = cfg["lr"] * min(1.0, (step + 1) / cfg["warmup"])
        if step >= cfg["warmup"]:
            lr = cfg["lr"] * (cfg["max_steps"] - step) / (cfg["max_steps"] - cfg["warmup"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % cfg["eval_every"] == 0 and step >= cfg["eval_start"]:
            accuracy = greedy_accuracy(model, tokenizer, val_pairs, "medium")
            history.append({"step": step, "loss": round(loss.item(), 4), "val_acc": accuracy})
            print(f"[compare] medium sft step {step} val_acc {accuracy:.3f}", flush=True)
            if accuracy >= cfg["target"]:
                break
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {
        "sft_steps": step,
        "sft_val_acc": accuracy,
        "sft_history": history,
        "sft_wall_s": round(time.perf_counter() - started, 1),
        "params": sum(p.numel() for p in model.parameters()),
    }
    (out_dir / "sft_info.json").write_text(json.dumps(info, indent=1))
    return info


def sft_batch(tokenizer: Any, items: list) -> tuple[Any, Any, Any]:
    """Return right-padded ``input_ids, attention_mask, labels`` (bs, L); loss on the target only."""
    import torch

    seqs, labels = [], []
    for item in items:
        prompt = tokenizer(chat_text(tokenizer, doubling_question(item)), add_special_tokens=False)
        target = tokenizer(doubling_chain(item), add_special_tokens=False)["input_ids"]
        target = [*target, tokenizer.eos_token_id]
        seqs.append(prompt["input_ids"] + target)
        labels.append([-100] * len(prompt["input_ids"]) + target)
    length = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (length - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (length - len(s)) for s in seqs])
    label_ids = torch.tensor([t + [-100] * (length - len(t)) for t in labels])
    return ids, mask, label_ids


# -- noise probes -------------------------------------------------------------------------------
class CpuMeter:
    """Wall time, own CPU time and other processes' CPU time over an interval (``/proc/stat``).

    ``foreign_cpu_frac`` is the machine's busy time minus this process tree's, divided by
    cores x wall time: above about 0.05 the timings shared the cores with someone else. The tree
    includes live descendants (a Ray arm's rank workers, raylet and GCS are the driver's
    descendants), whose CPU time ``os.times`` counts only once they have exited and been reaped.
    """

    def __init__(self) -> None:
        self.hz = os.sysconf("SC_CLK_TCK")
        self.ncpu = os.cpu_count() or 1
        self.descendants0 = self._descendants()
        self.wall0, self.busy0, self.own0 = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        with open("/proc/stat") as handle:
            v = [int(x) for x in handle.readline().split()[1:]]
        return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    @staticmethod
    def _descendants() -> dict[tuple[int, float], float]:
        """Return the CPU seconds of each live descendant, keyed by (pid, start time)."""
        import psutil

        out = {}
        for child in psutil.Process().children(recursive=True):
            try:
                t = child.cpu_times()
                out[(child.pid, child.create_time())] = t.user + t.system
            except psutil.Error:  # exited meanwhile: os.times counts it once reaped
                continue
        return out

    def stop(self) -> dict[str, Any]:
        """Return the interval's wall, own and foreign CPU time and the load average."""
        wall = time.perf_counter() - self.wall0
        busy = (self._busy() - self.busy0) / self.hz
        descendants = self._descendants()
        own = self._own() - self.own0
        own += sum(t - self.descendants0.get(key, 0.0) for key, t in descendants.items())
        foreign = max(0.0, busy - own)
        return {
            "wall_s": round(wall, 2),
            "own_cpu_s": round(own, 2),
            "foreign_cpu_s": round(foreign, 2),
            "foreign_cpu_frac": round(foreign / (self.ncpu * wall), 3) if wall > 0 else None,
            "loadavg_end": open("/proc/loadavg").read().split()[:3],
        }


def machine_calib_s(reps: int = 5) -> float:
    """Return the median time of a fixed matmul probe (40 x 512^3, fp32): the machine's speed."""
    import torch

    a = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        for _ in range(40):
            a @ a
        times.append(time.perf_counter() - start)
    return round(statistics.median(times[1:]), 4)


def peak_rss_mib() -> float:
    """Return this process's peak resident set size in MiB."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def rss_now_mib() -> float:
    """Return this process's current resident set size in MiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    return float("nan")
