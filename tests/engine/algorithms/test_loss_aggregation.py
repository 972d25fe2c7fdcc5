"""agg_loss over a global batch (verl 0.7's normalisation) against hand-computed values.

A mini-batch of three rows is split into micro-batches {row 0} and {rows 1, 2}; the shares
computed with the mini-batch's counts must add up to the loss of the whole mini-batch.
"""

import pytest
import torch

from engine.algorithms.loss_aggregation import GlobalBatch, agg_loss
from engine.algorithms.names import LOSS_AGG_MODES
from engine.algorithms.policy_loss.base import PolicyLossInputs
from engine.algorithms.policy_loss.vanilla import compute_policy_loss_vanilla
from engine.config import ActorConfig

# Row 0: 2 tokens summing to 3; row 1: 1 token (4); row 2: 3 tokens summing to 6.
LOSS = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0], [1.0, 2.0, 3.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
WHOLE = GlobalBatch(tokens=6, sequences=3)
SPLITS = ([0], [1, 2])

# Hand-computed losses of the whole mini-batch.
EXPECTED = {
    "token-mean": (3 + 4 + 6) / 6,
    "seq-mean-token-sum": (3 + 4 + 6) / 3,
    "seq-mean-token-mean": (3 / 2 + 4 / 1 + 6 / 3) / 3,
    "seq-mean-token-sum-norm": (3 + 4 + 6) / 3,  # divided by the response length 3
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_the_whole_mini_batch_aggregates_to_the_hand_computed_value(mode):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(EXPECTED[mode])
    assert agg_loss(LOSS, MASK, mode, WHOLE).item() == pytest.approx(EXPECTED[mode])


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_shares_add_up_to_the_mini_batch_loss(mode):
    shares = [agg_loss(LOSS[rows], MASK[rows], mode, WHOLE).item() for rows in SPLITS]
    assert sum(shares) == pytest.approx(EXPECTED[mode])
    # Row 0 alone: its token sum over the mini-batch's count, not over its own two tokens.
    first = {"token-mean": 3 / 6, "seq-mean-token-sum": 3 / 3, "seq-mean-token-mean": 1.5 / 3}
    if mode in first:
        assert shares[0] == pytest.approx(first[mode])


@pytest.mark.parametrize("mode", [m for m in LOSS_AGG_MODES if m != "seq-mean-token-sum-norm"])
def test_dp_size_turns_the_ranks_average_into_a_sum(mode):
    # Two ranks hold rows {0} and {1, 2}; FSDP averages their gradients over 2 ranks.
    two = GlobalBatch(tokens=6, sequences=3, dp_size=2)
    per_rank = [agg_loss(LOSS[rows], MASK[rows], mode, two).item() for rows in SPLITS]
    assert sum(per_rank) / 2 == pytest.approx(EXPECTED[mode])


def test_seq_mean_token_sum_norm_leaves_dp_size_out_as_verl_unless_asked():
    mode = "seq-mean-token-sum-norm"
    verls = GlobalBatch(tokens=6, sequences=3, dp_size=2)
    per_rank = [agg_loss(LOSS[rows], MASK[rows], mode, verls).item() for rows in SPLITS]
    # verl's agg_loss: each rank's token sum over L; FSDP's average over 2 ranks halves it.
    assert per_rank == pytest.approx([_verl_agg_loss(LOSS[r], MASK[r], mode, 2) for r in SPLITS])
    assert sum(per_rank) / 2 == pytest.approx(EXPECTED[mode] / 2)
    ours = GlobalBatch(tokens=6, sequences=3, dp_size=2, norm_times_dp=True)
    per_rank = [agg_loss(LOSS[rows], MASK[rows], mode, ours).item() for rows in SPLITS]
    assert sum(per_rank) / 2 == pytest.approx(EXPECTED[mode])  # the same as on one rank


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_every_mode_equals_verls_agg_loss_with_the_global_batch(mode):
    two = GlobalBatch(tokens=6, sequences=3, dp_size=2)
    for rows in SPLITS:
        ours = agg_loss(LOSS[rows], MASK[rows], mode, two).item()
        assert ours == pytest.approx(_verl_agg_loss(LOSS[rows], MASK[rows], mode, 2, 6, 3))


# verl's agg_loss, volcengine/verl verl/trainer/ppo/core_algos.py (commit b178a3cd, January
# 2026; Apache-2.0, Bytedance Ltd.), with verl_F.masked_sum inlined. Used for parity only.
def _verl_agg_loss(
    loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None,
    global_batch_size=None, loss_scale_factor=None,
):  # fmt: skip
    masked_sum = lambda v, m: (torch.where(m.bool(), v, 0.0) * m).sum()  # noqa: E731
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        loss = masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    elif loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)  # token-sum
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)  # per-sequence token count
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)  # token-mean
        seq_mask = (seq_mask > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        if loss_scale_factor is None:
            loss_scale_factor = loss_mask.shape[-1]
        loss = torch.sum(seq_losses) / loss_scale_factor
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss.item()


def test_loss_scale_factor_is_the_constant_divisor_of_seq_mean_token_sum_norm():
    batch = GlobalBatch(tokens=6, sequences=3, loss_scale_factor=13)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", batch).item() == pytest.approx(1.0)
    # It changes nothing for the other modes.
    assert agg_loss(LOSS, MASK, "token-mean", batch).item() == pytest.approx(13 / 6)


def test_a_masked_nan_never_contributes_and_an_empty_batch_gives_zero():
    loss = LOSS.clone()
    loss[0, 2] = float("nan")
    assert agg_loss(loss, MASK, "token-mean", WHOLE).item() == pytest.approx(13 / 6)
    empty = GlobalBatch(tokens=0, sequences=0)
    for mode in LOSS_AGG_MODES:
        assert agg_loss(LOSS, torch.zeros_like(MASK), mode, empty).item() == 0.0


def test_the_global_batch_reaches_the_agg_loss_inside_a_policy_loss():
    old = torch.zeros(3, 3)
    adv = torch.ones(3, 3)
    config = ActorConfig()
    # On-policy ratio 1: the vanilla loss is -A = -1 per token.
    local, _ = compute_policy_loss_vanilla(
        PolicyLossInputs(old, old.clone(), adv, MASK[:, :3]), config
    )
    whole = GlobalBatch(tokens=12, sequences=3, dp_size=1)
    share, _ = compute_policy_loss_vanilla(
        PolicyLossInputs(old, old.clone(), adv, MASK, global_batch=whole), config
    )
    assert local.item() == pytest.approx(-1.0)
    assert share.item() == pytest.approx(-6 / 12)
    # Without a global batch the aggregation is local again.
    again, _ = compute_policy_loss_vanilla(PolicyLossInputs(old, old.clone(), adv, MASK), config)
    assert again.item() == pytest.approx(-1.0)


def test_an_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="Unknown loss_agg_mode 'mean'; valid modes are: token"):
        agg_loss(LOSS, MASK, "mean", WHOLE)
