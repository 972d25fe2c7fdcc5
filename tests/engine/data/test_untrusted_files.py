"""preview_dataset on hostile uploads: mislabelled, binary, badly encoded, oversized, bombs."""

import gzip
import io
import json
import os
import subprocess
import sys
import zipfile

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engine.data.preview import DISPLAY_CHARS, PreviewLimits, preview_dataset
from tests.engine.data.helpers import verl_row, write_jsonl, write_parquet

ROW = b'{"prompt": "1+1=", "ground_truth": "2"}\n'
MiB = 2**20


def _parquet_bytes(rows: list[dict], **options) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer, **options)
    return buffer.getvalue()


def _zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("data.jsonl", ROW * 3)
    return buffer.getvalue()


REFUSED_FILES = {
    "text named parquet": (
        "data.parquet",
        ROW,
        "holds JSON Lines but its name ends in '.parquet', and training picks the reader by the "
        "extension; rename it to data.jsonl",
    ),
    "parquet named jsonl": (
        "data.jsonl",
        _parquet_bytes([verl_row("q", "1")]),
        "holds parquet but its name ends in '.jsonl'",
    ),
    "zip named jsonl": ("data.jsonl", _zip_bytes(), "the file is a zip archive; unpack it"),
    "gzip named jsonl": ("data.jsonl", gzip.compress(ROW), "gzip-compressed; decompress it"),
    "empty": ("data.jsonl", b"", "the file is empty; upload verl parquet, JSON Lines"),
    "UTF-16 with a BOM": ("data.jsonl", ROW.decode().encode("utf-16"), "UTF-16 text; save"),
    "UTF-16 without a BOM": ("data.jsonl", ROW.decode().encode("utf-16-le"), "a binary file"),
    "latin-1": (
        "data.jsonl",
        '{"prompt": "café"}\n'.encode("latin-1"),
        "not UTF-8 text (byte 0xe9 at offset 15); save it as UTF-8",
    ),
    "latin-1 past the sniffed head": (
        "data.jsonl",
        ROW * 2000 + '{"prompt": "café"}\n'.encode("latin-1"),
        "data.jsonl, line 2001: not UTF-8 text (byte 0xe9); save the file as UTF-8",
    ),
    "bad JSON": ("data.jsonl", b'{"prompt": "a",}\n', "line 1: invalid JSON"),
    "bad JSON later": ("data.jsonl", ROW + b"{oops\n", "line 2: invalid JSON"),
    "a number line": ("data.jsonl", ROW + b"5\n", 'line 2: expected a JSON object like {"prompt"'),
    "JSON array": ("data.json", b'[{"prompt": "a"}]', "one JSON array; write one object per line"),
    "truncated parquet": (
        "data.parquet",
        _parquet_bytes([verl_row("q", "1")])[:-10],
        "starts like parquet but does not end with its footer (PAR1)",
    ),
    "parquet with a broken footer": (
        "data.parquet",
        b"PAR1" + b"\x00" * 64 + (40).to_bytes(4, "little") + b"PAR1",
        "not a readable parquet file",
    ),
    "prose": ("data.csv", b"just some words without a newline", "neither parquet, JSON Lines"),
    "CSV header only": ("data.csv", b"prompt,answer\n", "the file has no rows"),
    "CSV ragged": ("data.csv", b"prompt,answer\na,1\nb\n", "line 3: 1 fields but the header"),
}


@pytest.mark.parametrize("case", list(REFUSED_FILES), ids=list(REFUSED_FILES))
def test_unusable_file_is_refused_with_the_reason(tmp_path, case):
    name, content, message = REFUSED_FILES[case]
    path = tmp_path / name
    path.write_bytes(content)
    preview = preview_dataset(path)
    assert message in preview.file_error
    assert preview.file_error in preview.errors
    json.dumps(preview.to_dict(), allow_nan=False)


def test_row_problems_are_errors_a_key_map_can_fix(tmp_path):
    jsonl = write_jsonl(tmp_path / "t.jsonl", [{"prompt": 7}, {"question": "a"}])
    preview = preview_dataset(jsonl)
    assert preview.file_error == "" and preview.row_count == 2
    assert "line 1: prompt column 'prompt' holds int 7" in preview.errors[0]
    assert "line 2: no prompt column 'prompt'" in preview.errors[1]
    wrong_schema = write_parquet(
        tmp_path / "w.parquet",
        [{"prompt": 3, "reward_model": "4"}, {"prompt": 5, "reward_model": "6"}],
    )
    preview = preview_dataset(wrong_schema, n=1)
    assert preview.file_error == "" and preview.columns == ["prompt", "reward_model"]
    assert len(preview.errors) == 1 and "row 1: reward_model must be an object" in preview.errors[0]


def test_utf8_byte_order_mark_is_read_like_plain_utf8(tmp_path):
    csv_path = tmp_path / "excel.csv"
    csv_path.write_bytes(b"\xef\xbb\xbfprompt,answer\r\nhi,1\r\n")
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + ROW)
    for path in (csv_path, jsonl):
        preview = preview_dataset(path)
        assert preview.errors == [] and preview.columns[0] == "prompt", preview.errors


def test_long_line_and_too_many_rows_are_refused_naming_the_setting(tmp_path):
    limits = PreviewLimits(max_rows=10, max_line_bytes=1000)
    long_line = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "a"}, {"prompt": "x" * 5000}])
    assert preview_dataset(long_line, limits=limits).file_error == (
        f"{long_line}, line 2: longer than 1,000 bytes, the limit "
        "POSTTRAIN_DATASET_MAX_LINE_BYTES sets; shorten the row or raise the limit"
    )
    long_csv = tmp_path / "long.csv"
    long_csv.write_text("prompt\n" + "y" * 5000 + "\n")
    assert "line 2: longer than 1,000 bytes" in preview_dataset(long_csv, limits=limits).file_error
    many = "more than 10 rows, the limit POSTTRAIN_DATASET_MAX_ROWS sets; split the file"
    rows = [{"prompt": str(i)} for i in range(11)]
    assert (
        many in preview_dataset(write_jsonl(tmp_path / "m.jsonl", rows), limits=limits).file_error
    )
    parquet = write_parquet(tmp_path / "m.parquet", rows)
    assert (
        preview_dataset(parquet, limits=limits).file_error
        == f"{parquet}: {many} or raise the limit"
    )
    assert (
        preview_dataset(write_jsonl(tmp_path / "ok.jsonl", rows[:10]), limits=limits).errors == []
    )


def test_parquet_preview_reads_only_the_first_row_groups(tmp_path):
    rows = [{"prompt": f"{i}" + "z" * 1000} for i in range(100)]
    limits = PreviewLimits(max_decoded_bytes=60_000)
    one_group = tmp_path / "one.parquet"
    one_group.write_bytes(_parquet_bytes(rows, compression="zstd"))
    refused = preview_dataset(one_group, limits=limits).file_error
    assert refused.startswith(f"{one_group}: its first 100 rows (row group(s) [0]) decompress to")
    assert refused.endswith("row_group_size=1000)) or raise the limit")
    assert "more than the 60,000 that POSTTRAIN_PREVIEW_MAX_BYTES allows a preview" in refused
    small_groups = tmp_path / "small.parquet"
    small_groups.write_bytes(_parquet_bytes(rows, compression="zstd", row_group_size=5))
    preview = preview_dataset(small_groups, limits=limits)
    assert preview.errors == [] and preview.row_count == 100 and len(preview.rows) == 5
    assert preview.rows[4]["prompt"] == "4" + "z" * 1000


def test_preview_values_are_cut_and_storable_in_postgresql(tmp_path):
    path = tmp_path / "odd.jsonl"
    deep = "[" * 500 + "]" * 500
    path.write_text(
        '{"prompt": "a\\u0000b\\ud800", "long": "' + "x" * 10_000 + '", "deep": ' + deep + "}\n"
    )
    preview = preview_dataset(path)
    assert preview.errors == []
    row = preview.rows[0]
    assert row["prompt"] == "a\ufffdb?" and preview.mapped[0]["prompt"] == "a\ufffdb?"
    assert row["long"] == "x" * DISPLAY_CHARS + "…"
    text = json.dumps(preview.to_dict(), allow_nan=False)
    assert "\\u0000" not in text and len(text) < 10_000


# The probe reads its peak RSS from /proc (VmHWM, this process image's own high-water mark):
# ru_maxrss would carry over the forked pytest process's peak across exec.
BOMB_PROBE = """
import json, sys
from engine.data.preview import PreviewLimits, preview_dataset
import pyarrow.parquet
def peak_mib():
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024
before = peak_mib()
preview = preview_dataset(sys.argv[1], limits=PreviewLimits(max_decoded_bytes=int(sys.argv[2])))
print(json.dumps({"before": before, "after": peak_mib(), "error": preview.file_error,
                  "rows": len(preview.rows)}))
"""


def _preview_in_fresh_process(path, cap: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", BOMB_PROBE, str(path), str(cap)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_compression_bomb_parquet_is_refused_without_decompressing(tmp_path):
    # 192 MiB of one repeated character in one row group is ~6 KB of zstd. Built in arrow, so
    # this process never holds it as a Python string.
    size = 192 * MiB
    text = pc.binary_repeat(pa.array(["a"]), size)
    bomb = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"prompt": text}), bomb, compression="zstd", compression_level=19)
    del text
    assert bomb.stat().st_size < 32 * 1024
    refused = _preview_in_fresh_process(bomb, 64 * MiB)
    assert "decompress to 201,3" in refused["error"] and refused["rows"] == 0
    assert refused["after"] - refused["before"] < 64, refused
    # The same probe sees the bomb go off when the cap lets the preview read it.
    read = _preview_in_fresh_process(bomb, 1024 * MiB)
    assert read["error"] == "" and read["rows"] == 1
    assert read["after"] - read["before"] > size / MiB, read
