"""Prompt datasets: read verl parquet, JSON Lines or CSV rows and turn them into prompt tensors.

Every row becomes verl's record: ``prompt`` as chat messages, ``data_source``, ``ability``,
``reward_model`` (with ``ground_truth``) and ``extra_info``. Files that do not use those names
are mapped with ``data.data_key_map`` (target -> source column, e.g.
``{"prompt": "question", "ground_truth": "answer"}``); without a mapping each target is read
from the column of the same name. A plain-string prompt becomes one user message. A row without
a ``data_source`` gets the file's stem (``gsm8k_train.jsonl`` -> ``gsm8k_train``), which is the
name rewards are dispatched by. Columns that are none of these go into ``extra_info``.

Malformed input fails at load time with ``DatasetError`` naming the file, the line (JSONL, CSV)
or row (parquet), what is wrong and the setting that fixes it. Prompts longer than
``data.max_prompt_length`` are checked at load time too, so a run never dies on its 500th batch:
``filter_overlong_prompts`` drops them, ``truncation="error"`` refuses the dataset, and
``left``/``right``/``middle`` cut the tokens when an item is read (as verl's ``RLHFDataset``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from engine.data.proto import DataProto, as_object_array

FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}
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


def iter_raw_rows(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (location, row) for each row; location reads "<file>, line 3" or "<file>, row 3"."""
    path = Path(path).expanduser()
    fmt = data_format(path)
    if not path.is_file():
        raise DatasetError(f"data file not found: {path}; check data.train_files / val_files")
    if fmt == "parquet":
        yield from _iter_parquet(path)
    elif fmt == "jsonl":
        yield from _iter_jsonl(path)
    else:
        yield from _iter_csv(path)


def _iter_parquet(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
        row = 0
        for batch in batches:
            for record in batch.to_pylist():
                row += 1
                yield f"{path}, row {row}", record
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path}: not a readable parquet file ({exc})") from exc


def _iter_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                location = f"{path}, line {number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    hint = (
                        " This looks like one JSON array; write one object per line (JSON Lines)"
                        if number == 1 and line.lstrip().startswith("[")
                        else " Each line must be one complete JSON object"
                    )
                    raise DatasetError(f"{location}: invalid JSON ({exc.msg}).{hint}") from exc
                if not isinstance(record, dict):
                    raise DatasetError(
                        f'{location}: expected a JSON object like {{"prompt": ...}}, got '
                        f"{type(record).__name__}; write one object per line"
                    )
                yield location, record
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc}); save the file as UTF-8") from exc


def _iter_csv(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
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
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc}); save the file as UTF-8") from exc


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


def _setting(config: Any, name: str, default: Any) -> Any:
    """Return ``config.<name>``, or verl's default when it is missing or null."""
    value = getattr(config, name, None)
    return default if value is None else value


class RLHFDataset:
    """Prompts from one or more files, read by verl's ``data.*`` settings.

    ``config`` is any object with verl's data attributes (``prompt_key``, ``max_prompt_length``,
    ``truncation``, ``filter_overlong_prompts``, ``data_key_map``, ``reward_fn_key``); missing
    ones take verl's defaults. ``item["index"]`` is the row's position in the concatenated files
    before filtering, so it names the same prompt whatever the filter drops.
    """

    def __init__(self, data_files: str | Path | Sequence[str | Path], tokenizer: Any, config: Any):
        files = [data_files] if isinstance(data_files, str | Path) else list(data_files)
        self.tokenizer = tokenizer
        self.prompt_key: str = _setting(config, "prompt_key", "prompt")
        self.max_prompt_length: int = int(_setting(config, "max_prompt_length", 1024))
        self.truncation: str = _setting(config, "truncation", "error")
        self.filter_overlong_prompts = bool(_setting(config, "filter_overlong_prompts", False))
        self.reward_fn_key: str = _setting(config, "reward_fn_key", "data_source")
        self.key_map = check_key_map(_setting(config, "data_key_map", None))
        if self.truncation not in TRUNCATION_MODES:
            raise DatasetError(
                f"data.truncation='{self.truncation}' is not one of {list(TRUNCATION_MODES)}"
            )
        if self.max_prompt_length <= 0:
            raise DatasetError(
                f"data.max_prompt_length must be positive, got {self.max_prompt_length}"
            )
        if getattr(tokenizer, "chat_template", None) is None:
            raise DatasetError(
                "the tokenizer has no chat_template, so prompts cannot be formatted; use a chat "
                "(instruct) model's tokenizer or set tokenizer.chat_template"
            )
        if not files:
            raise DatasetError("no data files given; set data.train_files (and data.val_files)")
        self.rows: list[dict[str, Any]] = []
        self.locations: list[str] = []
        for path in files:
            self._load(Path(path))
        self.num_filtered = 0
        if self.filter_overlong_prompts or self.truncation == "error":
            self._check_lengths()
        if not self.rows:
            raise DatasetError(
                f"no prompts in {[str(f) for f in files]}"
                + (
                    f": all {self.num_filtered} were longer than data.max_prompt_length="
                    f"{self.max_prompt_length}; raise it"
                    if self.num_filtered
                    else "; the files are empty"
                )
            )

    def _load(self, path: Path) -> None:
        for location, raw in iter_raw_rows(path):
            record = normalise_row(
                raw,
                location=location,
                key_map=self.key_map,
                prompt_key=self.prompt_key,
                default_source=path.stem,
            )
            if self.reward_fn_key not in RECORD_KEYS:
                if self.reward_fn_key not in record["extra_info"]:
                    raise DatasetError(
                        f"{location}: no column '{self.reward_fn_key}' for data.reward_fn_key; "
                        f"columns are {list(raw)}; set data.reward_fn_key=data_source"
                    )
                record[self.reward_fn_key] = record["extra_info"][self.reward_fn_key]
            record["index"] = len(self.rows)
            self.rows.append(record)
            self.locations.append(location)

    def _check_lengths(self) -> None:
        """Drop (filter) or reject (truncation=error) prompts over max_prompt_length."""
        lengths: list[int] = []
        for start in range(0, len(self.rows), 1024):
            texts = [self.prompt_text(row["raw_prompt"]) for row in self.rows[start : start + 1024]]
            encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            lengths.extend(len(ids) for ids in encoded)
        keep = [n <= self.max_prompt_length for n in lengths]
        if self.filter_overlong_prompts:
            self.num_filtered = keep.count(False)
            self.rows = [row for row, ok in zip(self.rows, keep, strict=True) if ok]
            self.locations = [loc for loc, ok in zip(self.locations, keep, strict=True) if ok]
        elif not all(keep):
            i = keep.index(False)
            raise DatasetError(
                f"{self.locations[i]}: prompt is {lengths[i]} tokens, longer than "
                f"data.max_prompt_length={self.max_prompt_length}; raise data.max_prompt_length "
                "or set data.filter_overlong_prompts=True (or data.truncation=left|right|middle)"
            )

    def prompt_text(self, messages: list[dict[str, Any]]) -> str:
        """Return the messages rendered by the tokenizer's chat template, ready for generation."""
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Return one prompt: ``input_ids`` (prompt_len,) unpadded, plus its record fields.

        ``prompt_text`` is the templated string before truncation.
        """
        row = self.rows[i]
        text = self.prompt_text(row["raw_prompt"])
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = truncate_ids(ids, self.max_prompt_length, self.truncation)
        item = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "prompt_text": text,
            **{key: row[key] for key in RECORD_KEYS},
            "index": row["index"],
        }
        if self.reward_fn_key not in item:
            item[self.reward_fn_key] = row[self.reward_fn_key]
        return item


def collate_prompts(items: Sequence[dict[str, Any]], pad_token_id: int | None) -> DataProto:
    """Left-pad a list of dataset items into a DataProto.

    Tensors: ``input_ids``, ``attention_mask``, ``position_ids``, each (bs, max_prompt_len) with
    padding on the left; every other item key becomes a non-tensor column.
    """
    if not items:
        raise ValueError("collate_prompts needs at least one item")
    if pad_token_id is None:
        raise ValueError(
            "the tokenizer has no pad_token_id; set tokenizer.pad_token (often to the EOS token)"
        )
    lengths = [len(item["input_ids"]) for item in items]
    width = max(lengths)
    input_ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)  # (bs, width)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)  # (bs, width)
    for row, (item, length) in enumerate(zip(items, lengths, strict=True)):
        if length:
            input_ids[row, width - length :] = item["input_ids"]
            attention_mask[row, width - length :] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # (bs, width)
    non_tensors = {
        key: as_object_array(item[key] for item in items) for key in items[0] if key != "input_ids"
    }
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors,
    )
