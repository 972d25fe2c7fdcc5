import json
import os
import time

import pytest

from engine.rewards.code_exec import compute_score, extract_code, parse_tests, same_output

DOUBLE = {"inputs": ["1\n", "5\n", "-2\n"], "outputs": ["2\n", "10\n", "-4"]}


def test_stdin_stdout_program_passes_all():
    response = "Here you go:\n```python\nn = int(input())\nprint(n * 2)\n```\n"
    result = compute_score(response, json.dumps(DOUBLE))
    assert result == {
        "score": 1.0,
        "syntax_ok": 1,
        "passed": 3,
        "total": 3,
        "timed_out": 0,
        "error": "",
    }


def test_partial_credit_is_the_fraction_passed():
    response = "```python\nn = int(input())\nprint(n * 2 if n > 0 else n)\n```"
    result = compute_score(response, DOUBLE)
    assert (result["passed"], result["total"]) == (2, 3)
    assert result["score"] == pytest.approx(2 / 3)
    assert result["error"] == "test 2: wrong output"


def test_assertion_tests_count_each_assert():
    code = "def f(x):\n    return x + 1 if x < 3 else x\n"
    tests = {"assert": "import math\nassert f(1) == 2\nassert f(2) == 3\nassert f(5) == 6\n"}
    result = compute_score(code, tests)
    assert (result["passed"], result["total"], result["score"]) == (2, 3, pytest.approx(2 / 3))
    assert result["error"].startswith("AssertionError")


def test_syntax_error_scores_zero_and_keeps_the_error():
    result = compute_score("```python\ndef f(:\n    pass\n```", {"assert": "assert f() is None"})
    assert result["score"] == 0.0 and result["syntax_ok"] == 0 and result["total"] == 1
    assert result["error"].startswith("SyntaxError") and "(line 1)" in result["error"]


def test_infinite_loop_times_out_within_the_limit():
    start = time.monotonic()
    result = compute_score("while True:\n    pass\n", DOUBLE, timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert result["timed_out"] == 1 and result["score"] == 0.0
    assert elapsed < 3.0


@pytest.mark.parametrize("mode", ["bwrap", "local"])
def test_candidate_cannot_write_outside_its_directory(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("POSTTRAIN_SANDBOX", mode)
    precious = tmp_path / "repo" / "engine.py"
    precious.parent.mkdir()
    precious.write_text("important = True\n")
    attack = (
        "import os, shutil\n"
        "for attempt in (\n"
        f"    lambda: open({str(precious)!r}, 'w').write('pwned'),\n"
        f"    lambda: os.remove({str(precious)!r}),\n"
        f"    lambda: shutil.rmtree({str(precious.parent)!r}),\n"
        f"    lambda: os.system('rm -rf {precious.parent}'),\n"
        "):\n"
        "    try:\n"
        "        attempt()\n"
        "    except OSError:\n"  # refused (local) or not there at all (bwrap)
        "        print('refused')\n"
        "open('scratch.txt', 'w').write('ok')\n"  # its own directory is writable
        "print(open('scratch.txt').read())\n"
    )
    refusals = 4 if mode == "local" else 3  # `rm -rf` of a folder it cannot see succeeds
    result = compute_score(attack, {"inputs": [""], "outputs": ["refused\n" * refusals + "ok"]})
    assert result["score"] == 1.0, result
    assert precious.read_text() == "important = True\n"


@pytest.mark.parametrize("mode", ["bwrap", "local"])
def test_forged_result_lines_earn_nothing(monkeypatch, mode):
    monkeypatch.setenv("POSTTRAIN_SANDBOX", mode)
    forger = (
        "import sys, os\n"
        "for i in range(3):\n"
        "    sys.__stdout__.write(f'x [{i}, true, null]\\n')\n"
        "    os.write(1, f'[{i}, true, null]\\n'.encode())\n"
        "raise SystemExit(0)\n"
    )
    result = compute_score(forger, {"assert": "assert f(1) == 2"})
    assert result["passed"] == 0 and result["score"] == 0.0


def test_memory_limit_stops_a_hog():
    result = compute_score(
        "x = bytearray(4 * 1024**3)\nprint(1)", {"inputs": [""], "outputs": ["1"]}
    )
    assert result["score"] == 0.0 and "MemoryError" in result["error"]


def test_extract_code_and_output_comparison():
    assert extract_code("```py\na = 1\n```\n```python\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nc = 3\n```") == "c = 3\n"
    assert extract_code("d = 4") == "d = 4"
    assert same_output("1 \n2\n\n", "1\n2")
    assert not same_output("1 2", "1\n2")


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ("not json", "not valid JSON"),
        ({"inputs": ["1"], "outputs": []}, "same positive number"),
        ({"assert": "x = 1"}, "no assert statement"),
        ({"tests": []}, "expected 'inputs' and 'outputs'"),
    ],
)
def test_bad_ground_truth_is_a_clear_error(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        parse_tests(ground_truth)


def test_local_guard_runs_in_a_fresh_directory_that_is_removed(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("POSTTRAIN_SANDBOX", "local")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = (
        "import os\n"
        f"print(os.getcwd().startswith({str(tmp_path)!r}), os.listdir('.'), "
        "os.environ['HOME'] == os.getcwd(), sorted(os.environ))\n"
    )
    expected = "True [] True ['HOME', 'LANG', 'LC_ALL', 'OMP_NUM_THREADS', 'PATH', 'TMPDIR']"
    result = compute_score(code, {"inputs": [""], "outputs": [expected]}, timeout_s=2.0)
    assert result["score"] == 1.0, result
    assert list(tmp_path.iterdir()) == []
    # An assertion suite: two processes, each in its own folder; a hung call ends both.
    hangs = "def f():\n    while True:\n        pass\n"
    start = time.monotonic()
    result = compute_score(hangs, {"assert": "assert f() is None"}, timeout_s=1.0)
    assert time.monotonic() - start < 3.0
    assert result["timed_out"] == 1 and result["score"] == 0.0, result
    assert list(tmp_path.iterdir()) == []
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _cwd_in(pid, tmp_path)]


def _cwd_in(pid: str, folder) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(str(folder))
    except OSError:
        return False


def test_sandbox_sees_an_empty_tmp_a_minimal_environment_and_no_project():
    code = (
        "import os\n"
        "print(os.getcwd(), os.listdir('.'), os.getuid(), sorted(os.environ), sorted(os.listdir('/')))\n"
    )
    expected = (
        "/tmp [] 65534 ['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR'] "
        f"{sorted(['bin', 'box', 'dev', 'etc', 'lib', 'lib64', 'proc', 'root', 'sbin', 'tmp', 'usr'])}"
    )
    result = compute_score(code, {"inputs": [""], "outputs": [expected]})
    assert result["score"] == 1.0, result


def test_assertion_tests_see_plain_values_objects_and_generators():
    code = (
        "class Stack:\n"
        "    def __init__(self):\n"
        "        self.items = []\n"
        "    def push(self, x):\n"
        "        self.items.append(x)\n"
        "        return self\n"
        "    def __len__(self):\n"
        "        return len(self.items)\n"
        "def pairs(n):\n"
        "    yield from ((i, {i: {i}}) for i in range(n))\n"
    )
    tests = (
        "s = Stack().push(1).push(2)\n"
        "assert len(s) == 2 and s.items == [1, 2]\n"
        "assert list(pairs(2)) == [(0, {0: {0}}), (1, {1: {1}})]\n"
        "assert Stack() == Stack()\n"  # objects compare by identity only
    )
    result = compute_score(code, {"assert": tests})
    assert (result["passed"], result["total"]) == (2, 3), result
