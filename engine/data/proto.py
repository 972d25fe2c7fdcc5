"""``DataProto``: the batch that the single controller passes between workers.

verl's HybridFlow controller moves one object through rollout, reward, log-prob, critic and
update workers; each adds or removes columns. We keep verl's name and methods but store plain
dicts instead of a ``TensorDict``:

- ``batch``: ``str -> torch.Tensor``, every tensor shaped ``(bs, ...)``;
- ``non_tensor_batch``: ``str -> np.ndarray``, each a 1-D array of ``bs`` Python objects
  (prompts, ground truths, reward dicts);
- ``meta_info``: a dict of scalars and settings that apply to the whole batch (temperature,
  ``global_steps``...). Row operations carry it over unchanged.

It sits on the hot path, so row operations never copy a tensor that indexing does not copy
already: ``slice``, ``chunk`` and ``split`` return views, and ``select`` shares the tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

Index = int | slice | Sequence[int] | np.ndarray | torch.Tensor


def as_object_array(values: Iterable[Any]) -> np.ndarray:
    """Return a 1-D object array with one entry per value (lists stay whole entries)."""
    items = list(values)
    array = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        array[i] = item
    return array


def _same_value(a: Any, b: Any) -> bool:
    """Return True when two meta_info values or non-tensor arrays hold the same data."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        try:
            return bool(np.array_equal(a, b))
        except (ValueError, TypeError):  # object arrays holding arrays: compare entry by entry
            return all(_same_value(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False


@dataclass
class DataProtoItem:
    """One row of a ``DataProto``: tensors shaped like the batch without dim 0, plain values."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


class DataProto:
    """Tensors and per-row Python objects sharing a batch dimension, plus batch-wide meta_info.

    ``None`` for any part becomes an empty dict. Lengths are checked on construction.
    """

    __slots__ = ("batch", "non_tensor_batch", "meta_info")

    def __init__(
        self,
        batch: dict[str, torch.Tensor] | None = None,
        non_tensor_batch: dict[str, np.ndarray] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> None:
        self.batch: dict[str, torch.Tensor] = dict(batch) if batch else {}
        self.non_tensor_batch: dict[str, np.ndarray] = (
            dict(non_tensor_batch) if non_tensor_batch else {}
        )
        self.meta_info: dict[str, Any] = dict(meta_info) if meta_info else {}
        self.check_consistency()

    # ---------------------------------------------------------------- construction and checks

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor],
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build a DataProto; lists (or multi-dim arrays) of non-tensors become object arrays."""
        converted = {}
        for key, value in (non_tensors or {}).items():
            if isinstance(value, np.ndarray) and value.ndim == 1:
                converted[key] = value
            else:
                converted[key] = as_object_array(value)
        return cls(batch=tensors, non_tensor_batch=converted, meta_info=meta_info)

    def check_consistency(self) -> None:
        """Raise ValueError unless every tensor and non-tensor array has the same dim-0 length."""
        first, size = "", -1
        for key, tensor in self.batch.items():
            if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
                raise ValueError(
                    f"DataProto.batch['{key}'] must be a tensor with a batch dimension, got "
                    f"{type(tensor).__name__}"
                    f"{' with 0 dims' if isinstance(tensor, torch.Tensor) else ''}; put "
                    "batch-wide values in meta_info"
                )
            first, size = self._check_length(f"batch['{key}']", tensor.shape[0], first, size)
        for key, array in self.non_tensor_batch.items():
            if not isinstance(array, np.ndarray) or array.ndim != 1:
                raise ValueError(
                    f"DataProto.non_tensor_batch['{key}'] must be a 1-D numpy array, got "
                    f"{type(array).__name__}"
                    f"{f' with {array.ndim} dims' if isinstance(array, np.ndarray) else ''}; "
                    "use DataProto.from_dict, which wraps lists in object arrays"
                )
            first, size = self._check_length(f"non_tensor_batch['{key}']", len(array), first, size)

    @staticmethod
    def _check_length(name: str, length: int, first: str, size: int) -> tuple[str, int]:
        if size < 0:
            return name, length
        if length != size:
            raise ValueError(
                f"DataProto.{name} has {length} rows but {first} has {size}; "
                "all entries must share dim 0 (the batch size)"
            )
        return first, size

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle CPU tensors as numpy arrays (see ``_to_wire``), everything else as it is."""
        batch = {key: _to_wire(tensor) for key, tensor in self.batch.items()}
        return _from_wire, (batch, self.non_tensor_batch, self.meta_info)

    def __len__(self) -> int:
        for tensor in self.batch.values():
            return tensor.shape[0]
        for array in self.non_tensor_batch.values():
            return len(array)
        return 0

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self.batch.items())
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, "
            f"non_tensor_batch={list(self.non_tensor_batch)}, meta_info={list(self.meta_info)})"
        )

    # ---------------------------------------------------------------- columns

    @staticmethod
    def _pick(source: dict, keys: Iterable[str] | None, what: str) -> dict:
        if keys is None:
            return dict(source)
        missing = [k for k in keys if k not in source]
        if missing:
            raise KeyError(f"DataProto.{what} has no key(s) {missing}; available: {list(source)}")
        return {k: source[k] for k in keys}

    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> DataProto:
        """Return a DataProto with only the given keys (None keeps all); tensors are shared."""
        return DataProto(
            self._pick(self.batch, batch_keys, "batch"),
            self._pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch"),
            self._pick(self.meta_info, meta_info_keys, "meta_info"),
        )

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> DataProto:
        """Remove the given keys (None removes none) and return them as a new DataProto."""
        batch_keys, non_tensor_batch_keys, meta_info_keys = (
            list(batch_keys or []),
            list(non_tensor_batch_keys or []),
            list(meta_info_keys or []),
        )
        popped = self.select(batch_keys, non_tensor_batch_keys, meta_info_keys)
        for key in batch_keys:
            del self.batch[key]
        for key in non_tensor_batch_keys:
            del self.non_tensor_batch[key]
        for key in meta_info_keys:
            del self.meta_info[key]
        return popped

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other``'s keys into this DataProto in place and return it.

        A key present in both must hold equal values; otherwise ValueError names the key.
        """
        both_have_rows = (self.batch or self.non_tensor_batch) and (
            other.batch or other.non_tensor_batch
        )
        if both_have_rows and len(other) != len(self):
            raise ValueError(
                f"cannot union DataProtos of different lengths: {len(self)} and {len(other)}"
            )
        parts: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
            ("batch", self.batch, other.batch),
            ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
            ("meta_info", self.meta_info, other.meta_info),
        )
        for part, mine, theirs in parts:  # check everything before changing anything
            for key, value in theirs.items():
                if key in mine and not _same_value(mine[key], value):
                    raise ValueError(
                        f"cannot union DataProtos: {part}['{key}'] differs between the two; "
                        "pop or rename the key on one side first"
                    )
        for _, mine, theirs in parts:
            mine.update(theirs)
        return self

    # ---------------------------------------------------------------- rows

    def __getitem__(self, index: Index) -> DataProto | DataProtoItem:
        """Return one row (int) as a DataProtoItem, or the selected rows as a DataProto.

        ``index`` may be an int, a slice, a sequence or array of ints, or a boolean mask of
        length ``len(self)``. Slices return views of the tensors; index arrays copy.
        """
        if isinstance(index, int | np.integer):
            return DataProtoItem(
                {k: v[index] for k, v in self.batch.items()},
                {k: v[index] for k, v in self.non_tensor_batch.items()},
                self.meta_info,
            )
        if isinstance(index, slice):
            return DataProto(
                {k: v[index] for k, v in self.batch.items()},
                {k: v[index] for k, v in self.non_tensor_batch.items()},
                self.meta_info,
            )
        idx = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise IndexError(
                    f"boolean mask has shape {idx.shape} but the DataProto has {len(self)} rows"
                )
            idx = np.flatnonzero(idx)
        elif idx.size == 0:
            idx = idx.astype(np.int64)
        elif not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"DataProto rows are indexed by ints or a bool mask, got {idx.dtype}")
        tensor_idx = torch.from_numpy(idx.astype(np.int64, copy=False))
        return DataProto(
            {k: v[tensor_idx.to(v.device)] for k, v in self.batch.items()},
            {k: v[idx] for k, v in self.non_tensor_batch.items()},
            self.meta_info,
        )

    def slice(self, start: int | None = None, end: int | None = None) -> DataProto:
        """Return rows ``start:end`` as views."""
        return self[start:end]  # type: ignore[return-value]

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts; ValueError unless the length divides evenly."""
        if chunks <= 0 or len(self) % chunks:
            raise ValueError(
                f"cannot chunk a DataProto of size {len(self)} into {chunks} equal parts; "
                "use pad_to_divisor first or make the batch size a multiple of the chunk count"
            )
        size = len(self) // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Split into parts of ``split_size`` rows; the last part may be smaller."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Concatenate along dim 0; all parts need the same keys. meta_info comes from the first."""
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        first = data[0]
        for i, part in enumerate(data[1:], start=1):
            if part.batch.keys() != first.batch.keys() or (
                part.non_tensor_batch.keys() != first.non_tensor_batch.keys()
            ):
                raise ValueError(
                    f"DataProto.concat: part {i} has keys "
                    f"{sorted(part.batch) + sorted(part.non_tensor_batch)} but part 0 has "
                    f"{sorted(first.batch) + sorted(first.non_tensor_batch)}"
                )
        return DataProto(
            {k: torch.cat([d.batch[k] for d in data]) for k in first.batch},
            {
                k: np.concatenate([d.non_tensor_batch[k] for d in data])
                for k in first.non_tensor_batch
            },
            first.meta_info,
        )

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row: interleaved ``[a, a, b, b]`` or tiled ``[a, b, a, b]``."""
        if interleave:
            tensors = {k: v.repeat_interleave(repeat_times, dim=0) for k, v in self.batch.items()}
            objects = {k: np.repeat(v, repeat_times) for k, v in self.non_tensor_batch.items()}
        else:
            tensors = {
                k: v.repeat(repeat_times, *([1] * (v.dim() - 1))) for k, v in self.batch.items()
            }
            objects = {k: np.tile(v, repeat_times) for k, v in self.non_tensor_batch.items()}
        return DataProto(tensors, objects, self.meta_info)

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Permute the rows in place so that row ``i`` becomes old row ``indices[i]``."""
        reordered = self[
            np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices)
        ]
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def to(self, device: str | torch.device) -> DataProto:
        """Move every tensor to ``device`` in place and return self."""
        self.batch = {k: v.to(device) for k, v in self.batch.items()}
        return self

    def pad_to_divisor(self, divisor: int) -> tuple[DataProto, int]:
        """Return (padded, pad_size): rows repeated from the start until len % divisor == 0."""
        if divisor <= 0:
            raise ValueError(f"divisor must be positive, got {divisor}")
        pad_size = -len(self) % divisor
        if pad_size == 0:
            return self, 0
        if len(self) == 0:
            raise ValueError("cannot pad an empty DataProto: there are no rows to repeat")
        parts = [self]
        remaining = pad_size
        while remaining > 0:
            take = min(remaining, len(self))
            parts.append(self.slice(0, take))
            remaining -= take
        return DataProto.concat(parts), pad_size

    def unpad(self, pad_size: int) -> DataProto:
        """Drop the last ``pad_size`` rows added by ``pad_to_divisor``."""
        if not 0 <= pad_size <= len(self):
            raise ValueError(f"pad_size must be between 0 and {len(self)}, got {pad_size}")
        return self.slice(0, len(self) - pad_size) if pad_size else self


def _to_wire(tensor: torch.Tensor) -> torch.Tensor | np.ndarray:
    """Return a CPU tensor as a numpy view when numpy has its dtype, else the tensor.

    Pickle protocol 5 and Ray ship a numpy array's buffer as it is, out of band; a torch tensor
    goes through its storage's own reduction, which cost about 1.5 ms a tensor between Ray
    processes: most of a small batch's round trip to a rank.
    """
    if tensor.device.type != "cpu" or tensor.requires_grad or tensor.dtype == torch.bfloat16:
        return tensor
    return tensor.numpy()


def _from_wire(
    batch: dict[str, torch.Tensor | np.ndarray], non_tensor_batch: dict, meta_info: dict
) -> DataProto:
    """Rebuild a pickled DataProto; arrays become tensors again (copied when read-only)."""
    tensors = {}
    for key, value in batch.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value if value.flags.writeable else value.copy())
        tensors[key] = value
    return DataProto(tensors, non_tensor_batch, meta_info)


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` by repeating rows from the start; see ``DataProto.pad_to_divisor``."""
    return data.pad_to_divisor(size_divisor)


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Remove the ``pad_size`` rows added by ``pad_dataproto_to_divisor``."""
    return data.unpad(pad_size)
