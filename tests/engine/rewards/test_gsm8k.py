from engine.rewards.gsm8k import _SOLUTION_CLIP_CHARS, compute_score, extract_solution


def test_strict_reads_the_hash_answer_without_commas():
    assert extract_solution("She pays 1,000 + 234.\n#### 1,234") == "1234"


def test_strict_reads_negative_and_decimal_answers():
    assert extract_solution("#### -3") == "-3"
    assert extract_solution("#### 2.50") == "2.50"


def test_strict_needs_the_hash_format():
    assert extract_solution("The answer is 42") is None
    # "$" is not in the answer pattern, so "#### $5" is not an answer (as in verl).
    assert extract_solution("#### $5") is None


def test_strict_takes_the_last_hash_answer_in_the_window():
    assert extract_solution("#### 5 wait, I was wrong\n#### 6") == "6"


def test_strict_ignores_an_answer_before_the_last_300_characters():
    filler = "x" * _SOLUTION_CLIP_CHARS
    assert _SOLUTION_CLIP_CHARS == 300
    assert extract_solution("#### 7\n" + filler) is None
    assert extract_solution("#### 7" + "x" * (300 - len("#### 7"))) == "7"
    assert compute_score("#### 7\n" + filler, "7") == 0


def test_flexible_takes_the_last_number_skipping_a_lone_period():
    assert extract_solution("first 3, then 7 .", method="flexible") == "7"
    assert extract_solution("no digits here", method="flexible") is None


def test_flexible_keeps_commas_and_trailing_periods_like_verl():
    assert extract_solution("It costs $1,234", method="flexible") == "1,234"
    assert extract_solution("so 42.", method="flexible") == "42."


def test_compute_score_values():
    assert compute_score("#### 72", "72") == 1.0
    assert compute_score("#### 71", "72") == 0.0
    assert compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert compute_score("72", "72") == 0
    assert compute_score("the total is 72", "72", method="flexible", score=2.0) == 2.0


def test_unknown_method_is_an_error():
    import pytest

    with pytest.raises(ValueError, match="'strict' or 'flexible'"):
        extract_solution("#### 1", method="loose")
