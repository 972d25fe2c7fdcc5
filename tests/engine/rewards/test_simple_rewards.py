import pytest

from engine.rewards import exact_match, keyword
from engine.rewards import format as format_reward


def test_exact_match_strips_and_optionally_ignores_case():
    assert exact_match.compute_score("  Paris \n", "Paris") == 1.0
    assert exact_match.compute_score("paris", "Paris") == 0.0
    assert exact_match.compute_score("paris", "Paris", case_sensitive=False) == 1.0
    assert exact_match.compute_score(" Paris", "Paris", strip=False) == 0.0
    assert exact_match.compute_score("NYC", ["New York", "NYC"]) == 1.0


def test_format_reward_needs_the_whole_response_in_the_frame():
    good = "<think>2+2 is 4</think>\n<answer>4</answer>"
    assert format_reward.compute_score(good) == 1.0
    assert format_reward.compute_score(good + " trailing") == 0.0
    assert format_reward.compute_score("<answer>4</answer>") == 0.0
    assert format_reward.compute_score("ANSWER: 4", pattern=r"ANSWER: \d+", score=0.5) == 0.5


def test_format_reward_reports_a_bad_pattern():
    with pytest.raises(ValueError, match="not a valid regex"):
        format_reward.compute_score("x", pattern="(")


def test_keyword_reward_weights_required_and_forbidden_words():
    text = "The Cat sat on the mat."
    assert keyword.compute_score(text, keywords=["cat", "dog"]) == 0.5
    assert keyword.compute_score(text, keywords={"cat": 3.0, "dog": 1.0}) == 0.75
    # forbidden "mat" is present (0 of 2), required "cat" present (1 of 1): 1 / 3
    assert keyword.compute_score(text, keywords=["cat"], forbidden={"mat": 2.0}) == pytest.approx(
        1 / 3
    )
    assert keyword.compute_score(text, forbidden=["dog"]) == 1.0


def test_keyword_reward_matches_whole_words_and_reads_the_ground_truth():
    assert keyword.compute_score("concatenate", keywords=["cat"]) == 0.0
    assert keyword.compute_score("concatenate", keywords=["cat"], whole_word=False) == 1.0
    assert keyword.compute_score("Cat", keywords=["cat"], case_sensitive=True) == 0.0
    assert keyword.compute_score("red and blue", "red, green, blue") == pytest.approx(2 / 3)


def test_keyword_reward_errors_name_the_fix():
    with pytest.raises(ValueError, match="no keywords"):
        keyword.compute_score("text")
    with pytest.raises(ValueError, match="forbidden"):
        keyword.compute_score("text", keywords={"a": -1.0})
