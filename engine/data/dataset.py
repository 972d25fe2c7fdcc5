"""Prompt datasets: verl records (``engine.data.rows``) turned into prompt tensors.

``RLHFDataset`` reads every file with ``engine.data.rows`` (verl parquet, JSON Lines or CSV,
mapped by ``data.data_key_map``), so malformed input fails at load time with ``DatasetError``
naming the file, the line or row, what is wrong and the setting that fixes it. Prompts longer
than ``data.max_prompt_length`` are checked at load time too, so a run never dies on its 500th
batch: ``filter_overlong_prompts`` drops them, ``truncation="error"`` refuses the dataset, and
``left``/``right``/``middle`` cut the tokens when an item is read (as verl's ``RLHFDataset``).
A file listed in ``data.file_key_maps`` (by its name in the config, ``names``) is read with its
own map instead of ``data_key_map``, and one listed in ``data.file_data_sources`` gets that
``data_source`` where its rows have none (else its file name, as verl).
``max_samples`` (``data.train_max_samples`` / ``data.val_max_samples``) keeps N rows before that
check, chosen as verl chooses them: the first N, or with ``data.shuffle`` N drawn without
replacement by ``numpy.random.default_rng(data.seed)``. Prompts are rendered with
``data.apply_chat_template_kwargs`` passed to the chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from engine.data.proto import DataProto, as_object_array
from engine.data.rows import (
    FORMATS,
    MAP_TARGETS,
    RECORD_KEYS,
    TRUNCATION_MODES,
    DatasetError,
    check_key_map,
    data_format,
    iter_raw_rows,
    normalise_row,
    truncate_ids,
)

if TYPE_CHECKING:
    from engine.config import DataConfig

__all__ = [
    "FORMATS",
    "PromptDataset",
    "MAP_TARGETS",
    "RECORD_KEYS",
    "TRUNCATION_MODES",
    "DatasetError",
    "RLHFDataset",
    "check_key_map",
    "collate_prompts",
    "data_format",
    "iter_raw_rows",
    "normalise_row",
    "truncate_ids",
]


def _setting(config: DataConfig, name: str, default: Any) -> Any:
    """Return ``config.<name>``, or verl's default when it is missing or null."""
    value = getattr(config, name, None)
    return default if value is None else value


class PromptDataset(Dataset):
    """Records made into prompts by verl's ``data.*`` settings; the subclass says where the
    records come from.

    ``config`` is the ``data`` section (``DataConfig``, or verl's ``DictConfig`` of it); of its
    keys this reads ``prompt_key``, ``max_prompt_length``, ``truncation``,
    ``filter_overlong_prompts``, ``data_key_map``, ``reward_fn_key``, ``return_raw_chat`` and
    ``apply_chat_template_kwargs``, and a null one takes verl's default.
    """

    def __init__(self, tokenizer: Any, config: DataConfig):
        self.tokenizer = tokenizer
        self.prompt_key: str = _setting(config, "prompt_key", "prompt")
        self.max_prompt_length: int = int(_setting(config, "max_prompt_length", 1024))
        self.truncation: str = _setting(config, "truncation", "error")
        self.filter_overlong_prompts = bool(_setting(config, "filter_overlong_prompts", False))
        self.reward_fn_key: str = _setting(config, "reward_fn_key", "data_source")
        self.key_map = check_key_map(_setting(config, "data_key_map", None))
        self.return_raw_chat = bool(_setting(config, "return_raw_chat", False))
        self.chat_template_kwargs = dict(_setting(config, "apply_chat_template_kwargs", {}))
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

    def __len__(self) -> int:
        """Return the number of prompts (the subclass's records)."""
        raise NotImplementedError

    def prompt_text(self, messages: list[dict[str, Any]]) -> str:
        """Return the messages rendered by the tokenizer's chat template, ready for generation."""
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )

    def add_reward_key(self, record: dict[str, Any], columns: list[str], location: str) -> None:
        """Give ``record`` its ``data.reward_fn_key`` column when that is not a record key: the
        row's extra column of that name; ``columns`` (the row's) are named when it has none."""
        if self.reward_fn_key in RECORD_KEYS:
            return
        if self.reward_fn_key not in record["extra_info"]:
            raise DatasetError(
                f"{location}: no column '{self.reward_fn_key}' for data.reward_fn_key; "
                f"columns are {columns}; set data.reward_fn_key=data_source"
            )
        record[self.reward_fn_key] = record["extra_info"][self.reward_fn_key]

    def prompt_item(self, row: dict[str, Any], location: str) -> dict[str, Any]:
        """Return one prompt: ``input_ids`` (prompt_len,) unpadded, plus the record's fields.

        ``row`` is a record (``RECORD_KEYS``, ``index`` and the ``reward_fn_key`` column) found
        at ``location``; ``prompt_text`` is the templated string before truncation.
        """
        text = self.prompt_text(row["raw_prompt"])
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_length and self.truncation == "error":
            raise DatasetError(
                f"{location}: prompt is {len(ids)} tokens, longer than data.max_prompt_length="
                f"{self.max_prompt_length}; raise data.max_prompt_length or set "
                "data.truncation=left|right|middle"
            )
        ids = truncate_ids(ids, self.max_prompt_length, self.truncation)
        item = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "prompt_text": text,
            **{key: row[key] for key in RECORD_KEYS},
            "index": row["index"],
        }
        if self.reward_fn_key not in item:
            item[self.reward_fn_key] = row[self.reward_fn_key]
        if self.return_raw_chat:
            # The column is always in the batch (multi-turn rollouts start from it); the flag
            # also hands the messages to the reward function, in its extra_info.
            item["extra_info"] = {**(row["extra_info"] or {}), "raw_prompt": row["raw_prompt"]}
        return item


class RLHFDataset(PromptDataset):
    """Prompts from one or more files, read by verl's ``data.*`` settings.

    Besides ``PromptDataset``'s keys it reads ``file_key_maps``, ``file_data_sources``,
    ``shuffle`` and ``seed``. ``item["index"]`` is the row's position in the concatenated files
    before selection and filtering, so it names the same prompt whatever is dropped. Every item carries
    the prompt's chat messages as ``raw_prompt`` (as verl 0.7's dataset does); with
    ``return_raw_chat`` its ``extra_info`` also holds them under ``raw_prompt``, so the reward
    function sees the conversation, not only the response. ``max_samples`` > 0 keeps that many
    rows (all when the files hold fewer); -1 or 0 keeps all. ``processor`` is verl's argument
    for multimodal data, which this engine refuses; it is taken so that verl's call
    (``data.custom_cls``: ``cls(data_files=, tokenizer=, processor=, config=, max_samples=)``)
    builds a subclass.
    """

    def __init__(
        self,
        data_files: str | Path | Sequence[str | Path],
        tokenizer: Any,
        config: DataConfig,
        processor: Any = None,
        max_samples: int = -1,
        names: Sequence[str] | None = None,
    ):
        """``names``: the files as the config names them (``tiny://val.parquet``), one per file,
        for ``data.file_key_maps`` and ``data.file_data_sources``; default: the paths."""
        super().__init__(tokenizer, config)
        files = [data_files] if isinstance(data_files, str | Path) else list(data_files)
        names = [str(f) for f in files] if names is None else list(names)
        self.file_key_maps = {
            str(k): check_key_map(v) for k, v in _setting(config, "file_key_maps", {}).items()
        }
        self.file_data_sources = dict(_setting(config, "file_data_sources", {}))
        if not files:
            raise DatasetError("no data files given; set data.train_files (and data.val_files)")
        self.rows: list[dict[str, Any]] = []
        self.locations: list[str] = []
        for path, name in zip(files, names, strict=True):
            self._load(Path(path), name)
        self._select(max_samples, bool(_setting(config, "shuffle", False)), config)
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

    def _load(self, path: Path, name: str) -> None:
        key_map = self.file_key_maps.get(name, self.key_map)
        for location, raw in iter_raw_rows(path):
            record = normalise_row(
                raw,
                location=location,
                key_map=key_map,
                prompt_key=self.prompt_key,
                default_source=self.file_data_sources.get(name) or path.stem,
            )
            self.add_reward_key(record, list(raw), location)
            record["index"] = len(self.rows)
            self.rows.append(record)
            self.locations.append(location)

    def _select(self, max_samples: int, shuffle: bool, config: DataConfig) -> None:
        """Keep ``max_samples`` rows as verl's dataset does: the first ones, or a seeded draw."""
        total = len(self.rows)
        if not 0 < max_samples < total:
            return
        if shuffle:
            import numpy as np

            seed = getattr(config, "seed", None)
            rng = np.random.default_rng(*(() if seed is None else (seed,)))
            indices = rng.choice(total, size=max_samples, replace=False).tolist()
        else:
            indices = list(range(max_samples))
        self.rows = [self.rows[i] for i in indices]
        self.locations = [self.locations[i] for i in indices]

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

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Return one prompt (``PromptDataset.prompt_item``)."""
        return self.prompt_item(self.rows[i], self.locations[i])


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
