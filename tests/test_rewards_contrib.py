"""The reward modules shipped in rewards_contrib/ load through the custom-reward loader."""

from pathlib import Path

import pytest

from engine.rewards import load_custom_reward_fn

MODULE = Path(__file__).resolve().parent.parent / "rewards_contrib" / "arithmetic_shaped.py"


def test_correct_and_concise_scores_in_parts():
    fn = load_custom_reward_fn(str(MODULE), "correct_and_concise")
    assert fn("tiny_arithmetic", "47", "47") == {
        "score": 1.0,
        "correct": 1.0,
        "length_penalty": -0.0,
    }
    long = fn("tiny_arithmetic", "47 is it", "47")
    assert long["correct"] == 1.0
    assert long["score"] == pytest.approx(1.0 - 0.1 * 4)
    assert fn("tiny_arithmetic", "46", "47")["score"] == 0.0


def test_partial_digits_counts_digits_in_place():
    fn = load_custom_reward_fn(str(MODULE), "partial_digits")
    assert fn("tiny_arithmetic", "47", "47") == 1.0
    assert fn("tiny_arithmetic", "57", "47") == 0.5
    assert fn("tiny_arithmetic", "", "47") == 0.0
