"""Fixtures: a character-level tokenizer and a tiny random Qwen2 reward model, built locally."""

from __future__ import annotations

from pathlib import Path

import pytest

CHARS = list(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 +-*/=#.,?!:;'()_<>{}\\$\n"
)


@pytest.fixture(scope="session")
def char_tokenizer():
    """Return a tokenizer with one token per character; ``[PAD]`` = 0 and ``[EOS]`` = 2."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )


@pytest.fixture(scope="session")
def reward_model_dirs(tmp_path_factory, char_tokenizer) -> tuple[Path, Path]:
    """Save a randomly initialised one-label Qwen2 classifier and the tokenizer; return both dirs."""
    import torch
    from transformers import Qwen2ForSequenceClassification

    from tests.engine.distributed.helpers import tiny_qwen2_config

    root = tmp_path_factory.mktemp("reward_model")
    model_dir, tokenizer_dir = root / "model", root / "tokenizer"
    torch.manual_seed(0)
    config = tiny_qwen2_config(
        len(char_tokenizer),
        max_position_embeddings=256,
        num_labels=1,
        pad_token_id=char_tokenizer.pad_token_id,
    )
    Qwen2ForSequenceClassification(config).save_pretrained(model_dir)
    # Kept apart from the model's config.json, which would make AutoTokenizer pick the Qwen2 class.
    char_tokenizer.save_pretrained(tokenizer_dir)
    return model_dir, tokenizer_dir


@pytest.fixture(scope="session")
def reward_model_scorer(reward_model_dirs):
    """Return a ``RewardModelScorer`` over the tiny model, micro-batches of 2."""
    from engine.rewards.reward_model import RewardModelScorer

    model_dir, tokenizer_dir = reward_model_dirs
    return RewardModelScorer(model_dir, tokenizer_path=tokenizer_dir, micro_batch_size=2)
