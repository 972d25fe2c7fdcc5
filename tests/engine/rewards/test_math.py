import pytest

from engine.rewards.math import (
    compute_score,
    is_equiv,
    last_boxed_only_string,
    remove_boxed,
    strip_string,
)


def test_last_boxed_only_string_balances_braces_and_takes_the_last():
    text = r"first \boxed{1} then \boxed{\frac{1}{2}} done"
    assert last_boxed_only_string(text) == r"\boxed{\frac{1}{2}}"
    assert last_boxed_only_string("no box") is None
    assert last_boxed_only_string(r"\boxed{unclosed") is None
    assert remove_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (r"\frac12", r"\frac{1}{2}"),
        (r"\dfrac{3}{4}", r"\frac{3}{4}"),
        ("0.5", r"\frac{1}{2}"),
        (".5", r"\frac{1}{2}"),
        ("3/4", r"\frac{3}{4}"),
        (r"10\text{ units}", "10"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        ("x = 5", "5"),
        (r"90^\circ", "90"),
        (r"50\%", "50"),
        (r"\sqrt2", r"\sqrt{2}"),
        (r"\$ 5", "5"),
    ],
)
def test_strip_string_normalises(raw, normal):
    assert strip_string(raw) == normal


def test_is_equiv_is_string_matching_after_normalisation():
    assert is_equiv(r"\frac12", r"\frac{1}{2}")
    assert is_equiv("0.5", r"\frac{1}{2}")
    assert is_equiv(r"7\text{ cm}", "7")
    assert not is_equiv("2/4", r"\frac{1}{2}")  # not symbolic, as in verl
    assert is_equiv(None, None) and not is_equiv("1", None)


def test_compute_score_uses_the_last_box():
    assert compute_score(r"So the answer is $\boxed{\frac12}$.", r"\frac{1}{2}") == 1.0
    assert compute_score(r"\boxed{0.5}", r"\frac{1}{2}") == 1.0
    assert compute_score(r"\boxed{3} no, \boxed{4}", "3") == 0.0
    assert compute_score("the answer is 3", "3") == 0.0
