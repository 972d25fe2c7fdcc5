"""Rows of prompt datasets: read verl parquet, JSON Lines or CSV files into verl's records.

Every row becomes verl's record: ``prompt`` as chat messages, ``data_source``, ``ability``,
``reward_model`` (with ``ground_truth``) and ``extra_info``. Files that do not use those names
are mapped with ``data.data_key_map`` (target -> source column, e.g.
``{"prompt": "question", "ground_truth": "answer"}``); without a mapping each target is read
from the column of the same name. A plain-string prompt becomes one user message. A row without
a ``data_source`` gets the file's stem (``gsm8k_train.jsonl`` -> ``gsm8k_train``), which is the
name rewards are dispatched by. Columns that are none of these go into ``extra_info``.

Malformed input fails with ``DatasetError`` naming the file, the line (JSONL, CSV) or row
(parquet), what is wrong and the setting that fixes it. Nothing here needs torch: the web
process previews uploads with these functions (``engine.data.preview``); ``engine.data.dataset``
turns the records into prompt tensors.

Uploaded files are untrusted, so ``sniff_format`` decides what a file holds from its bytes (the
parquet magic ``PAR1`` at both ends, a JSON object on the first line, or a CSV header of column
names), never from the name alone, and text is read line by line with an optional cap on a
line's length, so a file without newlines cannot make one read swallow it whole.
"""

from __future__ import annotations

import codecs
import csv
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}
FORMAT_SUFFIX = {"parquet": ".parquet", "jsonl": ".jsonl", "csv": ".csv"}
ACCEPTED_FORMATS = (
    "verl parquet, JSON Lines (one JSON object per line) or CSV with a header row, in UTF-8"
)
SNIFF_BYTES = 64 * 1024
PARQUET_MAGIC = b"PAR1"
# Binary formats people upload by mistake, by their first bytes: the message names the fix.
BINARY_MAGIC = {
    b"PK\x03\x04": "a zip archive; unpack it and upload the data file inside",
    b"\x1f\x8b": "gzip-compressed; decompress it (gunzip) and upload the result",
    b"\x28\xb5\x2f\xfd": "zstd-compressed; decompress it (zstd -d) and upload the result",
    b"BZh": "bzip2-compressed; decompress it (bunzip2) and upload the result",
    b"\xfd7zXZ\x00": "xz-compressed; decompress it (xz -d) and upload the result",
    b"\xff\xfe": "UTF-16 text; save it as UTF-8",
    b"\xfe\xff": "UTF-16 text; save it as UTF-8",
}
MAX_HEADER_NAME = 200
TRUNCATION_MODES = ("error", "left", "right", "middle")
MAP_TARGETS = ("prompt", "ground_truth", "data_source", "ability")
RECORD_KEYS = ("raw_prompt", "data_source", "ability", "reward_model", "extra_info")


class DatasetError(ValueError):
    """A data file or row that cannot be used; the message says where and how to fix it."""


def data_format(path: str | Path) -> str:
    """Return "parquet", "jsonl" or "csv" from the file extension."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise DatasetError(
            f"{path}: unsupported file type '{suffix}'; use one of {sorted(FORMATS)} "
            "(verl parquet, JSON Lines with one object per line, or CSV with a header)"
        )
    return FORMATS[suffix]


def sniff_format(head: bytes, tail: bytes, *, size: int, name: str) -> str:
    """Return "parquet", "jsonl" or "csv" for a file from its first and last bytes.

    ``head`` is the file's first bytes (up to ``SNIFF_BYTES``), ``tail`` its last four, ``size``
    its length and ``name`` what messages call it. Raise ``DatasetError`` naming the accepted
    formats for anything else: empty, binary, compressed, UTF-16 or non-UTF-8 text, a JSON array.
    """
    if size == 0:
        raise DatasetError(f"{name}: the file is empty; upload {ACCEPTED_FORMATS}")
    if head.startswith(PARQUET_MAGIC):
        if size < 12 or tail != PARQUET_MAGIC:
            raise DatasetError(
                f"{name}: starts like parquet but does not end with its footer (PAR1); the file "
                "is truncated or not parquet: upload the complete file"
            )
        return "parquet"
    for magic, what in BINARY_MAGIC.items():
        if head.startswith(magic):
            raise DatasetError(f"{name}: the file is {what} ({ACCEPTED_FORMATS} are accepted)")
    if b"\x00" in head:
        raise DatasetError(f"{name}: a binary file, not {ACCEPTED_FORMATS}")
    # The head may end inside a multi-byte character: decode incrementally, not final.
    try:
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(head, final=size <= len(head))
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{name}: not UTF-8 text (byte {head[exc.start]:#04x} at offset {exc.start}); save "
            f"it as UTF-8 ({ACCEPTED_FORMATS} are accepted)"
        ) from None
    stripped = text.lstrip()
    if not stripped:
        raise DatasetError(f"{name}: the file holds only whitespace; upload {ACCEPTED_FORMATS}")
    if stripped.startswith("["):
        raise DatasetError(
            f"{name}: one JSON array; write one object per line (JSON Lines), e.g. "
            "jq -c '.[]' data.json > data.jsonl"
        )
    first, newline, _ = stripped.partition("\n")
    if stripped.startswith("{"):
        if newline or size <= len(head):  # the first line is whole: it must parse
            _json_object(first, f"{name}, line 1")
        return "jsonl"
    try:
        header = next(csv.reader([first.rstrip("\r")]), [])
    except csv.Error:  # a stray carriage return or quote: not a header
        header = []
    if newline and header and all(0 < len(c.strip()) <= MAX_HEADER_NAME for c in header):
        return "csv"
    raise DatasetError(
        f"{name}: neither parquet, JSON Lines nor CSV: its first line is not a JSON object or a "
        f"header of column names; upload {ACCEPTED_FORMATS}"
    )


def sniff_file(path: str | Path) -> str:
    """Return "parquet", "jsonl" or "csv" for the file at ``path`` from its content."""
    path = Path(path)
    with path.open("rb") as handle:
        head = handle.read(SNIFF_BYTES)
        size = handle.seek(0, 2)
        handle.seek(max(size - len(PARQUET_MAGIC), 0))
        tail = handle.read()
    return sniff_format(head, tail, size=size, name=str(path))


def iter_raw_rows(
    path: str | Path, *, max_line_bytes: int | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (location, row) for each row; location reads "<file>, line 3" or "<file>, row 3".

    ``max_line_bytes`` refuses a JSONL or CSV line longer than that (None: no limit).
    """
    path = Path(path).expanduser()
    fmt = data_format(path)
    if not path.is_file():
        raise DatasetError(f"data file not found: {path}; check data.train_files / val_files")
    if fmt == "parquet":
        yield from _iter_parquet(path)
    elif fmt == "jsonl":
        yield from _iter_jsonl(path, max_line_bytes)
    else:
        yield from _iter_csv(path, max_line_bytes)


# What reading a hostile parquet file can raise besides ArrowException: pyarrow converts values
# to Python objects (dates out of range, invalid UTF-8 in a string column, unhashable map keys).
PARQUET_ERRORS = (pa.ArrowException, OSError, ValueError, OverflowError, TypeError, KeyError)


def _iter_parquet(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
        row = 0
        for batch in batches:
            for record in batch.to_pylist():
                row += 1
                yield f"{path}, row {row}", record
    except PARQUET_ERRORS as exc:
        raise DatasetError(f"{path}: not a readable parquet file ({exc})") from exc


def _iter_lines(path: Path, max_line_bytes: int | None) -> Iterator[tuple[int, str]]:
    """Yield (line number, text) for each line, decoded as UTF-8 (a leading BOM dropped)."""
    with path.open("rb") as handle:
        number = 0
        while True:
            line = handle.readline(-1 if max_line_bytes is None else max_line_bytes + 1)
            if not line:
                return
            number += 1
            if max_line_bytes is not None and len(line.rstrip(b"\r\n")) > max_line_bytes:
                raise DatasetError(
                    f"{path}, line {number}: longer than {max_line_bytes:,} bytes, the limit "
                    "POSTTRAIN_DATASET_MAX_LINE_BYTES sets; shorten the row or raise the limit"
                )
            try:
                text = line.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(
                    f"{path}, line {number}: not UTF-8 text (byte {line[exc.start]:#04x}); save "
                    "the file as UTF-8"
                ) from None
            yield number, text


def _json_object(line: str, location: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{location}: invalid JSON ({exc.msg}). Each line must be one complete JSON object"
        ) from None
    except RecursionError:
        raise DatasetError(f"{location}: JSON nested too deeply to read") from None
    if not isinstance(record, dict):
        raise DatasetError(
            f'{location}: expected a JSON object like {{"prompt": ...}}, got '
            f"{type(record).__name__}; write one object per line"
        )
    return record


def _iter_jsonl(path: Path, max_line_bytes: int | None) -> Iterator[tuple[str, dict[str, Any]]]:
    for number, line in _iter_lines(path, max_line_bytes):
        if not line.strip():
            continue
        location = f"{path}, line {number}"
        if number == 1 and line.lstrip().startswith("["):
            raise DatasetError(
                f"{location}: one JSON array; write one object per line (JSON Lines), "
                "e.g. jq -c '.[]' data.json > data.jsonl"
            )
        yield location, _json_object(line, location)


def _iter_csv(path: Path, max_line_bytes: int | None) -> Iterator[tuple[str, dict[str, Any]]]:
    reader = csv.reader(line for _, line in _iter_lines(path, max_line_bytes))
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise DatasetError(f"{path}, line 1: malformed CSV header ({exc})") from None
    if header is None:
        return
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DatasetError(f"{path}, line {start}: malformed CSV ({exc})") from exc
        if not fields:
            continue
        if len(fields) != len(header):
            raise DatasetError(
                f"{path}, line {start}: {len(fields)} fields but the header has "
                f"{len(header)} ({', '.join(header)}); quote values that contain commas"
            )
        yield f"{path}, line {start}", dict(zip(header, fields, strict=True))


def check_key_map(key_map: dict[str, str] | None) -> dict[str, str]:
    """Return ``data.data_key_map`` as a plain dict, rejecting unknown targets."""
    key_map = {str(k): str(v) for k, v in (key_map or {}).items()}
    unknown = sorted(set(key_map) - set(MAP_TARGETS))
    if unknown:
        raise DatasetError(
            f"data.data_key_map has unknown target(s) {unknown}; targets are {list(MAP_TARGETS)} "
            "(write target=source column, e.g. data.data_key_map.prompt=question)"
        )
    return key_map


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _is_message(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("role"), str)
        and isinstance(value.get("content"), str)
    )


def _messages(value: Any, location: str, column: str) -> list[dict[str, Any]]:
    """Return the prompt as chat messages: a string becomes one user message."""
    if isinstance(value, str) and value:
        return [{"role": "user", "content": value}]
    problem = f"holds {_describe(value)}"
    if isinstance(value, str | list | tuple) and not value:
        problem = "is empty"
    elif isinstance(value, list | tuple):
        bad = [m for m in value if not _is_message(m)]
        if not bad:
            return [dict(m) for m in value]
        problem = f"has a message that is not {{'role': str, 'content': str}}: {_describe(bad[0])}"
    raise DatasetError(
        f"{location}: prompt column '{column}' {problem}; a prompt must be a non-empty string or "
        "a list of {'role': ..., 'content': ...} messages (map a text column with "
        "data.data_key_map.prompt=<column>)"
    )


def normalise_row(
    raw: dict[str, Any],
    *,
    location: str,
    key_map: dict[str, str],
    prompt_key: str = "prompt",
    default_source: str = "",
) -> dict[str, Any]:
    """Return verl's record (raw_prompt, data_source, ability, reward_model, extra_info) for a row."""
    sources = {target: key_map.get(target, target) for target in MAP_TARGETS}
    sources["prompt"] = key_map.get("prompt", prompt_key)
    for target, column in key_map.items():
        if column not in raw:
            raise DatasetError(
                f"{location}: column '{column}' (data.data_key_map.{target}) not found; "
                f"columns are {list(raw)}; set data.data_key_map.{target}=<column>"
            )
    prompt_column = sources["prompt"]
    if prompt_column not in raw:
        raise DatasetError(
            f"{location}: no prompt column '{prompt_column}'; columns are {list(raw)}; "
            "map your column with data.data_key_map.prompt=<column>"
        )
    reward_model = raw.get("reward_model")
    if reward_model is None:
        reward_model = {}
    elif not isinstance(reward_model, dict):
        raise DatasetError(
            f"{location}: reward_model must be an object like {{'ground_truth': ...}}, got "
            f"{_describe(reward_model)}; put the answer in its own column and set "
            "data.data_key_map.ground_truth=<column>"
        )
    reward_model = dict(reward_model)
    reward_model.setdefault("style", "rule")
    if sources["ground_truth"] in raw:
        reward_model["ground_truth"] = raw[sources["ground_truth"]]
    extra = raw.get("extra_info")
    extra_info = (
        dict(extra) if isinstance(extra, dict) else {} if extra is None else {"extra_info": extra}
    )
    used = set(sources.values()) | {"reward_model", "extra_info"}
    for column, value in raw.items():
        if column not in used:
            extra_info.setdefault(column, value)
    data_source = raw.get(sources["data_source"])
    ability = raw.get(sources["ability"])
    return {
        "raw_prompt": _messages(raw[prompt_column], location, prompt_column),
        "data_source": str(data_source) if data_source not in (None, "") else default_source,
        "ability": str(ability) if ability not in (None, "") else "unknown",
        "reward_model": reward_model,
        "extra_info": extra_info,
    }


def truncate_ids(ids: Sequence[int], max_length: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``max_length``: left keeps the end, right the start, middle both ends."""
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[len(ids) - max_length :]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        left_half = max_length // 2
        right_half = max_length - left_half
        return ids[:left_half] + (ids[-right_half:] if right_half else [])
    raise ValueError(f"cannot truncate with mode '{mode}'; use one of left, right, middle")
