"""The rollout contract every engine adapter (``vllm``, ``sglang``) is held to, shared by their tests.

On the CPU: a two-prompt batch, the responses a fake engine scripts for it, and the tensors the
adapter must turn them into. On a GPU: a random small Qwen2 saved to a folder, whose log-probs
under Hugging Face the engine's must match, before and after a weight reload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.config import RolloutConfig
from engine.data import DataProto

PAD, EOS = 0, 2
GREEDY = {"do_sample": False, "temperature": 0.0, "top_k": -1, "top_p": 1.0}
SAMPLE = {"do_sample": True, "temperature": 1.0, "top_k": -1, "top_p": 1.0}

# Unpadded prompt ids -> (response ids, their log-probs), as the fake engines answer.
SCRIPT = {
    (7, 8): ([20, 21, EOS], [-0.5, -0.25, -0.125]),  # ends with EOS
    (9, 10, 11, 12): ([30, 31], [-1.0, -2.0]),  # hits max_tokens: truncated
}


def chat_prompts(tokenizer: Any, questions: list[str], **per_row: list) -> DataProto:
    """Return ``questions`` as one-turn chat prompts, left-padded as the tokenizer pads, with
    verl's ``raw_prompt`` and ``extra_info`` (the row's index) and any other per-row columns."""
    messages = [[{"role": "user", "content": q}] for q in questions]
    texts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        for m in messages
    ]
    enc = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
        {
            "raw_prompt": messages,
            **per_row,
            "extra_info": [{"index": i} for i in range(len(questions))],
        },
    )


def prompt_batch() -> DataProto:
    """Return the two left-padded prompts of :data:`SCRIPT` (bs=2, P=4)."""
    ids = torch.tensor([[PAD, PAD, 7, 8], [9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask})


def assert_scripted_batch(out: DataProto) -> None:
    """Assert ``out`` holds exactly the contract's tensors for :data:`SCRIPT`'s answers."""
    b = out.batch
    assert torch.equal(b["responses"], torch.tensor([[20, 21, EOS], [30, 31, PAD]]))
    assert torch.equal(b["response_mask"], torch.tensor([[1, 1, 1], [1, 1, 0]]))
    expected_logp = torch.tensor([[-0.5, -0.25, -0.125], [-1.0, -2.0, 0.0]])
    torch.testing.assert_close(b["rollout_log_probs"], expected_logp)
    assert b["rollout_log_probs"].dtype == torch.float32
    assert torch.equal(b["prompts"], prompt_batch().batch["input_ids"])
    assert torch.equal(b["input_ids"][0], torch.tensor([PAD, PAD, 7, 8, 20, 21, EOS]))
    assert torch.equal(b["attention_mask"][1], torch.tensor([1, 1, 1, 1, 1, 1, 0]))
    assert torch.equal(b["position_ids"][0], torch.tensor([0, 0, 0, 1, 2, 3, 4]))
    assert out.non_tensor_batch["truncated"].tolist() == [False, True]


# -- on a GPU ------------------------------------------------------------------------------------
def random_qwen2(tokenizer: Any, seed: int) -> Any:
    """Return a random two-layer Qwen2 over ``tokenizer``'s vocabulary (head_dim 64)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: supported by the engines' attention kernels
        num_key_value_heads=1,
        intermediate_size=256,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # larger logits than the default init, so that outputs differ
        model.lm_head.weight.normal_(0.0, 0.5)
    return model


def hf_response_log_probs(model: Any, out: DataProto, device: str = "cuda") -> torch.Tensor:
    """Return log p(response token) (bs, T) under ``model`` at temperature 1, by full forward."""
    b = {k: v.to(device) for k, v in out.batch.items()}
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits.float()  # (bs, P + T, V)
    width = b["responses"].shape[1]
    logits = logits[:, -width - 1 : -1]  # (bs, T, V)
    logp = torch.log_softmax(logits, -1).gather(-1, b["responses"][..., None]).squeeze(-1)
    return (logp * b["response_mask"]).cpu()


def gpu_rollout_config(name: str) -> RolloutConfig:
    """Return a small sleeping rollout config for backend ``name`` on one GPU."""
    return RolloutConfig(
        name=name,
        dtype="bfloat16",
        gpu_memory_utilization=0.2,
        enable_sleep_mode=True,
        free_cache_engine=True,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
    )


def assert_matches_hf_and_reload_changes_outputs(
    build: Callable[[str, Any], Any], folder: Any
) -> None:
    """Build a rollout with ``build(model_path, tokenizer)`` and hold it to the contract on a GPU.

    Its sampled log-probs match a Hugging Face forward of the same model, and loading another
    model's weights changes its greedy outputs to that model's.
    """
    from engine.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = random_qwen2(tokenizer, seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rollout = build(str(folder), tokenizer)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in ("12+35=", "7*8=", "hello", "1+1=")
    ]
    enc = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    prompts = DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    )
    out = rollout.generate_sequences(prompts, max_new_tokens=12, sampling=SAMPLE)
    hf = model.cuda().to(torch.bfloat16)
    mask = out.batch["response_mask"].bool()
    assert mask.sum() > 0
    expected = hf_response_log_probs(hf, out)
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][mask], expected[mask], atol=0.05, rtol=0.05
    )

    before = rollout.generate_sequences(prompts, max_new_tokens=12, sampling=GREEDY)
    new_model = random_qwen2(tokenizer, seed=1).cuda().to(torch.bfloat16)
    stats = rollout.load_weights(new_model)
    assert stats["tensors"] > 0
    after = rollout.generate_sequences(prompts, max_new_tokens=12, sampling=GREEDY)
    assert not torch.equal(before.batch["responses"], after.batch["responses"])
    mask = after.batch["response_mask"].bool()
    torch.testing.assert_close(
        after.batch["rollout_log_probs"][mask],
        hf_response_log_probs(new_model, after)[mask],
        atol=0.05,
        rtol=0.05,
    )
