"""Random bytes and mutated valid files through preview_dataset and iter_raw_rows.

Whatever an upload holds, the preview answers with a preview or with errors (never raises), what
it answers is storable as JSON in PostgreSQL, and the training reader raises only DatasetError.
Content that starts and ends like parquet goes through ``preview_untrusted`` (a child process):
pyarrow aborts the process on some damaged footers, which no exception handler can catch.
"""

import io
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.data.preview import DatasetPreview, PreviewLimits, preview_dataset, preview_untrusted
from engine.data.rows import DatasetError, iter_raw_rows
from tests.engine.data.helpers import verl_row

SUFFIXES = [".parquet", ".jsonl", ".json", ".csv"]
LIMITS = PreviewLimits(max_rows=1000, max_line_bytes=4096, max_decoded_bytes=1 << 20)


def _parquet(**options) -> bytes:
    buffer = io.BytesIO()
    rows = [verl_row(f"q{i}", str(i)) for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), buffer, **options)
    return buffer.getvalue()


VALID = {
    ".parquet": [_parquet(), _parquet(compression="zstd", row_group_size=2)],
    ".jsonl": [
        "".join(json.dumps(verl_row(f"q{i}", str(i))) + "\n" for i in range(6)).encode(),
        b'{"question": "1+1=", "answer": 2}\n{"question": "\\u00e9", "answer": [1]}\n',
    ],
    ".csv": [b'prompt,ground_truth\r\n1+1=,2\r\n"a, b","x""y"\r\n'],
}
VALID[".json"] = VALID[".jsonl"]


def _check(path: Path) -> DatasetPreview:
    parquet_like = path.read_bytes()[:4] == b"PAR1"
    preview = (preview_untrusted if parquet_like else preview_dataset)(path, n=3, limits=LIMITS)
    text = json.dumps(preview.to_dict(), allow_nan=False)
    assert "\\u0000" not in text
    assert all(isinstance(e, str) and e for e in preview.errors)
    if preview.file_error:
        assert preview.file_error in preview.errors
    else:
        assert preview.format and preview.row_count >= len(preview.rows) and len(preview.rows) <= 3
    if parquet_like:
        return preview
    try:
        for _ in iter_raw_rows(path, max_line_bytes=LIMITS.max_line_bytes):
            pass
    except DatasetError as exc:
        assert str(exc)
    return preview


def _run(content: bytes, suffix: str) -> DatasetPreview:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"data{suffix}"
        path.write_bytes(content)
        return _check(path)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(content=st.binary(max_size=2048), suffix=st.sampled_from(SUFFIXES))
def test_random_bytes_give_a_preview_or_a_clear_error(content, suffix):
    _run(content, suffix)


@FUZZ
@given(content=st.text(max_size=512), suffix=st.sampled_from(SUFFIXES))
def test_random_text_gives_a_preview_or_a_clear_error(content, suffix):
    _run(content.encode("utf-8", "surrogatepass"), suffix)


@st.composite
def mutated_files(draw, suffixes=(".jsonl", ".json", ".csv")):
    suffix = draw(st.sampled_from(suffixes))
    data = bytearray(draw(st.sampled_from(VALID[suffix])))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        action = draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
        if action == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[at:]
    return bytes(data), suffix


@FUZZ
@given(case=mutated_files())
def test_mutated_text_files_give_a_preview_or_a_clear_error(case):
    _run(*case)


@settings(max_examples=25, deadline=None)
@given(case=mutated_files(suffixes=(".parquet",)))
def test_mutated_parquet_files_give_a_preview_or_a_clear_error(case):
    _run(*case)


def test_a_footer_that_aborts_pyarrow_is_a_clear_error_in_a_child_process():
    # A mutated footer on which pyarrow 26 throws a C++ exception it does not catch (abort).
    path = Path(__file__).parent / "files" / "pyarrow_aborts_on_footer.parquet"
    preview = preview_untrusted(path)
    assert preview.file_error.startswith(f"{path}: ")
    assert "write it again with pyarrow or pandas" in preview.file_error


def test_the_valid_seeds_preview_cleanly():
    for suffix, contents in VALID.items():
        for content in contents:
            preview = _run(content, suffix)
            assert preview.file_error == "" and preview.rows, (suffix, preview.errors)
