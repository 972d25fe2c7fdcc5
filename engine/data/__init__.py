"""Data for the engine: the ``DataProto`` batch, prompt datasets, the loader and file previews."""

from engine.data.dataset import (
    DatasetError,
    RLHFDataset,
    collate_prompts,
    data_format,
    iter_raw_rows,
    normalise_row,
    truncate_ids,
)
from engine.data.loader import PromptDataLoader
from engine.data.preview import DatasetPreview, preview_dataset
from engine.data.proto import (
    DataProto,
    DataProtoItem,
    as_object_array,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)

__all__ = [
    "DataProto",
    "DataProtoItem",
    "DatasetError",
    "DatasetPreview",
    "PromptDataLoader",
    "RLHFDataset",
    "as_object_array",
    "collate_prompts",
    "data_format",
    "iter_raw_rows",
    "normalise_row",
    "pad_dataproto_to_divisor",
    "preview_dataset",
    "truncate_ids",
    "unpad_dataproto",
]
