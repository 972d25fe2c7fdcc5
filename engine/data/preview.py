"""Dataset preview for the upload page: format, columns, row count, first rows, mapped rows.

The file is untrusted (a user's upload), so every read is bounded. The format comes from the
bytes (``sniff_file``), not the name. Parquet's row count and the size its first row groups
decompress to come from the footer, and the preview refuses before reading when that size is
over ``PreviewLimits.max_decoded_bytes``: a few KB of zstd can hold hundreds of MB of one
repeated character. JSONL and CSV are read line by line with a cap on a line's length, in one
streaming pass that checks every line and counts the rows up to ``max_rows``. No tokenizer or
model is loaded, so a 100k-row file answers in well under a second.

``preview_untrusted`` runs the same preview in a child process under an address-space limit and
a timeout: pyarrow aborts the whole process on some damaged footers (a C++ exception it does not
catch) and trusts the sizes a footer claims, so an upload is never parsed inside the web process.

Rows are mapped by the same ``normalise_row`` the training dataset uses, so what the page shows is
what training will see. Problems are returned rather than raised, for the page to display:
``file_error`` when the file itself cannot be used (no key map fixes it), ``errors`` for all.
"""

from __future__ import annotations

import datetime
import json
import math
import resource
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from engine.data.rows import (
    FORMAT_SUFFIX,
    FORMATS,
    PARQUET_ERRORS,
    DatasetError,
    check_key_map,
    iter_raw_rows,
    normalise_row,
    sniff_file,
)

FORMAT_NAMES = {"parquet": "parquet", "jsonl": "JSON Lines", "csv": "CSV"}
DISPLAY_CHARS = 2000  # a previewed string is cut here: the page shows rows, not whole documents
DISPLAY_ITEMS = 50
DISPLAY_DEPTH = 20


@dataclass(frozen=True)
class PreviewLimits:
    """How much of an untrusted file a preview reads; each limit's message names its setting."""

    max_rows: int = 10_000_000  # POSTTRAIN_DATASET_MAX_ROWS
    max_line_bytes: int = 8 * 2**20  # POSTTRAIN_DATASET_MAX_LINE_BYTES: one JSONL or CSV line
    max_decoded_bytes: int = 64 * 2**20  # POSTTRAIN_PREVIEW_MAX_BYTES: parquet footer, first rows


@dataclass
class DatasetPreview:
    """What the upload page shows about a data file; every value is JSON-serialisable."""

    format: str
    columns: list[str] = field(default_factory=list)
    row_count: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    mapped: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    file_error: str = ""  # why the file itself cannot be used; empty when it can

    def to_dict(self) -> dict[str, Any]:
        """Return the preview as a plain dict."""
        return asdict(self)


def json_safe(value: Any) -> Any:
    """Return ``value`` with only JSON types: NaN/inf become None, unknown objects strings."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy scalar
        return json_safe(value.item())
    return str(value)


def display_text(text: str) -> str:
    """Return ``text`` storable in PostgreSQL: NUL and lone surrogates (valid JSON) replaced."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def clip_for_display(value: Any, depth: int = 0) -> Any:
    """Return ``value`` cut to what a page shows: long strings and lists, deep nesting."""
    if depth >= DISPLAY_DEPTH:
        return "…"
    if isinstance(value, bytes):
        value = value[: DISPLAY_CHARS * 4].decode("utf-8", errors="replace")
    if isinstance(value, str):
        return display_text(value if len(value) <= DISPLAY_CHARS else value[:DISPLAY_CHARS] + "…")
    if isinstance(value, dict):
        items = list(value.items())
        clipped = {
            clip_for_display(k, depth): clip_for_display(v, depth + 1)
            for k, v in items[:DISPLAY_ITEMS]
        }
        return clipped | (
            {"…": f"{len(items) - DISPLAY_ITEMS} more"} if len(items) > DISPLAY_ITEMS else {}
        )
    if isinstance(value, list | tuple | set):
        value = list(value)
        clipped_list = [clip_for_display(v, depth + 1) for v in value[:DISPLAY_ITEMS]]
        return clipped_list + (["…"] if len(value) > DISPLAY_ITEMS else [])
    return value


def prompt_as_text(messages: list[dict[str, Any]]) -> str:
    """Return a one-message prompt's content, or "role: content" blocks for a conversation."""
    if len(messages) == 1:
        return str(messages[0]["content"])
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


def _check_name(path: Path, fmt: str) -> None:
    """Refuse a file whose extension would make training read it as another format."""
    suffix = path.suffix.lower()
    if FORMATS.get(suffix) != fmt:
        raise DatasetError(
            f"{path}: holds {FORMAT_NAMES[fmt]} but its name ends in '{suffix}', and training "
            f"picks the reader by the extension; rename it to {path.stem}{FORMAT_SUFFIX[fmt]}"
        )


def _too_many_rows(path: Path, limits: PreviewLimits) -> DatasetError:
    return DatasetError(
        f"{path}: more than {limits.max_rows:,} rows, the limit POSTTRAIN_DATASET_MAX_ROWS sets; "
        "split the file or raise the limit"
    )


def _parquet_head(
    path: Path, n: int, limits: PreviewLimits
) -> tuple[list[str], int, list[tuple[str, dict[str, Any]]]]:
    """Return (columns, row count, first ``n`` rows), refusing before a read would go over."""
    cap = limits.max_decoded_bytes
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        handle.seek(size - 8)
        footer = int.from_bytes(handle.read(4), "little")
    if footer > cap or footer + 12 > size:
        raise DatasetError(
            f"{path}: its parquet footer claims {footer:,} bytes, more than the file holds or the "
            f"{cap:,} that POSTTRAIN_PREVIEW_MAX_BYTES allows; write the file again with pyarrow "
            "or pandas"
        )
    try:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata
        columns = list(parquet.schema_arrow.names)
        if meta.num_rows > limits.max_rows:
            raise _too_many_rows(path, limits)
        groups: list[int] = []
        covered = decoded = 0
        for i in range(meta.num_row_groups):
            if covered >= n:
                break
            group = meta.row_group(i)
            sizes = [group.column(c).total_uncompressed_size for c in range(group.num_columns)]
            if group.num_rows < 0 or min(sizes, default=0) < 0:
                raise DatasetError(f"{path}: row group {i} has negative sizes in its metadata")
            groups.append(i)
            covered += group.num_rows
            decoded += max(sum(sizes), group.total_byte_size)
        if decoded > cap:
            raise DatasetError(
                f"{path}: its first {covered:,} rows (row group(s) {groups}) decompress to "
                f"{decoded:,} bytes, more than the {cap:,} that POSTTRAIN_PREVIEW_MAX_BYTES "
                "allows a preview; write the file with smaller row groups (e.g. "
                "pyarrow.parquet.write_table(table, path, row_group_size=1000)) or raise the limit"
            )
        head: list[tuple[str, dict[str, Any]]] = []
        if groups:
            for batch in parquet.iter_batches(batch_size=n, row_groups=groups, use_threads=False):
                for record in batch.to_pylist()[: n - len(head)]:
                    head.append((f"{path}, row {len(head) + 1}", record))
                if len(head) >= n:
                    break
        return columns, meta.num_rows, head
    except DatasetError:
        raise
    except PARQUET_ERRORS as exc:
        raise DatasetError(f"{path}: not a readable parquet file ({exc})") from None


def _text_head(
    path: Path, n: int, limits: PreviewLimits, head: list[tuple[str, dict[str, Any]]]
) -> int:
    """Append the first ``n`` rows to ``head``; check every line, return the row count."""
    count = 0
    for location, raw in iter_raw_rows(path, max_line_bytes=limits.max_line_bytes):
        count += 1
        if count > limits.max_rows:
            raise _too_many_rows(path, limits)
        if len(head) < n:
            head.append((location, raw))
    return count


def _mapped(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": prompt_as_text(record["raw_prompt"]),
        "ground_truth": record["reward_model"].get("ground_truth"),
        "data_source": record["data_source"],
    }


def preview_dataset(
    path: str | Path,
    data_key_map: dict[str, str] | None = None,
    n: int = 5,
    limits: PreviewLimits | None = None,
) -> DatasetPreview:
    """Describe a data file: its columns, row count, first ``n`` rows raw and mapped."""
    path = Path(path).expanduser()
    limits = limits or PreviewLimits()
    preview = DatasetPreview(format="")
    try:
        key_map: dict[str, str] | None = check_key_map(data_key_map)
    except DatasetError as exc:
        key_map = None
        preview.errors.append(str(exc))
    head: list[tuple[str, dict[str, Any]]] = []
    try:
        if not path.is_file():
            raise DatasetError(f"data file not found: {path}")
        preview.format = sniff_file(path)
        _check_name(path, preview.format)
        if preview.format == "parquet":
            preview.columns, preview.row_count, head = _parquet_head(path, n, limits)
        else:
            preview.row_count = _text_head(path, n, limits, head)
            preview.columns = list(dict.fromkeys(key for _, row in head for key in row))
        if preview.row_count == 0:
            raise DatasetError(f"{path}: the file has no rows")
    except DatasetError as exc:
        preview.file_error = str(exc)
    except OSError as exc:
        preview.file_error = f"{path}: cannot read the file ({exc.strerror or exc})"
    if preview.file_error:
        preview.file_error = display_text(preview.file_error)
        preview.errors.append(preview.file_error)
    preview.columns = [clip_for_display(column) for column in preview.columns]
    if key_map is not None:
        for location, raw in head:
            try:
                record = normalise_row(
                    raw, location=location, key_map=key_map, default_source=path.stem
                )
            except DatasetError as exc:
                preview.errors.append(display_text(str(exc)))
                continue
            except RecursionError:
                preview.errors.append(f"{location}: values nested too deeply to read")
                continue
            preview.mapped.append(json_safe(clip_for_display(_mapped(record))))
    preview.rows = [json_safe(clip_for_display(row)) for _, row in head]
    return preview


def preview_untrusted(
    path: str | Path,
    data_key_map: dict[str, str] | None = None,
    n: int = 5,
    limits: PreviewLimits | None = None,
    timeout_s: float = 120.0,
) -> DatasetPreview:
    """Return ``preview_dataset``'s answer computed in a child process with bounded memory.

    A child that crashes, runs out of memory or time becomes a ``file_error`` that says so.
    """
    limits = limits or PreviewLimits()
    request = {"path": str(path), "key_map": data_key_map, "n": n, "limits": asdict(limits)}
    root = Path(__file__).resolve().parents[2]
    try:
        child = subprocess.run(
            [sys.executable, "-m", "engine.data.preview", json.dumps(request)],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        problem = f"reading it took longer than {timeout_s:.0f} s"
    else:
        if child.returncode == 0:
            return DatasetPreview(**json.loads(child.stdout))
        problem = (
            f"the reader crashed on it (signal {-child.returncode})"
            if child.returncode < 0
            else f"the reader failed ({(child.stderr.strip().splitlines() or ['?'])[-1]})"
        )
    message = (
        f"{path}: {problem}; the file is damaged or not written by a standard library: write it "
        "again with pyarrow or pandas"
    )
    return DatasetPreview(format="", errors=[message], file_error=message)


def child_memory_bytes(limits: PreviewLimits) -> int:
    """Return the address-space limit of a preview child: the interpreter, pyarrow, the rows."""
    return 1024 * 2**20 + 8 * limits.max_decoded_bytes


def _main(argv: list[str]) -> None:
    request = json.loads(argv[0])
    limits = PreviewLimits(**request["limits"])
    memory = child_memory_bytes(limits)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    preview = preview_dataset(request["path"], request["key_map"], request["n"], limits)
    sys.stdout.write(json.dumps(preview.to_dict(), allow_nan=False))


if __name__ == "__main__":
    _main(sys.argv[1:])
