"""The actor's response forward: shared prompts, length buckets and trimmed padding (CPU)."""

from __future__ import annotations

import pytest
import torch

from engine.roles.actor import response_logits
from engine.roles.seqlen_balancing import length_buckets
from engine.rollout.sampling import shared_prompts, trim_left_padding
from tests.engine.distributed.helpers import tiny_policy
from tests.engine.rollout.test_sampling import PAD, sample


@pytest.fixture(scope="module")
def model():
    return tiny_policy(40)  # a random two-layer Qwen2, seed 0


def group_batch(model, n: int = 4, max_new_tokens: int = 12, cut: bool = False) -> dict:
    """Return a rollout batch of 3 prompts x n samples (left padded) as the actor receives it.

    With ``cut`` every other response ends after two tokens, so lengths differ enough for the
    forward to run the rows in two buckets.
    """
    ids = torch.randint(5, 40, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = PAD, 0
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    model.eval()
    out = sample(model, ids, mask, max_new_tokens=max_new_tokens, seed=3)
    responses, response_mask = out.responses, out.response_mask
    if cut:
        response_mask = response_mask.clone()
        response_mask[::2, 2:] = 0
        responses = responses.masked_fill(response_mask == 0, PAD)
    attention_mask = torch.cat([mask, response_mask], dim=1)
    return {
        "input_ids": torch.cat([ids, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": response_mask,
    }


def full_forward_logits(model, batch) -> torch.Tensor:
    """The reference: one forward over prompt + response, the response-predicting positions."""
    response_length = batch["responses"].shape[1]
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    ).logits
    return logits[:, -response_length - 1 : -1].float()


def test_shared_prompts_find_each_distinct_prompt_once():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [7, 8, 9]])
    mask = (ids != 0).long()
    first, inverse = shared_prompts(ids, mask)
    assert sorted(first.tolist()) == [0, 2]
    assert torch.equal(ids[first][inverse], ids)
    assert shared_prompts(ids[1:3], mask[1:3]) is None  # all distinct: nothing to share


def test_trim_left_padding_drops_only_columns_padded_in_every_row():
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    ids = torch.arange(8).view(2, 4)
    trimmed, trimmed_mask, _ = trim_left_padding(ids, mask, ids)
    assert trimmed.tolist() == [[1, 2, 3], [5, 6, 7]] and trimmed_mask.tolist() == [
        [0, 1, 1],
        [1, 1, 1],
    ]


def test_length_buckets_cover_every_row_once_and_never_cut_a_response():
    lengths = torch.tensor([30] * 20 + [57] * 12)[torch.randperm(32)]
    buckets = length_buckets(lengths, 60)
    rows = torch.cat([r for r, _ in buckets])
    assert sorted(rows.tolist()) == list(range(32))
    assert all(int(lengths[r].max()) <= longest for r, longest in buckets)
    assert sum(len(r) * longest for r, longest in buckets) == 20 * 30 + 12 * 57
    # A token or two saved per row is not worth a second forward call.
    ((rows, longest),) = length_buckets(torch.tensor([3, 4, 4, 3]), 4)
    assert rows.tolist() == [0, 1, 2, 3] and longest == 4


@pytest.mark.parametrize(
    "lengths, count",
    [
        ([5, 80, 7, 81, 40, 6], 3),  # the cheapest split into three
        ([9, 9, 9, 9], 3),  # one length: rows share out over the buckets
        ([3, 70, 3, 70, 3], 4),  # two lengths, four buckets
        ([12, 50], 1),
    ],
)
def test_length_buckets_split_into_exactly_the_count_asked(lengths, count):
    lengths = torch.tensor(lengths)
    buckets = length_buckets(lengths, 90, count=count)
    assert len(buckets) == count
    rows = torch.cat([r for r, _ in buckets])
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    assert all(len(r) and int(lengths[r].max()) == longest for r, longest in buckets)
    if count == 3 and len(set(lengths.tolist())) > 3:  # the short, middle and long rows
        assert [sorted(lengths[r].tolist()) for r, _ in buckets] == [[5, 6, 7], [40], [80, 81]]


def test_length_buckets_refuse_a_count_the_rows_cannot_fill():
    with pytest.raises(ValueError, match="cannot split 6 rows into exactly 7"):
        length_buckets(torch.arange(6) + 1, 90, count=7)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "module"])
@pytest.mark.parametrize("n, cut", [(1, False), (4, False), (1, True), (4, True)])
def test_response_logits_equal_one_full_forward_on_every_response_token(model, n, cut, lean):
    batch = group_batch(model, n=n, cut=cut)
    lengths = batch["response_mask"].sum(-1)
    assert len(length_buckets(lengths, batch["responses"].shape[1])) == (2 if cut else 1)
    mask = batch["response_mask"].bool()
    model.eval()
    with torch.no_grad():
        expected = full_forward_logits(model, batch)
        got = response_logits(model, batch, lean=lean)
    assert got.shape == expected.shape
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got).all()  # positions past a response are masked by every loss


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "module"])
def test_the_plan_ranks_agree_on_gives_the_same_logits(model, lean):
    """``uniform_calls`` on one process: the plan of a rank alone, one-token responses grown to
    two so each shared-prompt bucket makes a call, gives the full forward's logits."""
    batch = group_batch(model, n=4, cut=True)
    batch["response_mask"][1::4, 1:] = 0  # some responses end after their first token
    batch["attention_mask"][:, -batch["responses"].shape[1] :] = batch["response_mask"]
    mask = batch["response_mask"].bool()
    model.eval()
    with torch.no_grad():
        expected = full_forward_logits(model, batch)
        got = response_logits(model, batch, lean=lean, uniform_calls=True)
        one_call = response_logits(model, batch, lean=lean, max_buckets=1)
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one_call[mask], expected[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "module"])
@pytest.mark.parametrize("n, cut", [(1, True), (4, False), (4, True)])
def test_response_logits_give_the_gradient_of_the_full_forward(model, n, cut, lean):
    batch = group_batch(model, n=n, cut=cut)
    mask = batch["response_mask"]
    model.train()

    def grads(logits_fn) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logits = logits_fn()
        log_probs = torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None])
        (log_probs.squeeze(-1) * mask).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    expected = grads(lambda: full_forward_logits(model, batch))
    got = grads(lambda: response_logits(model, batch, lean=lean))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)
