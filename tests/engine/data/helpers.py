"""Test helpers: a character-level chat tokenizer and writers for small data files."""

import csv
import json
import string
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<unk>", "<bos>", "<|user|>", "<|assistant|>", "<|system|>"]
# One token per message marker, so a user prompt "abc" is <bos><|user|>abc<|assistant|>: 3 + 3.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEMPLATE_TOKENS = 3


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Return a tokenizer with one token per character and a BOS that add_special_tokens adds."""
    chars = [c for c in string.printable if c not in SPECIALS]
    vocab = {token: i for i, token in enumerate(SPECIALS + chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|system|>"],
        chat_template=CHAT_TEMPLATE,
    )


def data_config(**overrides) -> SimpleNamespace:
    """Return a verl-style ``data`` section with small defaults."""
    values = {"max_prompt_length": 64, "truncation": "error", "filter_overlong_prompts": False}
    return SimpleNamespace(**{**values, **overrides})


def write_jsonl(path: Path, rows: list) -> Path:
    """Write one JSON value per line."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    """Write a CSV with a header row."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    """Write rows as a parquet file."""
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def verl_row(question: str, answer: str, source: str = "gsm8k") -> dict:
    """Return a row in verl's parquet layout."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "answer": f"#### {answer}"},
    }
