"""The embedded arithmetic task: two-operand addition ``a+b`` with ``a, b`` in 0..99.

A problem's split is fixed by a hash of the pair, not by sampling order, so train and
validation never share a pair whatever ``n`` and ``seed`` are, and a later, larger train set
still excludes every validation pair. About a tenth of the 10,000 pairs are validation pairs.
``make_problems`` then draws ``n`` distinct pairs from that split with a seeded generator.

The data is written in the two forms the engine reads: verl's parquet rows (``prompt`` as chat
messages, ``reward_model.ground_truth``) and plain JSONL (``question``/``answer``), the shape a
user's own upload has before ``data.data_key_map`` maps question→prompt, answer→ground_truth.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from engine.rewards.arithmetic import DATA_SOURCE

SPLITS = ("train", "val")
OPERAND_MAX = 99
VAL_BUCKETS = 10  # one hash bucket in ten is validation


@dataclass(frozen=True)
class Problem:
    """One addition problem: ``question`` like ``"12+35="`` and ``answer`` like ``"47"``."""

    a: int
    b: int

    @property
    def question(self) -> str:
        """Return the prompt text, e.g. ``"12+35="``."""
        return f"{self.a}+{self.b}="

    @property
    def answer(self) -> str:
        """Return the expected reply, e.g. ``"47"``."""
        return str(self.a + self.b)


def split_of(a: int, b: int) -> str:
    """Return ``"val"`` or ``"train"`` for the pair, from a stable hash of ``"a+b"``."""
    digest = hashlib.sha256(f"{a}+{b}".encode()).digest()
    return "val" if int.from_bytes(digest[:8], "big") % VAL_BUCKETS == 0 else "train"


def split_pool(split: str) -> list[Problem]:
    """Return every problem of the split, in (a, b) order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    pairs = [(a, b) for a in range(OPERAND_MAX + 1) for b in range(OPERAND_MAX + 1)]
    return [Problem(a, b) for a, b in pairs if split_of(a, b) == split]


def make_problems(split: str, n: int, seed: int) -> list[Problem]:
    """Return ``n`` distinct problems of the split, drawn deterministically from ``seed``."""
    pool = split_pool(split)
    if not 0 <= n <= len(pool):
        raise ValueError(
            f"make_problems: n={n} is out of range for split {split!r}, which has "
            f"{len(pool)} distinct problems; ask for between 0 and {len(pool)}"
        )
    return random.Random(seed).sample(pool, n)


def verl_row(problem: Problem, split: str, index: int) -> dict[str, Any]:
    """Return the problem as a verl parquet row (chat ``prompt``, rule-based ``reward_model``)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": problem.question}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": problem.answer},
        "extra_info": {
            "split": split,
            "index": index,
            "question": problem.question,
            "answer": problem.answer,
        },
    }


def jsonl_row(problem: Problem) -> dict[str, str]:
    """Return the problem as a plain question/answer row."""
    return {"question": problem.question, "answer": problem.answer, "data_source": DATA_SOURCE}


def write_split(problems: list[Problem], split: str, out_dir: Path) -> tuple[Path, Path]:
    """Write ``<split>.parquet`` and ``<split>.jsonl`` under ``out_dir``; return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parquet_path = out_dir / f"{split}.parquet"
    jsonl_path = out_dir / f"{split}.jsonl"
    rows = [verl_row(problem, split, index) for index, problem in enumerate(problems)]
    pq.write_table(pa.Table.from_pylist(rows), parquet_path)
    with jsonl_path.open("w", encoding="utf-8") as handle:
        for problem in problems:
            handle.write(json.dumps(jsonl_row(problem)) + "\n")
    return parquet_path, jsonl_path
