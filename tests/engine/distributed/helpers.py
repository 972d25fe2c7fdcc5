"""A random small Qwen2 over the embedded tokenizer, configs for it, and batches for updates."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.config import load_config
from engine.config.schema import PPOConfig
from engine.data import DataProto
from engine.tiny.tokenizer import build_tokenizer

TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
}


def tiny_qwen2_config(vocab_size: int, **overrides: Any) -> Qwen2Config:
    """Return the config of the tests' small Qwen2 (:data:`TINY_SHAPE`: two layers of width 32,
    4 attention heads over 2 key/value heads, which split over 2 and 4 Ulysses ranks), with
    ``overrides`` added."""
    return Qwen2Config(vocab_size=vocab_size, **TINY_SHAPE, **overrides)


def tiny_policy(vocab_size: int, seed: int = 0, *, max_positions: int = 64) -> Qwen2ForCausalLM:
    """Return a random two-layer Qwen2 (about 60k parameters), seeded: the tests' small model."""
    torch.manual_seed(seed)
    config = tiny_qwen2_config(
        vocab_size, max_position_embeddings=max_positions, tie_word_embeddings=True
    )
    return Qwen2ForCausalLM(config)


def tiny_config(*, lr: float = 1e-2, mini_batch: int = 4, n: int = 1) -> PPOConfig:
    """Return a config whose policy and tokenizer are live objects (nothing read from disk)."""
    tokenizer = build_tokenizer()
    config = PPOConfig()
    arr = config.actor_rollout_ref
    arr.model.tokenizer = tokenizer
    policy = tiny_policy(len(tokenizer))
    with torch.no_grad():
        # EOS becomes likely in about half of the states (its logit is 10 x one hidden unit), so
        # responses end at different lengths and ranks stop sampling at different steps.
        row = policy.model.embed_tokens.weight[tokenizer.eos_token_id]
        row.zero_()
        row[0] = 10.0
    arr.model.hf_model = policy
    arr.actor.optim.lr = lr
    arr.actor.ppo_mini_batch_size = mini_batch
    arr.actor.ppo_micro_batch_size_per_gpu = 1
    arr.rollout.n = n
    config.data.max_response_length = 6
    config.trainer.seed = 7
    return config


def prompt_batch(tokenizer, questions: list[str]) -> DataProto:
    """Return left-padded chat prompts (bs, P) for the given arithmetic questions."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    mask = enc["attention_mask"]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": position_ids},
        {"question": np.array(questions, dtype=object)},
    )


def update_batch(bs: int, prompt_len: int, response_lengths: list[int], vocab: int) -> DataProto:
    """Return a random batch ready for ``update_actor``: tokens, masks and advantages."""
    g = torch.Generator().manual_seed(11)
    response_len = max(response_lengths)
    prompts = torch.randint(7, vocab, (bs, prompt_len), generator=g)
    responses = torch.randint(7, vocab, (bs, response_len), generator=g)
    response_mask = torch.arange(response_len)[None] < torch.tensor(response_lengths)[:, None]
    response_mask = response_mask.long()
    attention_mask = torch.cat([torch.ones_like(prompts), response_mask], dim=-1)
    return DataProto.from_dict(
        {
            "input_ids": torch.cat([prompts, responses], dim=-1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": response_mask,
            "advantages": torch.randn(bs, response_len, generator=g) * response_mask,
        }
    )


def plain_worker(config: PPOConfig, weights: dict[str, torch.Tensor]) -> Any:
    """Return a single-process CPU worker (policy and reference) holding ``weights``."""
    import copy

    from engine.roles.actor_rollout_ref import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(
        copy.deepcopy(config), device=torch.device("cpu"), total_steps=10, need_ref=True
    )
    worker.model.load_state_dict(weights)
    worker.ref_model.load_state_dict(weights)
    return worker


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Return the largest absolute difference between two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def without_perf(metrics: dict[str, float]) -> dict[str, float]:
    """Return the update's metrics without the ``perf/`` figures, which measure the process
    (memory, CPU, MFU from wall time) and differ between any two updates."""
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


def ray_config(assets, tmp_path, preset: str, *overrides: str) -> PPOConfig:
    """Return ``preset`` on two CPU ranks of the Ray controller, over the ``assets`` folder's
    model and data (the ``assets`` fixture), batches of 4, no logger, with ``overrides``."""
    return load_config(
        f"{preset}.yaml",
        overrides=[
            f"data.train_files={assets / 'train.parquet'}",
            f"data.val_files={assets / 'val.parquet'}",
            f"actor_rollout_ref.model.path={assets / 'model'}",
            "trainer.controller=ray",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=2",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "critic.ppo_mini_batch_size=4",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            *overrides,
        ],
    )
