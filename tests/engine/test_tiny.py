"""Tests for the embedded tiny model, tokenizer and arithmetic task (one shared CPU build)."""

from __future__ import annotations

import json
import string
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine import env
from engine.rewards.arithmetic import DATA_SOURCE
from engine.tiny import (
    TinyAssets,
    build_model,
    build_tokenizer,
    ensure_tiny_assets,
    greedy_accuracy,
    make_problems,
    recipe_hash,
    resolve_tiny_path,
)
from engine.tiny.recipe import SftSettings, TinyRecipe, greedy_responses
from engine.tiny.task import split_of, split_pool
from engine.tiny.tokenizer import byte_symbols


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-data")


@pytest.fixture(scope="module")
def assets(tiny_assets: TinyAssets) -> TinyAssets:
    """The embedded assets every engine test reads, built by ``ensure_tiny_assets`` into the data
    folder's cache (the cache's own behaviour is tested below on a cheap recipe)."""
    return tiny_assets


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_tokenizer_has_one_token_per_character_and_fixed_special_ids(tokenizer):
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.unk_token_id == 3
    assert tokenizer.padding_side == "left"
    # 7 special tokens, then 256 byte values, the 96 listed characters first.
    assert len(tokenizer) == 7 + 256 == 263
    assert set(byte_symbols()) == set(ByteLevel.alphabet())
    text = string.digits + string.ascii_letters + string.punctuation + " \n"
    assert tokenizer(text)["input_ids"] == list(range(7, 7 + 96))
    assert tokenizer("\t")["input_ids"] == [103 + 9]  # tab: the 10th byte not listed
    assert len(tokenizer("é")["input_ids"]) == 2  # two UTF-8 bytes


def test_chat_template_renders_compact_prompt_tokens(tokenizer):
    messages = [{"role": "user", "content": "12+35="}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<bos><|user|>12+35=<|assistant|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # <bos>=1, <|user|>=5, digits start at 7, "+" is punctuation index 10 (7+10+52+10=79),
    # "=" is punctuation index 18 (87), <|assistant|>=6.
    assert ids == [1, 5, 8, 9, 79, 10, 12, 87, 6]
    full = messages + [{"role": "assistant", "content": "47"}]
    assert tokenizer.apply_chat_template(full, tokenize=False) == (
        "<bos><|user|>12+35=<|assistant|>47<eos>"
    )
    system = [{"role": "system", "content": "Add."}, *messages]
    assert (
        tokenizer.apply_chat_template(system, tokenize=False) == "<bos><|system|>Add.<|user|>12+35="
    )


def test_chat_template_rejects_unknown_role(tokenizer):
    with pytest.raises(Exception, match="unknown role tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_decode_round_trips_without_inserted_spaces(tokenizer):
    text = "Hello, world!\n  a+b = 3 . ?\té"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    ids = tokenizer("<bos><|user|>12+35=<|assistant|>47<eos>", add_special_tokens=False)
    assert tokenizer.decode(ids["input_ids"], skip_special_tokens=True) == "12+35=47"


def test_build_model_has_about_a_million_parameters(tokenizer):
    model = build_model(tokenizer, seed=0)
    # embeddings 263*128 (tied with the head); per layer q 128*128+128, k and v 128*64+64 each,
    # o 128*128, MLP 3*128*512, two norms 2*128; final norm 128.
    per_layer = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 512 + 2 * 128
    assert (
        sum(p.numel() for p in model.parameters()) == 263 * 128 + 4 * per_layer + 128 == 1_018_880
    )
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.dtype == torch.float32
    same = build_model(tokenizer, seed=0)
    assert torch.equal(model.model.embed_tokens.weight, same.model.embed_tokens.weight)


def test_build_model_takes_larger_dimensions(tokenizer):
    model = build_model(tokenizer, seed=1, hidden_size=64, num_layers=2, intermediate_size=128)
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 2)


def test_model_folder_loads_with_from_pretrained(assets):
    assert (assets.model_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tokenizer) == 263
    assert model.dtype == torch.float32
    generation = model.generation_config
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (1, 2, 0)
    assert generation.top_k == 0
    assert tokenizer.padding_side == "left"
    text = "<bos><|user|>7 + 8 =\n<|assistant|>15<eos>"
    assert tokenizer(text)["input_ids"] == build_tokenizer()(text)["input_ids"]
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_manifest_records_the_build(assets):
    manifest = assets.manifest
    assert manifest["recipe_hash"] == recipe_hash() == assets.root.name
    assert manifest["parameters"] == 1_018_880
    assert 0.2 <= manifest["val_accuracy"] <= 0.6
    assert manifest["sft_steps"] > 0
    assert manifest["sft_seconds"] < manifest["build_seconds"]
    assert set(manifest["versions"]) == {"torch", "transformers"}
    assert json.loads((assets.root / "manifest.json").read_text()) == manifest


def test_greedy_recheck_on_val_split_matches_manifest(assets):
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    rows = pq.read_table(assets.val_parquet).to_pylist()
    questions = [row["prompt"][0]["content"] for row in rows]
    answers = [row["reward_model"]["ground_truth"] for row in rows]
    assert greedy_accuracy(model, tokenizer, questions, answers) == assets.manifest["val_accuracy"]


def test_left_padded_batch_decodes_as_one_prompt_at_a_time(assets):
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    questions = ["3+4=", "12+35=", "7+80=", "99+99="]  # prompts of 7 to 9 tokens
    one_by_one = [greedy_responses(model, tokenizer, [question])[0] for question in questions]
    assert greedy_responses(model, tokenizer, questions) == one_by_one


def test_data_rows_have_verl_schema(assets):
    train = pq.read_table(assets.train_parquet).to_pylist()
    val = pq.read_table(assets.val_parquet).to_pylist()
    assert (len(train), len(val)) == (2000, 200)
    row = val[3]
    question = row["prompt"][0]["content"]
    a, b = (int(x) for x in question.rstrip("=").split("+"))
    assert row == {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{a}+{b}="}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": "val", "index": 3, "question": question, "answer": str(a + b)},
    }
    jsonl = [json.loads(line) for line in assets.val_jsonl.read_text().splitlines()]
    assert jsonl[3] == {"question": question, "answer": str(a + b), "data_source": DATA_SOURCE}
    train_questions = {r["prompt"][0]["content"] for r in train}
    assert len(train_questions) == 2000
    assert train_questions.isdisjoint(r["prompt"][0]["content"] for r in val)
    assert len(assets.train_jsonl.read_text().splitlines()) == 2000


def test_make_problems_is_deterministic_and_splits_are_disjoint():
    assert make_problems("train", 50, seed=7) == make_problems("train", 50, seed=7)
    assert make_problems("train", 50, seed=7) != make_problems("train", 50, seed=8)
    train_pool = {(p.a, p.b) for p in split_pool("train")}
    val_pool = {(p.a, p.b) for p in split_pool("val")}
    assert len(train_pool) + len(val_pool) == 100 * 100
    assert train_pool.isdisjoint(val_pool)
    assert all(split_of(p.a, p.b) == "val" for p in make_problems("val", 200, seed=3))
    problem = make_problems("val", 1, seed=0)[0]
    assert problem.question == f"{problem.a}+{problem.b}=" and problem.answer == str(
        problem.a + problem.b
    )


def test_make_problems_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"n=20000 is out of range for split 'train'"):
        make_problems("train", 20000, seed=0)
    with pytest.raises(ValueError, match=r"unknown split 'test'; use one of train, val"):
        make_problems("test", 5, seed=0)


def test_resolve_tiny_path(assets):
    assert resolve_tiny_path("/data/gsm8k/train.parquet") == "/data/gsm8k/train.parquet"
    assert resolve_tiny_path("tiny://model") == str(assets.model_dir)
    assert resolve_tiny_path("tiny://model", env.data_dir()) == str(assets.model_dir)
    assert resolve_tiny_path("tiny://val.jsonl") == str(assets.val_jsonl)
    with pytest.raises(ValueError, match=r"unknown embedded asset 'tiny://test.parquet'.*"):
        resolve_tiny_path("tiny://test.parquet")
    with pytest.raises(ValueError, match=r"tiny://model, tiny://train.parquet, tiny://val.parquet"):
        resolve_tiny_path("tiny://")


def test_cache_is_reused_and_rebuilt_identically_when_forced(data_dir):
    cheap = TinyRecipe(
        train_rows=64, val_rows=16, sft=SftSettings(max_steps=10, sparse_check_every=5)
    )
    first = ensure_tiny_assets(data_dir, recipe=cheap)
    assert first.root.name == recipe_hash(cheap) != recipe_hash()
    manifest_path = first.root / "manifest.json"
    weights_path = first.model_dir / "model.safetensors"
    built_at = manifest_path.stat().st_mtime_ns
    weights = weights_path.read_bytes()

    assert ensure_tiny_assets(data_dir, recipe=cheap) == first
    assert manifest_path.stat().st_mtime_ns == built_at

    killed_build = data_dir / "tiny" / f".{first.root.name}-build-killed"
    killed_build.mkdir()
    rebuilt = ensure_tiny_assets(data_dir, force=True, recipe=cheap)
    assert not killed_build.exists()
    assert rebuilt.root == first.root
    assert manifest_path.stat().st_mtime_ns != built_at
    assert weights_path.read_bytes() == weights
    assert rebuilt.manifest["accuracy_checks"] == first.manifest["accuracy_checks"]
    assert (first.manifest["sft_steps"], len(pq.read_table(first.train_parquet))) == (5, 64)
    assert not [p.name for p in (data_dir / "tiny").iterdir() if "-build-" in p.name]


def test_concurrent_builds_take_turns(tmp_path):
    cheap = TinyRecipe(train_rows=8, val_rows=8, sft=SftSettings(max_steps=5, sparse_check_every=5))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: ensure_tiny_assets(tmp_path, recipe=cheap), range(2)))
    # Without the lock both would build, and their manifests would differ in build_seconds.
    assert results[0] == results[1]
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [
        f".{recipe_hash(cheap)}.lock",
        recipe_hash(cheap),
    ]
