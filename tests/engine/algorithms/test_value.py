"""The critic's clipped value loss and the entropy loss on hand-computed 2x3 inputs."""

import math

import pytest
import torch

from engine.algorithms.value import compute_entropy_loss, compute_value_loss

VPREDS = torch.tensor([[1.0, 2.0, 0.0], [0.5, 3.0, 7.0]])
VALUES = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
RETURNS = torch.tensor([[1.0, 1.0, 0.5], [1.0, 2.5, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_value_loss_keeps_the_larger_clipped_error():
    vf_loss, vf_clipfrac = compute_value_loss(VPREDS, RETURNS, VALUES, MASK, cliprange_value=0.5)
    # per token max(unclipped, clipped) errors: 0.25 (clip to 1.5 bites), 1, 0.25, 0.25, 0.25
    assert vf_loss.item() == pytest.approx(0.5 * 2.0 / 5)
    assert vf_clipfrac.item() == pytest.approx(1 / 5)


def test_value_loss_ignores_masked_tokens_and_honours_agg_mode():
    moved = VPREDS.clone()
    moved[1, 2] = 1e6
    vf_loss, _ = compute_value_loss(moved, RETURNS, VALUES, MASK, cliprange_value=0.5)
    assert vf_loss.item() == pytest.approx(0.2)
    seq_mean, _ = compute_value_loss(
        VPREDS, RETURNS, VALUES, MASK, 0.5, loss_agg_mode="seq-mean-token-mean"
    )
    assert seq_mean.item() == pytest.approx(0.5 * (1.5 / 3 + 0.5 / 2) / 2)


def test_value_loss_names_mismatched_shapes():
    with pytest.raises(ValueError, match=r"returns has shape \(2, 2\)"):
        compute_value_loss(VPREDS, RETURNS[:, :2], VALUES, MASK, cliprange_value=0.5)


def test_entropy_loss_hand_values():
    logits = torch.tensor([[[0.0, 0.0], [100.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert compute_entropy_loss(logits, mask).item() == pytest.approx(2 * math.log(2) / 3)
    by_seq = compute_entropy_loss(logits, mask, loss_agg_mode="seq-mean-token-mean")
    assert by_seq.item() == pytest.approx((math.log(2) / 2 + math.log(2)) / 2)
    with pytest.raises(
        ValueError, match=r"logits has shape \(2, 2, 2\) and response_mask has shape \(2, 3\)"
    ):
        compute_entropy_loss(logits, torch.ones(2, 3))
