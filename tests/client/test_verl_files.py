"""Reading verl's files as verl writes them (``tests/client/fake_verl.py`` copies its writers)."""

from __future__ import annotations

import math

import pytest

from posttrain_client.verl_files import (
    dump_samples,
    dump_steps,
    parse_logger_line,
    read_new_lines,
)
from tests.client.fake_verl import PROMPTS, N, dump_generations, fit, rollouts


def test_file_logger_lines_give_steps_with_numbers_only(tmp_path):
    log = tmp_path / "metrics.jsonl"
    fit(str(log), str(tmp_path / "rollouts"), None, total=2, test_freq=1)
    lines, offset = read_new_lines(log, 0)
    assert offset == log.stat().st_size and len(lines) == 2
    first = parse_logger_line(lines[0])
    assert first.step == 1 and first.skipped == ()
    assert first.metrics["critic/score/mean"] == pytest.approx(0.26)  # a numpy float32
    assert first.metrics["training/global_step"] == 1.0
    kl = parse_logger_line(lines[1]).metrics["actor/kl_loss"]  # orjson wrote the NaN as null
    assert math.isnan(kl)
    mixed = parse_logger_line(b'{"step": 3, "data": {"a": 1, "note": "text", "hist": [1, 2]}}')
    assert mixed.metrics == {"a": 1.0} and mixed.skipped == ("note", "hist")
    with pytest.raises(ValueError, match="not a file-logger line"):
        parse_logger_line(b'{"step": 1, "metrics": {}}')
    with pytest.raises(ValueError, match="step=-1 is not a step number"):
        parse_logger_line(b'{"step": -1, "data": {}}')


def test_a_line_still_being_written_waits_for_its_newline(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_bytes(b'{"step": 1, "data": {}}\n{"step": 2, "da')
    lines, offset = read_new_lines(log, 0)
    assert len(lines) == 1 and offset == len(b'{"step": 1, "data": {}}\n')
    with open(log, "ab") as f:
        f.write(b'ta": {}}\n')
    lines, offset = read_new_lines(log, offset)
    assert [parse_logger_line(line).step for line in lines] == [2]


def test_a_dump_groups_each_prompts_responses_by_its_text(tmp_path):
    dump_generations(3, *rollouts(3), str(tmp_path))
    assert dump_steps(tmp_path) == {3: tmp_path / "3.jsonl"}
    samples = list(dump_samples(tmp_path / "3.jsonl", 3, "train"))
    assert len(samples) == len(PROMPTS) * N
    for prompt in PROMPTS:
        indices = sorted(s["sample_index"] for s in samples if s["prompt"] == prompt)
        assert indices == list(range(N))
    first = samples[0]
    assert first["step"] == 3 and first["split"] == "train"
    assert set(first) >= {"prompt", "response", "reward", "ground_truth", "reward_parts"}
    assert first["reward_parts"] == {"acc": bool(first["reward"]), "pred": first["response"][-3:]}
    assert any(s["ground_truth"] == {"any_of": [11, 13]} for s in samples)  # any JSON


def test_a_nan_score_python_wrote_reads_as_no_reward(tmp_path):
    # _dump_generations writes with Python's json, which writes a NaN score as NaN.
    dump_generations(1, ["q"], ["a"], ["1"], [float("nan")], {"acc": [False]}, str(tmp_path))
    assert "NaN" in (tmp_path / "1.jsonl").read_text()
    (only,) = dump_samples(tmp_path / "1.jsonl", 1, "train")
    assert only["reward"] is None and only["reward_parts"] == {"acc": False}
