"""Each token's sum of squared probabilities (the optimal token baselines' input), as the actor's
old-log-prob pass computes it: equal to a full fp64 softmax, chunked or not, in batch order
under dynamic batch sizes and packing (CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.algorithms import torch_functional
from engine.algorithms.torch_functional import sum_pi_squared_from_logits
from engine.config.schema import PPOConfig
from engine.roles.actor import PolicyActor, response_logits
from tests.engine.distributed.helpers import tiny_policy, update_batch

VOCAB = 40


def direct(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The reference: the whole vocabulary's softmax at once, squared and summed."""
    return (torch.softmax(logits.double() / temperature, dim=-1) ** 2).sum(dim=-1)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("chunk", [None, 7 * 50, 1])  # one chunk; 7 rows each; a row each
def test_sum_pi_squared_equals_a_full_softmax(monkeypatch, temperature, chunk):
    if chunk is not None:
        monkeypatch.setattr(torch_functional, "_CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 9, 50, generator=g, dtype=torch.float64) * 4  # (bs, L, V)
    logits[0, 0] = 0.0  # uniform: 1 / V
    logits[0, 1, 3] = 1e4  # one token takes everything: 1
    got = sum_pi_squared_from_logits(logits / temperature)
    assert got.shape == (5, 9) and got.dtype == torch.float64
    torch.testing.assert_close(got, direct(logits, temperature), rtol=1e-12, atol=1e-15)
    assert got[0, 0].item() == pytest.approx(1 / 50, rel=1e-12)
    assert got[0, 1].item() == pytest.approx(1.0, rel=1e-12)
    # A non-contiguous slice (the response positions of prompt + response logits) and fp32.
    sliced = logits[:, 2:-1]
    torch.testing.assert_close(sum_pi_squared_from_logits(sliced), direct(sliced))
    torch.testing.assert_close(
        sum_pi_squared_from_logits(logits.float()), direct(logits).float(), rtol=1e-5, atol=1e-7
    )


def test_sum_pi_squared_stays_within_one_chunk_of_memory(monkeypatch):
    """Every full-vocabulary temporary is one chunk's rows, never the whole tensor's."""
    monkeypatch.setattr(torch_functional, "_CHUNK_ELEMENTS", 3 * 50)
    seen: list[tuple[int, ...]] = []
    logsumexp = torch.logsumexp

    def spy(x, dim, *args, **kwargs):
        seen.append(tuple(x.shape))
        return logsumexp(x, dim, *args, **kwargs)

    monkeypatch.setattr(torch, "logsumexp", spy)
    logits = torch.randn(4, 6, 50, dtype=torch.float64)
    sum_pi_squared_from_logits(logits)
    assert seen and all(shape[0] <= 3 and len(shape) == 2 for shape in seen), seen


def actor_config():
    cfg = copy.deepcopy(PPOConfig().actor_rollout_ref.actor)
    cfg.clip_ratio_low = cfg.clip_ratio_high = 0.2
    return cfg


@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("rows, budget", [(7, None), (2, None), (7, 12), (7, 10)])
def test_the_old_log_prob_pass_returns_sum_pi_squared_in_batch_order(remove_padding, rows, budget):
    lengths = [1, 6, 3, 6, 2, 5, 4]  # different lengths: a token budget reorders the rows
    batch = update_batch(len(lengths), 4, lengths, VOCAB)
    model = tiny_policy(VOCAB, seed=1).double()
    with torch.no_grad():  # peaked distributions, far from uniform (the embeddings are tied)
        model.lm_head.weight.mul_(6)
    actor = PolicyActor(model, actor_config(), remove_padding=remove_padding)
    temperature = 0.7
    stats = actor.compute_token_stats(
        batch,
        micro_batch_size=rows,
        temperature=temperature,
        with_entropy=True,
        with_sum_pi_squared=True,
        max_token_len=budget,
    )
    assert set(stats) == {"log_probs", "entropys", "sum_pi_squared"}
    mask = batch.batch["response_mask"].bool()
    with torch.no_grad():  # one padded forward over the whole batch, untempered logits
        logits = response_logits(model, batch.batch, lean=False)
    expected = direct(logits, temperature)
    got = stats["sum_pi_squared"]
    assert got.shape == mask.shape and got.dtype == torch.float64
    torch.testing.assert_close(got[mask], expected[mask], rtol=1e-9, atol=1e-12)
    # The distributions are far from uniform and differ token to token: order matters.
    assert got[mask].std() > 0.02 and (got[mask] > 1 / VOCAB).all()
    # The log-probs come from the same forward: the plain compute_log_prob agrees.
    log_probs, entropy = actor.compute_log_prob(
        batch,
        micro_batch_size=rows,
        temperature=temperature,
        with_entropy=True,
        max_token_len=budget,
    )
    torch.testing.assert_close(stats["log_probs"], log_probs, rtol=0, atol=0)
    torch.testing.assert_close(stats["entropys"], entropy, rtol=0, atol=0)


def test_sum_pi_squared_is_computed_only_when_asked_for():
    batch = update_batch(3, 4, [2, 3, 1], VOCAB)
    actor = PolicyActor(tiny_policy(VOCAB, seed=1).double(), actor_config())
    stats = actor.compute_token_stats(
        batch, micro_batch_size=3, temperature=1.0, with_entropy=False
    )
    assert set(stats) == {"log_probs"}
