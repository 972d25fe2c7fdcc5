"""The lean runner against the model's own forward: logits, caches, samples and gradients."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.llama_forward import LlamaForward, causal_mask
from engine.rollout.sampling import new_kv_cache, sample_sequences, with_cache

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
    lean = LlamaForward.build(model)
    assert lean is not None
    ids, mask = left_padded_prompts()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [new_kv_cache(model), new_kv_cache(model)]
    with torch.no_grad():
        for cache in caches:
            model(input_ids=ids, attention_mask=mask, position_ids=positions, **with_cache(cache))
        token = torch.randint(5, VOCAB, (5, 1), generator=torch.Generator().manual_seed(3))
        step_mask = torch.cat([mask, torch.ones(5, 1, dtype=mask.dtype)], dim=-1)
        step_pos = positions[:, -1:] + 1
        expected = model(
            input_ids=token,
            attention_mask=step_mask,
            position_ids=step_pos,
            **with_cache(caches[0]),
        ).logits[:, -1]
        got = lean.decode(token, step_mask, step_pos, caches[1])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
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
            lean=lean,
        )  # fmt: skip
        for lean in (True, False)
    ]
    assert torch.equal(runs[0].responses, runs[1].responses)
    assert torch.equal(runs[0].response_mask, runs[1].response_mask)
    torch.testing.assert_close(runs[0].log_probs, runs[1].log_probs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("build", [qwen2, llama])
def test_a_forward_on_a_shared_prompt_gives_the_full_forward_logits_and_gradients(build):
    # A prompt pass whose keys and values a second pass (two rows per prompt) attends to,
    # against one forward of the model over prompt + continuation, in training mode.
    model = build().train()
    lean = LlamaForward.build(model)
    assert lean is not None
    ids, mask = left_padded_prompts()  # (5, 6), two rows left padded
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    rows = torch.tensor([0, 0, 1, 2, 3, 3, 4, 4])  # each continuation row's prompt
    more = torch.randint(5, VOCAB, (8, 3), generator=torch.Generator().manual_seed(5))
    full_ids = torch.cat([ids[rows], more], dim=-1)
    full_mask = torch.cat([mask[rows], torch.ones_like(more)], dim=-1)
    full_pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
    weights = torch.randn(8, 4, VOCAB, generator=torch.Generator().manual_seed(6))

    def grads(logits: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (logits * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    expected = model(
        input_ids=full_ids, attention_mask=full_mask, position_ids=full_pos, use_cache=False
    ).logits[:, -4:]  # (8, 4, V): the last prompt token and the continuation
    expected_grads = grads(expected)

    hidden, past = lean.forward(ids, positions, causal_mask(mask), keep_kv=True)
    sees = torch.cat([mask[rows, None, None, :].bool().expand(8, 1, 3, 6),
                      torch.ones(3, 3, dtype=torch.bool).tril().expand(8, 1, 3, 3)], dim=-1)  # fmt: skip
    cont, _ = lean.forward(more, full_pos[:, 6:], sees, past=[(k[rows], v[rows]) for k, v in past])
    got = torch.cat([lean.logits(hidden[rows, -1:]), lean.logits(cont)], dim=1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(grads(got), expected_grads, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(hidden).all()  # padding positions see themselves, never nothing


def test_models_it_does_not_mirror_are_left_to_their_forward():
    model = qwen2()
    assert LlamaForward.build(model.train()) is not None  # no dropout: training is the same sum
    model.config.attention_dropout = 0.1
    assert LlamaForward.build(model) is None  # the module would draw dropout masks
    assert LlamaForward.build(model.eval()) is not None
    model.config.attention_dropout = 0.0
    model.config.use_sliding_window = True
    assert LlamaForward.build(model) is None
    model.config.use_sliding_window = False
    model.config.hidden_act = "gelu"
    assert LlamaForward.build(model) is None
    model.config.hidden_act = "silu"
    assert LlamaForward.build(model) is not None
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *_: None)
    assert LlamaForward.build(model) is None  # a hook expects to see every call
    handle.remove()
    assert LlamaForward.build(model) is not None
    model.gradient_checkpointing_enable()  # as engine.roles.model_loading asks for it
    assert LlamaForward.build(model.train()) is None  # the caller asked for recomputation


@pytest.mark.parametrize("build", [qwen2, llama])
def test_a_half_precision_model_keeps_the_modules_norm_arithmetic(build):
    # bf16 takes the RMSNorm path that upcasts to fp32 and back, as the module does.
    model = build().to(torch.bfloat16)
    lean = LlamaForward.build(model)
    assert lean is not None
    ids, mask = left_padded_prompts()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
        ).logits
        hidden, _ = lean.forward(ids, positions, causal_mask(mask))
        got = lean.logits(hidden)
    assert got.dtype == torch.bfloat16
    real = mask.bool()  # what padding positions compute is nobody's business
    torch.testing.assert_close(got[real].float(), expected[real].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("build", [qwen2, llama])
def test_a_lean_prefill_fills_the_cache_the_decode_steps_read(build):
    # The rollout prefills with LlamaForward.forward and hands its keys and values to the cache.
    model = build()
    lean = LlamaForward.build(model)
    assert lean is not None
    ids, mask = left_padded_prompts()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    theirs, ours = new_kv_cache(model), new_kv_cache(model)
    with torch.no_grad():
        expected = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, **with_cache(theirs)
        ).logits[:, -1]
        hidden, keys_values = lean.forward(ids, positions, causal_mask(mask), keep_kv=True)
        for index, (keys, values) in enumerate(keys_values):
            ours.update(keys, values, index)
    torch.testing.assert_close(lean.logits(hidden[:, -1]), expected, atol=1e-5, rtol=1e-5)
    real = mask.bool()  # (b, L): padding positions are masked out of every later query
    for mine, module in zip(ours.layers, theirs.layers, strict=True):
        torch.testing.assert_close(
            mine.keys.transpose(1, 2)[real], module.keys.transpose(1, 2)[real], atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            mine.values.transpose(1, 2)[real],
            module.values.transpose(1, 2)[real],
            atol=1e-5,
            rtol=0,
        )
