"""The lean sampling loop on a random small Qwen2 (CPU)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from engine.rollout.sampling import filter_logits, sample_sequences
from tests.engine.distributed.helpers import tiny_policy

EOS, PAD = 2, 0


@pytest.fixture(scope="module")
def model():
    return tiny_policy(40)  # a random two-layer Qwen2, seed 0.eval()


def left_padded_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 40, (6, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[:2, :3], mask[:2, :3] = PAD, 0  # two shorter prompts, left padded
    return ids, mask


def sample(model, ids, mask, max_new_tokens: int, seed: int, **extra):
    """Sample from ``model`` with the tests' EOS and PAD and a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    return sample_sequences(
        model,
        ids,
        mask,
        max_new_tokens=max_new_tokens,
        eos_token_ids=[EOS],
        pad_token_id=PAD,
        generator=generator,
        **extra,
    )


@contextlib.contextmanager
def favour_eos(model):
    """Bias the lm_head towards EOS so that most, but not all, rows end early, inside."""
    handle = model.lm_head.register_forward_hook(
        lambda _m, _i, out: out + torch.nn.functional.one_hot(torch.tensor(EOS), 40) * 3.0
    )
    try:
        yield
    finally:
        handle.remove()


def full_forward_log_probs(model, ids, mask, out) -> torch.Tensor:
    full = torch.cat([ids, out.responses], dim=1)
    full_mask = torch.cat([mask, out.response_mask], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=full_mask, position_ids=positions).logits
    response_logits = logits[:, ids.shape[1] - 1 : -1].float()
    log_probs = torch.log_softmax(response_logits, -1)
    return log_probs.gather(-1, out.responses[..., None]).squeeze(-1) * out.response_mask


def test_log_probs_match_a_full_forward_pass(model):
    ids, mask = left_padded_prompts()
    out = sample(model, ids, mask, max_new_tokens=6, seed=3)
    expected = full_forward_log_probs(model, ids, mask, out)
    assert out.log_probs.shape == out.responses.shape == out.response_mask.shape
    torch.testing.assert_close(out.log_probs, expected, atol=1e-5, rtol=1e-5)


def test_response_mask_stops_after_the_first_eos(model):
    ids, mask = left_padded_prompts()
    with favour_eos(model):
        out = sample(model, ids, mask, max_new_tokens=8, seed=0)
    assert 0 < int(out.truncated.sum()) < ids.shape[0] or not out.truncated.any()
    for row in range(ids.shape[0]):
        tokens = out.responses[row].tolist()
        length = int(out.response_mask[row].sum())
        if EOS in tokens:
            assert tokens.index(EOS) == length - 1  # the EOS itself is part of the response
            assert all(t == PAD for t in tokens[length:])
            assert not out.truncated[row]
        else:
            assert out.truncated[row] and length == out.responses.shape[1]


def test_ignore_eos_samples_every_row_to_the_limit_with_eos_as_a_plain_token(model):
    ids, mask = left_padded_prompts()
    with favour_eos(model):  # without ignore_eos most rows would stop early
        out = sample(model, ids, mask, max_new_tokens=8, seed=0, ignore_eos=True)
        expected = full_forward_log_probs(model, ids, mask, out)
    assert out.responses.shape == (ids.shape[0], 8)
    assert bool(out.response_mask.bool().all()) and bool(out.truncated.all())
    assert int((out.responses == EOS).sum(-1).max()) > 1  # EOS sampled, kept and continued past
    torch.testing.assert_close(out.log_probs, expected, atol=1e-5, rtol=1e-5)


def test_greedy_is_deterministic_and_picks_the_argmax(model):
    ids, mask = left_padded_prompts()
    kwargs = dict(max_new_tokens=4, eos_token_ids=[EOS], pad_token_id=PAD, do_sample=False)
    first = sample_sequences(model, ids, mask, **kwargs)
    second = sample_sequences(model, ids, mask, **kwargs)
    assert torch.equal(first.responses, second.responses)
    with torch.no_grad():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    assert torch.equal(first.responses[:, 0], logits.argmax(-1))


def test_filter_logits_keeps_top_k_and_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = filter_logits(logits, top_k=2)
    assert torch.isfinite(top2).tolist() == [[True, True, False, False]]
    nucleus = filter_logits(logits, top_p=0.7)  # 0.5 + 0.3 covers 0.7
    assert torch.isfinite(nucleus).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.4)).sum() == 1  # always keeps one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_sampling_on_a_gpu_matches_a_full_forward_pass(model):
    # The rollout's loop on CUDA in bf16 (as the trainer's rollout copy runs): the sampled
    # tokens' log-probs agree with one full forward pass of the same bf16 model.
    gpu_model = copy.deepcopy(model).to("cuda", torch.bfloat16)  # the fixture is shared
    ids, mask = (t.cuda() for t in left_padded_prompts())
    out = sample_sequences(
        gpu_model, ids, mask, max_new_tokens=6, eos_token_ids=[EOS], pad_token_id=PAD
    )
    assert out.responses.device.type == "cuda"
    expected = full_forward_log_probs(gpu_model, ids, mask, out)
    assert (out.log_probs - expected).abs().max() < 0.05  # bf16 rounding of two kernel orders


class SwapAt:
    """An ``interrupt`` that loads ``weights`` into ``policy`` at its ``at``-th call (before
    the decoding step of token ``at``) and returns ``version``; None at every other call."""

    def __init__(self, policy, weights, at: int, version: int = 1):
        self.policy, self.weights, self.at, self.version = policy, weights, at, version
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls != self.at:
            return None
        self.policy.load_state_dict(self.weights)
        return self.version


@pytest.mark.parametrize("lean", [True, False])
def test_an_interrupt_that_keeps_the_weights_samples_the_same_tokens(model, lean):
    ids, mask = left_padded_prompts()
    plain = sample(model, ids, mask, max_new_tokens=8, seed=4, lean=lean)
    swap = SwapAt(model, model.state_dict(), at=3, version=0)
    again = sample(model, ids, mask, max_new_tokens=8, seed=4, lean=lean, interrupt=swap)
    assert swap.calls >= 3
    # The prompt and the first three tokens prefilled again give the cache the decode built.
    assert torch.equal(again.responses, plain.responses)
    torch.testing.assert_close(again.log_probs, plain.log_probs, atol=1e-5, rtol=1e-5)
    assert bool((plain.token_versions[plain.response_mask.bool()] == 0).all())


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("early_eos", [False, True])
def test_an_interrupt_that_loads_new_weights_samples_the_rest_under_them(model, lean, early_eos):
    old = copy.deepcopy(model)
    new = copy.deepcopy(model)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    policy = copy.deepcopy(old)
    ids, mask = left_padded_prompts()
    swap = SwapAt(policy, new.state_dict(), at=3)
    # With EOS favoured, finished rows leave the batch before the swap: the prefill must
    # take the rows still writing.
    hooks = (favour_eos(policy), favour_eos(old), favour_eos(new)) if early_eos else ()
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            stack.enter_context(hook)
        out = sample(policy, ids, mask, max_new_tokens=8, seed=5, lean=lean, interrupt=swap)
        under_old = full_forward_log_probs(old, ids, mask, out)
        under_new = full_forward_log_probs(new, ids, mask, out)
    valid = out.response_mask.bool()
    versions = out.token_versions
    assert bool((versions[:, :3][valid[:, :3]] == 0).all())
    assert bool((versions[:, 3:][valid[:, 3:]] == 1).all())
    assert bool((versions[~valid] == -1).all())
    assert bool(valid[:, 3:].any())  # some rows wrote past the swap
    if early_eos:
        assert int((valid.sum(-1) <= 3).sum()) >= 2  # and some had ended before it
    torch.testing.assert_close(out.log_probs[:, :3], under_old[:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.log_probs[:, 3:], under_new[:, 3:], atol=1e-5, rtol=1e-5)
    assert (under_old[:, 3:] - under_new[:, 3:]).abs().max() > 1e-2  # the swap mattered
