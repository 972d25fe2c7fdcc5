"""The tests of a code ground truth: parse them, compare outputs, read reports, score.

Both ways of running a candidate (``code_local`` and ``code_sandboxed``) end in the same
place: ``{test index: (value, error)}``, where the value is the program's stdout for a stdio
test and whether the assert held for an assertion test. :func:`score` turns that into the
reward's parts. The harnesses report on their stdout one line per test, a nonce then
``[index, value, error]`` in JSON; :func:`read_reports` keeps only lines with the nonce, and
the first report of each index.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

MAX_ERROR_CHARS = 500

Reports = dict[int, tuple[Any, str | None]]  # {test index: (value, error)}


@dataclass
class TestSuite:
    """Tests parsed from a ground truth: stdin/stdout pairs or assertion statements."""

    mode: str  # "stdio" or "assert"
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    statements: list[tuple[str, bool]] = field(default_factory=list)  # (source, is_assert)

    @property
    def total(self) -> int:
        """Return the number of tests."""
        if self.mode == "stdio":
            return len(self.inputs)
        return sum(is_test for _, is_test in self.statements)


def _as_text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def parse_tests(ground_truth: str | dict[str, Any]) -> TestSuite:
    """Return the tests of a ground truth given as a dict or its JSON string."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"code ground truth is not valid JSON ({exc}); expected "
                '{"inputs": [...], "outputs": [...]} or {"assert": "assert f(1) == 2"}'
            ) from exc
    if not isinstance(ground_truth, dict):
        raise ValueError(f"code ground truth must be a dict, got {type(ground_truth).__name__}")
    if "inputs" in ground_truth and "outputs" in ground_truth:
        inputs, outputs = list(ground_truth["inputs"]), list(ground_truth["outputs"])
        if len(inputs) != len(outputs) or not inputs:
            raise ValueError(
                f"code ground truth has {len(inputs)} inputs and {len(outputs)} outputs; "
                "give the same positive number of each"
            )
        return TestSuite("stdio", [_as_text(i) for i in inputs], [_as_text(o) for o in outputs])
    if "assert" in ground_truth:
        source = str(ground_truth["assert"])
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise ValueError(f"assertion code of the ground truth does not parse: {exc}") from exc
        statements = [
            (
                ast.get_source_segment(source, node) or ast.unparse(node),
                isinstance(node, ast.Assert),
            )
            for node in tree.body
        ]
        suite = TestSuite("assert", statements=statements)
        if suite.total == 0:
            raise ValueError("assertion code of the ground truth has no assert statement")
        return suite
    raise ValueError(
        f"code ground truth has keys {sorted(ground_truth)}; expected 'inputs' and 'outputs' "
        "(stdin/stdout pairs) or 'assert' (assertion code)"
    )


def same_output(actual: str, expected: str) -> bool:
    """Return whether two program outputs match up to trailing whitespace and final blank lines."""

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(actual) == lines(expected)


def read_reports(raw: bytes, nonce: str) -> Reports:
    """Return ``{test index: (value, error)}`` from the nonce-tagged lines of a harness."""
    reports: Reports = {}
    prefix = nonce + " "
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith(prefix):
            continue
        try:
            index, value, error = json.loads(line[len(prefix) :])
            index = int(index)
        except (ValueError, TypeError, OverflowError):
            continue  # malformed: only a candidate under the local guard can write one
        reports.setdefault(index, (value, error))
    return reports


def score(suite: TestSuite, reported: Reports, timed_out: bool, fallback: str) -> dict[str, Any]:
    """Return the result parts from ``{test index: (value, error)}``.

    A test without a report failed; the first failure's error is kept, ``fallback`` (the
    harness's last stderr line) when the missing report has no better explanation.
    """
    passed, error = 0, ""
    for index in range(suite.total):
        if index not in reported:
            error = error or ("timed out" if timed_out else fallback or "no result")
            continue
        value, case_error = reported[index]
        if suite.mode == "stdio":  # the right output from a program that then failed fails
            ok = isinstance(value, str) and same_output(value, suite.outputs[index])
            ok = ok and case_error is None
        else:
            ok = value is True
        passed += int(ok)
        if not ok and not error:
            error = case_error or f"test {index}: wrong output"
    return {
        "score": passed / suite.total,
        "syntax_ok": 1,
        "passed": passed,
        "total": suite.total,
        "timed_out": int(timed_out),
        "error": error,
    }
