"""The tests of a code ground truth: reading the harness's reports and scoring them."""

from __future__ import annotations

import pytest

from engine.rewards import code_tests
from engine.rewards.code_exec import compute_score


@pytest.mark.parametrize("mode", ["bwrap", "local"])
def test_a_program_that_fails_after_the_right_output_fails_with_its_error(monkeypatch, mode):
    monkeypatch.setenv("POSTTRAIN_SANDBOX", mode)
    result = compute_score("print(input())\n1 / 0\n", {"inputs": ["a"], "outputs": ["a"]})
    assert (result["passed"], result["total"], result["score"]) == (0, 1, 0.0)
    assert result["error"] == "ZeroDivisionError: division by zero"


def test_malformed_report_lines_are_skipped():
    raw = (
        b'n ["x", true, null]\n'  # index not a number
        b"n [Infinity, true, null]\n"  # index not finite
        b"n [1, true]\n"  # two fields
        b'n [0, false, "AssertionError"]\n'
        b"m [1, true, null]\n"  # another nonce
        b"n [0, true, null]\n"  # a second report of test 0: the first one counts
    )
    assert code_tests.read_reports(raw, "n") == {0: (False, "AssertionError")}


def test_a_stdio_report_that_is_not_text_is_a_wrong_output():
    suite = code_tests.TestSuite("stdio", inputs=["1", "2"], outputs=["5", "5"])
    result = code_tests.score(suite, {0: (5, None), 1: ("5\n", None)}, False, "")
    assert (result["passed"], result["error"]) == (1, "test 0: wrong output")
