"""preview_dataset on small files in every format, on malformed files and on a 100k-row file."""

import json
import time

import pyarrow as pa
import pyarrow.parquet as pq

import engine.data
from engine.data.preview import preview_dataset
from tests.engine.data.helpers import verl_row, write_csv, write_jsonl, write_parquet


def test_parquet_preview(tmp_path):
    path = write_parquet(tmp_path / "gsm.parquet", [verl_row(f"q{i}", str(i)) for i in range(7)])
    preview = preview_dataset(path, n=2)
    assert preview.format == "parquet" and preview.row_count == 7 and preview.errors == []
    assert preview.columns == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert preview.rows[1]["prompt"] == [{"role": "user", "content": "q1"}]
    assert preview.mapped == [
        {"prompt": "q0", "ground_truth": "0", "data_source": "gsm8k"},
        {"prompt": "q1", "ground_truth": "1", "data_source": "gsm8k"},
    ]
    json.dumps(preview.to_dict())


def test_jsonl_preview_with_key_map(tmp_path):
    rows = [
        {"question": "1+1=", "answer": 2, "score": float("nan")},
        {"question": "2+2=", "answer": 4},
    ]
    path = write_jsonl(tmp_path / "arith.jsonl", rows + [{"question": "x", "answer": 0}] * 3)
    preview = preview_dataset(path, {"prompt": "question", "ground_truth": "answer"}, n=2)
    assert preview.format == "jsonl" and preview.row_count == 5
    assert preview.columns == ["question", "answer", "score"]
    assert preview.rows[0] == {"question": "1+1=", "answer": 2, "score": None}  # NaN is not JSON
    assert preview.mapped[1] == {"prompt": "2+2=", "ground_truth": 4, "data_source": "arith"}
    json.dumps(preview.to_dict(), allow_nan=False)


def test_csv_preview_and_conversation_text(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["prompt", "data_source"], [["hi", "chat"], ["yo", ""]])
    preview = preview_dataset(path)
    assert (
        preview.format == "csv"
        and preview.row_count == 2
        and preview.columns == ["prompt", "data_source"]
    )
    assert [m["data_source"] for m in preview.mapped] == ["chat", "t"]
    chat = write_jsonl(
        tmp_path / "c.jsonl",
        [{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}],
    )
    assert preview_dataset(chat).mapped[0]["prompt"] == "system: s\n\nuser: u"


def test_preview_reports_unmapped_prompt(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "a", "answer": "1"}])
    preview = preview_dataset(path)
    assert preview.rows == [{"question": "a", "answer": "1"}] and preview.mapped == []
    assert len(preview.errors) == 1
    assert "q.jsonl, line 1: no prompt column 'prompt'" in preview.errors[0]
    assert "data.data_key_map.prompt=<column>" in preview.errors[0]


def test_preview_reports_bad_line_and_keeps_earlier_rows(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('{"prompt": "a"}\nnot json\n{"prompt": "c"}\n')
    preview = preview_dataset(path)
    assert preview.rows == [{"prompt": "a"}]
    assert "b.jsonl, line 2: invalid JSON" in preview.file_error
    assert preview.errors == [preview.file_error]


def test_preview_of_missing_unknown_and_empty_files(tmp_path):
    missing = preview_dataset(tmp_path / "nope.parquet")
    assert missing.format == "" and "data file not found" in missing.file_error
    unknown = preview_dataset(write_jsonl(tmp_path / "notes.txt", [{"prompt": "a"}]))
    assert unknown.format == "jsonl" and unknown.file_error == (
        f"{tmp_path / 'notes.txt'}: holds JSON Lines but its name ends in '.txt', and training "
        "picks the reader by the extension; rename it to notes.jsonl"
    )
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert preview_dataset(empty).errors == [
        f"{empty}: the file is empty; upload verl parquet, JSON Lines (one JSON object per "
        "line) or CSV with a header row, in UTF-8"
    ]
    blank_lines = tmp_path / "b.jsonl"
    blank_lines.write_text("\n \n")
    assert "only whitespace" in preview_dataset(blank_lines).file_error
    bad_map = preview_dataset(write_jsonl(tmp_path / "m.jsonl", [{"prompt": "a"}]), {"x": "y"})
    assert "unknown target(s) ['x']" in bad_map.errors[0] and bad_map.row_count == 1


def test_preview_is_fast_on_100k_rows(tmp_path):
    n = 100_000
    jsonl = tmp_path / "big.jsonl"
    jsonl.write_text("".join(f'{{"q": "{i}+1=", "a": "{i + 1}"}}\n' for i in range(n)))
    parquet = tmp_path / "big.parquet"
    pq.write_table(
        pa.table({"prompt": [f"{i}+1=" for i in range(n)], "x": list(range(n))}), parquet
    )
    start = time.perf_counter()
    big_jsonl = preview_dataset(jsonl, {"prompt": "q", "ground_truth": "a"})
    big_parquet = preview_dataset(parquet)
    elapsed = time.perf_counter() - start
    assert big_jsonl.row_count == n and big_parquet.row_count == n
    assert big_jsonl.mapped[4] == {"prompt": "4+1=", "ground_truth": "5", "data_source": "big"}
    assert len(big_parquet.rows) == 5 and big_parquet.rows[4] == {"prompt": "4+1=", "x": 4}
    assert elapsed < 2.0, f"preview of two 100k-row files took {elapsed:.2f}s"


def test_package_exports_the_public_api():
    assert set(engine.data.__all__) <= set(dir(engine.data))
    assert engine.data.preview_dataset is preview_dataset


def test_the_web_process_previews_and_serves_urls_without_loading_torch(tmp_path):
    # The upload page runs in the web process: torch there would cost seconds and hundreds of
    # MiB per worker for nothing. A fresh interpreter, since this one has torch already.
    import os
    import subprocess
    import sys

    path = write_jsonl(tmp_path / "arith.jsonl", [{"prompt": "1+1=", "ground_truth": 2}] * 3)
    code = (
        "import sys, django; django.setup()\n"
        "from django.urls import get_resolver; get_resolver().url_patterns\n"
        "from engine.data.preview import preview_dataset\n"
        f"assert preview_dataset({str(path)!r}, n=2).row_count == 3\n"
        "print('torch' in sys.modules)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.settings"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
