"""verl main's rejection-sampling options (verl PR #4544): the mask and every metric equal those of
a copy of verl's helper on random inputs, hand-computed cases, and 0.7's levels as k1 bounds."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algorithms.names import ROLLOUT_RS_OPTIONS, parse_rejection_options
from engine.algorithms.rollout_correction import (
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_rejection_mask,
)
from tests.third_party.verl import rollout_rs_main as verl

THRESHOLDS = {"k1": "0.9_1.1", "k2": 0.02, "k3": "0.015"}
SUM_THRESHOLDS = {"k1": "0.4_2.5", "k2": 0.15, "k3": "0.15"}  # a row's sum over up to 9 tokens


def _threshold(name: str) -> float | str:
    return (SUM_THRESHOLDS if name.startswith("seq_sum") else THRESHOLDS)[name[-2:]]


def _hidden_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return log ratios (6, 9) around 0, a spread per row, and a right-padded mask with one empty
    row."""
    generator = torch.Generator().manual_seed(seed)
    spread = torch.tensor([[0.02], [0.5], [0.1], [0.3], [0.05], [0.6]], dtype=torch.float64)
    log_ratio = spread * torch.randn(6, 9, generator=generator, dtype=torch.float64)
    lengths = torch.tensor([9, 7, 1, 0, 9, 4])
    mask = (torch.arange(9) < lengths.unsqueeze(-1)).double()  # (6, 9)
    log_ratio[mask == 0] = float("nan")  # padding must never count
    return log_ratio, mask


def test_the_options_are_verls():
    assert set(ROLLOUT_RS_OPTIONS) == verl.SUPPORTED_ROLLOUT_RS_OPTIONS


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "rollout_rs",
    [*ROLLOUT_RS_OPTIONS, "token_k1,seq_max_k3", "seq_mean_k1,token_k2,seq_sum_k3,token_k2"],
)
def test_each_option_equals_verls_helper(rollout_rs, seed):
    log_ratio, mask = _hidden_inputs(seed)
    names = list(dict.fromkeys(rollout_rs.split(",")))
    threshold = ",".join(str(_threshold(name)) for name in names)
    if len(names) == 1:
        threshold = _threshold(names[0])
    ours, ours_metrics = compute_rollout_rejection_mask(log_ratio, mask, rollout_rs, threshold)
    theirs, their_metrics = verl.compute_rollout_rejection_mask(
        log_ratio, mask, rollout_rs, threshold
    )
    assert torch.equal(ours, theirs)
    assert ours.dtype == mask.dtype
    assert ours_metrics.keys() == their_metrics.keys()
    for key, value in their_metrics.items():
        assert ours_metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    assert 0 < ours.sum() < mask.sum()  # the bounds bite on these inputs


@pytest.mark.parametrize("threshold", [1.25, "1.25", "0.5_1.1"])
def test_a_k1_threshold_is_a_ratio_pair_or_one_upper_bound(threshold):
    [option] = parse_rejection_options("token_k1", threshold)
    expected = verl._parse_rollout_rs_thresholds(["token_k1"], threshold)["token_k1"]
    assert (option.lower, option.upper) == (expected["lower"], expected["upper"])


def test_token_k1_keeps_a_token_whose_minus_log_ratio_is_inside_the_log_bounds():
    # k1 = -log rho: with "0.5_2" a token is kept for rho in [1/2, 2].
    ratios = torch.tensor([[1.0, 1.9, 2.1, 0.45]])
    mask, m = compute_rollout_rejection_mask(
        torch.log(ratios), torch.ones(1, 4), "token_k1", "0.5_2"
    )
    assert mask.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(0.5)
    assert m["rollout_rs_seq_masked_fraction"] == 1.0


def test_seq_max_k2_rejects_a_whole_row_by_its_worst_token():
    log_ratio = torch.tensor([[0.1, -0.1, 0.0], [0.0, 0.3, 0.0]])  # k2: 0.005 ... 0.045
    mask, m = compute_rollout_rejection_mask(log_ratio, torch.ones(2, 3), "seq_max_k2", 0.01)
    assert mask.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert m["rollout_rs_seq_max_k2_max"] == pytest.approx(0.045)
    assert m["rollout_rs_masked_fraction"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("level", "main"),
    [("token", "token_k1"), ("sequence", "seq_sum_k1"), ("geometric", "seq_mean_k1")],
)
def test_verl_0_7s_levels_are_main_k1_options_with_inverted_bounds(level, main):
    log_ratio, mask = _hidden_inputs(5)
    upper, lower = 1.2, 0.9
    old, _ = compute_rollout_rejection_mask(log_ratio, mask, level, upper, lower)
    new, _ = compute_rollout_rejection_mask(log_ratio, mask, main, f"{1 / upper}_{1 / lower}")
    assert torch.equal(old, new)


@pytest.mark.parametrize(
    ("rollout_rs", "threshold", "message"),
    [
        ("token_k4", 1.0, "not one of"),
        ("token_k2", "0.1_0.2", "upper bound only"),
        ("token_k1", "a_2", "lower_upper"),
        ("token_k1,token_k2", "1,2,3", "3 thresholds for 2"),
        ("seq_sum_k3", -1.0, "must be positive"),
        ("seq_sum_k3", None, "must be set"),
    ],
)
def test_a_bad_option_or_threshold_is_an_error_that_says_what_to_write(
    rollout_rs, threshold, message
):
    with pytest.raises(ValueError, match=message):
        parse_rejection_options(rollout_rs, threshold)


def test_the_threshold_lower_of_0_7_is_refused_with_main_options():
    log_ratio, mask = _hidden_inputs(0)
    with pytest.raises(ValueError, match="'lower_upper'"):
        compute_rollout_rejection_mask(log_ratio, mask, "token_k1", 2.0, 0.5)


def test_the_pipeline_carries_main_options_under_rollout_corr():
    log_ratio, mask = _hidden_inputs(3)
    old = torch.zeros_like(log_ratio)
    rollout = torch.where(mask.bool(), -log_ratio, torch.zeros_like(log_ratio))
    weights, kept, m = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.02
    )
    expected, _ = verl.compute_rollout_rejection_mask(
        torch.where(mask.bool(), log_ratio, 0.0), mask, "seq_mean_k3", 0.02
    )
    assert weights is None and torch.equal(kept, expected)
    assert math.isfinite(m["rollout_corr/rollout_rs_seq_mean_k3_mean"])
