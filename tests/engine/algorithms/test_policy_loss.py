"""Policy losses and loss aggregation against hand-computed values, and their clipping properties."""

import math
from types import SimpleNamespace

import pytest
import torch

from engine.algorithms.loss_aggregation import GlobalBatch, agg_loss
from engine.algorithms.policy_loss.base import (
    POLICY_LOSS_REGISTRY,
    PolicyLossInputs,
    get_policy_loss_fn,
)
from engine.algorithms.policy_loss.cispo import compute_policy_loss_cispo
from engine.algorithms.policy_loss.covariance import (
    compute_policy_loss_clip_cov,
    compute_policy_loss_kl_cov,
)
from engine.algorithms.policy_loss.geo_mean import compute_policy_loss_geo_mean
from engine.algorithms.policy_loss.gpg import compute_policy_loss_gpg
from engine.algorithms.policy_loss.gspo import compute_policy_loss_gspo
from engine.algorithms.policy_loss.sapo import compute_policy_loss_sapo
from engine.algorithms.policy_loss.vanilla import compute_policy_loss_vanilla
from engine.config.actor import ActorConfig, PolicyLossConfig

# Ratios 1, 1.5, 0.5 with A = +1; ratios 1.1, 4, 0.5 with A = -1, -1, +1 (last token masked).
RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.1, 4.0, 0.5]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = torch.zeros(2, 3)
ACTOR = ActorConfig()  # verl's defaults: clip_ratio 0.2, clip_ratio_c 3, tau_pos 1, tau_neg 1.05


def test_vanilla_ppo_hand_values():
    loss, metrics = compute_policy_loss_vanilla(
        PolicyLossInputs(OLD, RATIOS.log(), ADV, MASK), ACTOR
    )
    # per token: -1, -1.2 (clipped), -0.5, 1.1, 3 (dual clip of 4).
    assert loss.item() == pytest.approx((-1 - 1.2 - 0.5 + 1.1 + 3) / 5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 5)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)
    log_ratios = [0, math.log(1.5), math.log(0.5), math.log(1.1), math.log(4)]
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(log_ratios) / 5)


def test_vanilla_asymmetric_clip_range():
    loss, _ = compute_policy_loss_vanilla(
        PolicyLossInputs(
            torch.zeros(1, 1), torch.tensor([[math.log(1.5)]]), torch.ones(1, 1), torch.ones(1, 1)
        ),
        ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28),
    )
    assert loss.item() == pytest.approx(-1.28)


def test_vanilla_gradient_vanishes_exactly_where_the_clip_bites():
    log_prob = RATIOS.log().requires_grad_()
    loss, _ = compute_policy_loss_vanilla(PolicyLossInputs(OLD, log_prob, ADV, MASK), ACTOR)
    loss.backward()
    # d(-A r)/d logp = -A r, divided by 5 valid tokens; clipped and dual-clipped tokens get 0.
    expected = torch.tensor([[-1.0, 0.0, -0.5], [1.1, 0.0, 0.0]]) / 5
    torch.testing.assert_close(log_prob.grad, expected)


def test_clipping_bounds_hold_for_extreme_ratios():
    ones = torch.ones(1, 4)
    log_prob = torch.tensor([[30.0, -30.0, 30.0, -30.0]])  # ratios clamp to exp(+-20)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, _ = compute_policy_loss_vanilla(
        PolicyLossInputs(torch.zeros(1, 4), log_prob, adv, ones, "seq-mean-token-sum"), ACTOR
    )
    # A>0: -1.2 and -exp(-20); A<0: dual clip caps at 3; tiny ratio gives 0.8.
    assert loss.item() == pytest.approx(-1.2 - math.exp(-20) + 3.0 + 0.8)


def test_dual_clip_only_bites_when_advantage_is_negative():
    log_prob = torch.tensor([[math.log(5.0), math.log(5.0)]])
    positive = torch.ones(1, 2)
    for c in (1.01, 3.0, 100.0):
        loss, metrics = compute_policy_loss_vanilla(
            PolicyLossInputs(torch.zeros(1, 2), log_prob, positive, torch.ones(1, 2)),
            ActorConfig(clip_ratio_c=c),
        )
        assert loss.item() == pytest.approx(-1.2) and metrics["actor/pg_clipfrac_lower"] == 0
    loss, metrics = compute_policy_loss_vanilla(
        PolicyLossInputs(torch.zeros(1, 2), log_prob, -positive, torch.ones(1, 2)),
        ActorConfig(clip_ratio_c=3.0),
    )
    assert loss.item() == pytest.approx(3.0) and metrics["actor/pg_clipfrac_lower"] == 1.0


def test_vanilla_rejects_clip_ratio_c_not_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c must be greater than 1.0.*got 1.0"):
        compute_policy_loss_vanilla(
            PolicyLossInputs(OLD, OLD, ADV, MASK), ActorConfig(clip_ratio_c=1.0)
        )


def test_masked_token_never_contributes_to_any_loss():
    poisoned = RATIOS.log().clone()
    poisoned[1, 2] = float("nan")
    for name, fn in POLICY_LOSS_REGISTRY.items():
        clean, _ = fn(PolicyLossInputs(OLD, RATIOS.log(), ADV, MASK), ACTOR)
        dirty, _ = fn(PolicyLossInputs(OLD, poisoned, ADV, MASK), ACTOR)
        assert dirty.item() == pytest.approx(clean.item()), name


def test_gspo_clips_a_sequence_level_ratio():
    log_prob = torch.tensor([[0.1, 0.2, 0.3], [-0.1, -0.3, 5.0]], requires_grad=True)
    paper = ActorConfig(clip_ratio_low=3e-4, clip_ratio_high=4e-4)  # GSPO's clip ranges
    inputs = PolicyLossInputs(OLD, log_prob, ADV, MASK, "seq-mean-token-mean")
    loss, metrics = compute_policy_loss_gspo(inputs, paper)
    # s = exp(0.2) clipped to 1 + 4e-4 (A=+1); s = exp(-0.2) clipped to 1 - 3e-4 (A=-1).
    assert loss.item() == pytest.approx((-(1 + 4e-4) + (1 - 3e-4)) / 2, abs=1e-7)
    assert metrics == pytest.approx(
        {"actor/pg_clipfrac": 1.0, "actor/ppo_kl": -0.2 / 5, "actor/pg_clipfrac_lower": 0.0}
    )
    wide, _ = compute_policy_loss_gspo(inputs, ActorConfig(clip_ratio_low=10, clip_ratio_high=10))
    wide.backward()
    # Each token's gradient is -A * s_i / (|y_i| * 2 sequences): the stop-gradient trick.
    expected = torch.tensor([[-math.exp(0.2) / 6] * 3, [math.exp(-0.2) / 4] * 2 + [0.0]])
    torch.testing.assert_close(log_prob.grad, expected)


def test_gpg_is_plain_policy_gradient():
    log_prob = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -9.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    loss, metrics = compute_policy_loss_gpg(PolicyLossInputs(OLD, log_prob, adv, MASK), ACTOR)
    assert loss.item() == pytest.approx(9 / 5) and metrics == {}


def test_cispo_detaches_the_clipped_weight():
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = log_prob.detach() - torch.tensor([[math.log(1.5), math.log(0.9)]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, metrics = compute_policy_loss_cispo(
        PolicyLossInputs(old, log_prob, adv, torch.ones(1, 2)), ACTOR
    )
    # weights 1.2 (clipped from 1.5) and 0.9: (1.2 * 1 - 0.9 * 2) / 2
    assert loss.item() == pytest.approx(-0.3)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.6, 0.45]]))


# Covariance (A - mean A)(logp - mean logp) is 3 at (0, 0), 0 at (0, 1) and (1, 0), -3 at (1, 1).
COV_ADV = torch.tensor([[3.0, 0.0], [0.0, -3.0]])
COV_LOGP = torch.tensor([[-1.0, -3.0], [-3.0, -1.0]])


def test_clip_cov_detaches_the_high_covariance_token():
    log_prob = COV_LOGP.clone().requires_grad_()
    loss, metrics = compute_policy_loss_clip_cov(
        PolicyLossInputs(COV_LOGP, log_prob, COV_ADV, torch.ones(2, 2)), ACTOR
    )
    assert loss.item() == pytest.approx(3 / 4)  # -3 at (0, 0) is dropped; 3 at (1, 1) stays
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 4)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.0], [0.0, 0.75]]))
    kept, metrics = compute_policy_loss_clip_cov(
        PolicyLossInputs(COV_LOGP, COV_LOGP, COV_ADV, torch.ones(2, 2)),
        ActorConfig(policy_loss=PolicyLossConfig(clip_cov_ub=2.0)),
    )
    assert kept.item() == pytest.approx(0.0) and metrics["actor/pg_clipfrac"] == 0.0


def test_kl_cov_penalises_the_top_covariance_token():
    old = COV_LOGP - torch.tensor([[0.5, 0.0], [0.0, 0.0]])
    inputs = PolicyLossInputs(old, COV_LOGP, COV_ADV, torch.ones(2, 2))
    loss, metrics = compute_policy_loss_kl_cov(inputs, ACTOR)
    assert loss.item() == pytest.approx((-3 * math.exp(0.5) + 0.1 * 0.5 + 3) / 4)
    assert metrics == pytest.approx({"actor/ppo_kl": 0.5 / 4})
    strong, _ = compute_policy_loss_kl_cov(
        inputs, ActorConfig(policy_loss=PolicyLossConfig(ppo_kl_coef=1.0))
    )
    assert strong.item() == pytest.approx((-3 * math.exp(0.5) + 0.5 + 3) / 4)


def test_cov_losses_reject_non_positive_ratios():
    with pytest.raises(ValueError, match="clip_cov_ratio must be greater than 0"):
        compute_policy_loss_clip_cov(
            PolicyLossInputs(OLD, OLD, ADV, MASK),
            ActorConfig(policy_loss=PolicyLossConfig(clip_cov_ratio=0.0)),
        )
    with pytest.raises(ValueError, match="kl_cov_ratio must be greater than 0"):
        compute_policy_loss_kl_cov(
            PolicyLossInputs(OLD, OLD, ADV, MASK),
            ActorConfig(policy_loss=PolicyLossConfig(kl_cov_ratio=0.0)),
        )


LOSS_MAT = torch.arange(1.0, 13.0).reshape(3, 4)
AGG_MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 21 / 5),  # (1 + 2 + 5 + 6 + 7) / 5
        ("seq-mean-token-sum", (3 + 18) / 2),  # the empty third sequence is left out
        ("seq-mean-token-mean", (1.5 + 6) / 2),
        ("seq-mean-token-sum-norm", 21 / 4),  # divided by the response length
    ],
)
def test_agg_loss_modes(mode, expected):
    assert agg_loss(LOSS_MAT, AGG_MASK, mode).item() == pytest.approx(expected)
    poisoned = torch.where(AGG_MASK.bool(), LOSS_MAT, torch.full_like(LOSS_MAT, float("inf")))
    assert agg_loss(poisoned, AGG_MASK, mode).item() == pytest.approx(expected)


def test_agg_loss_rejects_unknown_mode_and_shapes():
    with pytest.raises(
        ValueError, match="Unknown loss_agg_mode 'mean'; valid modes are: token-mean"
    ):
        agg_loss(LOSS_MAT, AGG_MASK, "mean")
    with pytest.raises(
        ValueError, match=r"loss_mat has shape \(3, 4\), loss_mask has shape \(3, 3\)"
    ):
        agg_loss(LOSS_MAT, AGG_MASK[:, :3], "token-mean")


def test_registry_lists_valid_loss_modes():
    assert set(POLICY_LOSS_REGISTRY) == {
        "vanilla",
        "gspo",
        "gpg",
        "cispo",
        "clip_cov",
        "kl_cov",
        "sapo",
        "geo_mean",
        "bypass_mode",
    }
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla
    with pytest.raises(
        ValueError,
        match="Unknown policy loss mode 'ppo'; valid loss modes are: bypass_mode, cispo, clip_cov",
    ):
        get_policy_loss_fn("ppo")


def test_every_loss_accepts_the_common_clip_keys():
    for fn in POLICY_LOSS_REGISTRY.values():
        loss, _ = fn(
            PolicyLossInputs(OLD, RATIOS.log(), ADV, MASK, loss_agg_mode="token-mean"),
            ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0),
        )
        assert torch.isfinite(loss)


def test_policy_losses_name_mismatched_shapes():
    with pytest.raises(ValueError, match=r"advantages has shape \(2, 2\)"):
        PolicyLossInputs(OLD, OLD, ADV[:, :2], MASK)


def test_sapo_hand_values_and_gate_gradient():
    """Inputs ``(2, 3)``: ratios 1, 1 (A = +1); 1, 2 (A = -1); the last token masked."""
    log_prob = torch.tensor([[0.0, 0.0, 0.0], [0.0, math.log(2.0), 7.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])  # (2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # (2, 3)
    loss, metrics = compute_policy_loss_sapo(
        PolicyLossInputs(OLD, log_prob, adv, mask), ActorConfig(tau_pos=1.0, tau_neg=2.0)
    )
    s = 1 / (1 + math.exp(-2.0))  # sigmoid(tau_neg * (2 - 1))
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau: row 0 (tau 1) f(1) = 2, 2, L = -2, -2, mean -2;
    # row 1 (tau 2) f(1) = 1, f(2) = 2 s, L = +1, +2 s, mean (1 + 2 s) / 2; then mean of rows.
    assert loss.item() == pytest.approx((-2 + (1 + 2 * s) / 2) / 2)
    # Nothing is clipped; the two clip fractions are there, 0, as verl reports them.
    assert metrics == pytest.approx(
        {
            "actor/pg_clipfrac": 0.0,
            "actor/ppo_kl": -math.log(2.0) / 4,
            "actor/pg_clipfrac_lower": 0.0,
        }
    )
    loss.backward()
    # dL/dlogp = -A f'(r) r / (tokens of the row * 2 rows); f'(1) = 1, f'(r) = 4 s' = 4 s (1 - s).
    expected = torch.tensor([[-0.25, -0.25, 0.0], [0.25, 4 * s * (1 - s) * 2 / 4, 0.0]])
    torch.testing.assert_close(log_prob.grad, expected)


def test_sapo_aggregates_by_sequence_whatever_loss_agg_mode_says():
    by_sequence, _ = compute_policy_loss_sapo(PolicyLossInputs(OLD, RATIOS.log(), ADV, MASK), ACTOR)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        inputs = PolicyLossInputs(OLD, RATIOS.log(), ADV, MASK, loss_agg_mode=mode)
        other, _ = compute_policy_loss_sapo(inputs, ACTOR)
        assert other.item() == pytest.approx(by_sequence.item()), mode


def test_sapo_rejects_a_temperature_not_above_zero():
    with pytest.raises(
        ValueError, match="tau_pos and tau_neg must be greater than 0, got 1.0 and 0"
    ):
        compute_policy_loss_sapo(PolicyLossInputs(OLD, OLD, ADV, MASK), ActorConfig(tau_neg=0))


def test_geo_mean_clips_log_ratios_on_the_advantage_side():
    """Inputs ``(2, 3)``; clip range 0.2 in log space; row 1's last token masked (log-ratio 9)."""
    log_prob = torch.tensor([[0.1, 0.5, -0.4], [0.5, -0.4, 9.0]], requires_grad=True)
    loss, metrics = compute_policy_loss_geo_mean(PolicyLossInputs(OLD, log_prob, ADV, MASK), ACTOR)
    # Row 0 (A = +1): min(d, clamp(d)) = 0.1, 0.2, -0.4, mean -0.1 / 3, L = -exp(-1/30).
    # Row 1 (A = -1): max(d, clamp(d)) = 0.5, -0.2, mean 0.15, L = +exp(0.15). Mean of rows.
    assert loss.item() == pytest.approx((math.exp(0.15) - math.exp(-1 / 30)) / 2)
    # Clamp changes 0.5, -0.4 in row 0 (A > 0) and 0.5, -0.4 in row 1 (A < 0), of 5 tokens.
    assert metrics == pytest.approx(
        {"actor/pg_clipfrac": 2 / 5, "actor/pg_clipfrac_lower": 2 / 5, "actor/ppo_kl": -0.3 / 5}
    )
    loss.backward()
    # dL/dd_t = -A_i R_i / (tokens of row i * 2 rows) where the min/max kept d itself, else 0.
    r0, r1 = math.exp(-1 / 30), math.exp(0.15)
    expected = torch.tensor([[-r0 / 6, 0.0, -r0 / 6], [r1 / 4, 0.0, 0.0]])
    torch.testing.assert_close(log_prob.grad, expected)


def test_geo_mean_averages_sequence_advantages():
    # Token advantages 1, 3 average to A = 2; ratios 1 give L = -2 for the one sequence.
    loss, _ = compute_policy_loss_geo_mean(
        PolicyLossInputs(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)
        ),
        ACTOR,
    )
    assert loss.item() == pytest.approx(-2.0)


GEO_GLOBAL = ActorConfig(policy_loss=PolicyLossConfig(geo_mean_global_batch=True))


@pytest.mark.parametrize(
    ("fn", "config"),
    [(compute_policy_loss_sapo, ACTOR), (compute_policy_loss_geo_mean, GEO_GLOBAL)],
)
def test_new_losses_sum_over_micro_batches_to_the_mini_batch_loss(fn, config):
    """A ``(6, 5)`` mini-batch split in micro-batches of 2 rows, normalised over all 6."""
    gen = torch.Generator().manual_seed(3)
    old, new, adv = torch.randn(3, 6, 5, generator=gen, dtype=torch.float64) * 0.3  # (6, 5)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).double()  # (6, 5)
    mask[:, 0] = 1
    whole, _ = fn(PolicyLossInputs(old, new, adv, mask), config)
    counts = GlobalBatch(tokens=mask.sum().item(), sequences=6.0)
    parts = [
        fn(
            PolicyLossInputs(
                old[i : i + 2], new[i : i + 2], adv[i : i + 2], mask[i : i + 2], global_batch=counts
            ),
            config,
        )[0]
        for i in (0, 2, 4)
    ]
    # The whole batch alone divides by 6 + 1e-8 sequences, hence rel, not exact.
    assert sum(p.item() for p in parts) == pytest.approx(whole.item(), rel=1e-8)


# --- Reference implementation: verl's SAPO and GMPO losses -------------------------------------
# Copied from volcengine/verl, verl/trainer/ppo/core_algos.py (commit b178a3cd, January 2026),
# compute_policy_loss_sapo and compute_policy_loss_geo_mean, with verl_F.masked_mean / agg_loss
# reduced to the local (no global batch) case they take here, the ActorConfig argument replaced
# by a namespace, and the unused rollout-correction weights left out. Used for parity only.


def _verl_masked_mean(values, mask):
    s = (torch.where(mask.bool(), values, torch.zeros_like(values)) * mask).sum()
    return s / (mask.sum() + 1e-8)


def _verl_agg_seq_mean_token_mean(loss_mat, loss_mask):
    seq_mask = torch.sum(loss_mask, dim=-1)
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
    seq_mask = (seq_mask > 0).float().to(loss_mat.dtype)
    return (seq_losses * seq_mask).sum() / seq_mask.sum()


def _verl_sapo(old_log_prob, log_prob, advantages, response_mask, config):
    tau_pos = torch.as_tensor(config.tau_pos, dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(config.tau_neg, dtype=advantages.dtype, device=advantages.device)

    def gate_function(x, tau):
        return torch.sigmoid(tau * (x - 1.0)) * (4.0 / tau)

    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    taus = torch.where(condition=advantages > 0, input=tau_pos, other=tau_neg)
    gates = gate_function(ratio, taus)
    pg_losses = -gates * advantages
    pg_loss = _verl_agg_seq_mean_token_mean(pg_losses, response_mask)
    pg_clipfrac = torch.tensor(0.0, device=pg_loss.device)
    pg_clipfrac_lower = torch.tensor(0.0, device=pg_loss.device)
    ppo_kl = _verl_masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }


def _verl_geo_mean(old_log_prob, log_prob, advantages, response_mask, config):
    clip_ratio = config.clip_ratio
    cliprange_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    cliprange_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    negative_approx_kl = log_prob - old_log_prob
    ppo_kl = _verl_masked_mean(-negative_approx_kl, response_mask)
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -cliprange_low, cliprange_high)
    negative_approx_kl_min = torch.min(
        sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp
    )
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp(
        (negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    )
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    pg_losses = -advantage * ratio
    pg_loss = torch.mean(pg_losses)
    clipped = torch.ne(negative_approx_kl, negative_approx_kl_clamp)
    pg_clipfrac = _verl_masked_mean((clipped * (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = _verl_masked_mean((clipped * (advantages < 0)).float(), response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }


# --- End of reference implementation ----------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("ours", "reference", "keys"),
    [
        (compute_policy_loss_sapo, _verl_sapo, {"tau_pos": 1.0, "tau_neg": 1.05}),
        (compute_policy_loss_sapo, _verl_sapo, {"tau_pos": 0.5, "tau_neg": 3.0}),
        (compute_policy_loss_geo_mean, _verl_geo_mean, {"clip_ratio": 0.2}),
        (
            compute_policy_loss_geo_mean,
            _verl_geo_mean,
            {"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.4},
        ),
    ],
)
def test_new_losses_match_verl_on_random_batches(ours, reference, keys, seed):
    """Random ``(8, 16)`` inputs; every row keeps at least its first token."""
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(8, 16, generator=gen, dtype=torch.float64) * 0.5 - 2  # (8, 16)
    new = (old + torch.randn(8, 16, generator=gen, dtype=torch.float64) * 0.3).requires_grad_()
    adv = torch.randn(8, 1, generator=gen, dtype=torch.float64).expand(8, 16)  # (8, 16) per row
    mask = (torch.rand(8, 16, generator=gen) > 0.4).double()  # (8, 16)
    mask[:, 0] = 1
    config = SimpleNamespace(
        **{"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None, **keys}
    )
    loss, metrics = ours(PolicyLossInputs(old, new, adv, mask), ActorConfig(**keys))
    (grad,) = torch.autograd.grad(loss, new)
    ref_loss, ref_metrics = reference(old, new, adv, mask, config)
    (ref_grad,) = torch.autograd.grad(ref_loss, new)
    assert abs(loss.item() - ref_loss.item()) < 1e-6
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=0)
    assert metrics.keys() == ref_metrics.keys()  # the same charts: no name missing
    for key, value in metrics.items():
        assert abs(value - ref_metrics[key]) < 1e-6, key


def test_geo_mean_averages_over_every_row_as_verl_unless_asked_for_the_global_batch():
    """``(4, 3)`` inputs, row 2 empty; micro-batches of rows {0, 1} and {2, 3}."""
    gen = torch.Generator().manual_seed(7)
    old, new = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64) * 0.2  # (4, 3) each
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3, [1.0] * 3, [0.5] * 3], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.float64)
    counts = GlobalBatch(tokens=mask.sum().item(), sequences=3.0)
    config = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None)

    def share(rows, actor):
        inputs = PolicyLossInputs(old[rows], new[rows], adv[rows], mask[rows], global_batch=counts)
        return compute_policy_loss_geo_mean(inputs, actor)[0].item()

    for rows in (slice(0, 2), slice(2, 4)):  # verl's: the micro-batch's mean over all its rows
        reference, _ = _verl_geo_mean(old[rows], new[rows], adv[rows], mask[rows], config)
        assert share(rows, ACTOR) == pytest.approx(reference.item(), abs=1e-12)
    whole, _ = _verl_geo_mean(old, new, adv, mask, config)  # the mean over all 4 rows
    valid_mean = whole.item() * 4 / 3  # over the 3 rows with a token
    # verl's micro-batch means add up to twice the whole batch's mean (2 micro-batches, rows
    # 2 and 3 averaged with the empty one); the opt-in key gives the mean over valid rows.
    verls = share(slice(0, 2), ACTOR) + share(slice(2, 4), ACTOR)
    ours = share(slice(0, 2), GEO_GLOBAL) + share(slice(2, 4), GEO_GLOBAL)
    assert ours == pytest.approx(valid_mean)
    assert verls != pytest.approx(ours)
