"""The lean decode step against the model's own forward: same logits, same samples."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.rollout.lean_decode import LeanDecoder
from engine.rollout.sampling import new_kv_cache, sample_sequences

EOS, PAD, VOCAB = 2, 0, 48


def qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def llama() -> LlamaForCausalLM:
    # Biases everywhere, grouped queries, scaled rope and an untied head: every branch the
    # lean step has to honour.
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def left_padded_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, VOCAB, (5, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[:2, :2], mask[:2, :2] = PAD, 0
    return ids, mask


@pytest.mark.parametrize("build", [qwen2, llama])
def test_a_lean_step_gives_the_forward_logits_and_cache(build):
    model = build()
    decoder = LeanDecoder.build(model)
    assert decoder is not None
    ids, mask = left_padded_prompts()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [new_kv_cache(model), new_kv_cache(model)]
    with torch.no_grad():
        for cache in caches:
            model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache)
        token = torch.randint(5, VOCAB, (5, 1), generator=torch.Generator().manual_seed(3))
        step_mask = torch.cat([mask, torch.ones(5, 1, dtype=mask.dtype)], dim=-1)
        step_pos = positions[:, -1:] + 1
        expected = model(
            input_ids=token, attention_mask=step_mask, position_ids=step_pos, cache=caches[0]
        ).logits[:, -1]
        lean = decoder(token, step_mask, step_pos, caches[1])
    torch.testing.assert_close(lean, expected, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(caches[1].layers, caches[0].layers, strict=True):
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("build", [qwen2, llama])
def test_sampling_with_lean_steps_matches_the_forward_path(build):
    model = build()
    ids, mask = left_padded_prompts()
    runs = [
        sample_sequences(
            model,
            ids.repeat(2, 1),
            mask.repeat(2, 1),
            max_new_tokens=8,
            eos_token_ids=[EOS],
            pad_token_id=PAD,
            generator=torch.Generator().manual_seed(4),
            lean_decode=lean,
        )  # fmt: skip
        for lean in (True, False)
    ]
    assert torch.equal(runs[0].responses, runs[1].responses)
    assert torch.equal(runs[0].response_mask, runs[1].response_mask)
    torch.testing.assert_close(runs[0].log_probs, runs[1].log_probs, atol=1e-5, rtol=0)


def test_models_it_does_not_mirror_are_left_to_their_forward():
    model = qwen2()
    model.train()
    assert LeanDecoder.build(model) is None  # dropout would differ
    model.eval()
    model.config.use_sliding_window = True
    assert LeanDecoder.build(model) is None
    model.config.use_sliding_window = False
    model.config.hidden_act = "gelu"
    assert LeanDecoder.build(model) is None
    model.config.hidden_act = "silu"
    assert LeanDecoder.build(model) is not None
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *_: None)
    assert LeanDecoder.build(model) is None  # a hook expects to see every call
    handle.remove()
    assert LeanDecoder.build(model) is not None
