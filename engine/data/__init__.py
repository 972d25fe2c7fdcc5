"""Data for the engine: the ``DataProto`` batch, prompt datasets, the loader and file previews.

Names are imported on first use, so that ``engine.data.rows`` and ``engine.data.preview`` (what
the web process uses to check and preview uploads) load without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {
    "DataProto": "proto",
    "DataProtoItem": "proto",
    "as_object_array": "proto",
    "pad_dataproto_to_divisor": "proto",
    "unpad_dataproto": "proto",
    "RLHFDataset": "dataset",
    "collate_prompts": "dataset",
    "DatasetError": "rows",
    "data_format": "rows",
    "iter_raw_rows": "rows",
    "normalise_row": "rows",
    "truncate_ids": "rows",
    "PromptDataLoader": "loader",
    "RLDataLoader": "loader",
    "DatasetPreview": "preview",
    "preview_dataset": "preview",
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"engine.data.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))
