"""DataProto on CPU: construction checks, column and row operations, padding."""

import numpy as np
import pytest
import torch

from engine.data.proto import (
    DataProto,
    DataProtoItem,
    as_object_array,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)


def make(n: int = 4) -> DataProto:
    """Return n rows: ids[i] = [i, 10 + i], score[i] = i / 10, name[i] = "r<i>", gt[i] = [i]."""
    return DataProto.from_dict(
        {
            "ids": torch.stack([torch.arange(n), torch.arange(n) + 10], dim=1),
            "score": torch.arange(n, dtype=torch.float32) / 10,
        },
        {"name": [f"r{i}" for i in range(n)], "gt": [[i] for i in range(n)]},
        {"temperature": 1.0},
    )


def names(data: DataProto) -> list[str]:
    return list(data.non_tensor_batch["name"])


def test_from_dict_wraps_lists_in_1d_object_arrays():
    data = make(3)
    assert len(data) == 3
    gt = data.non_tensor_batch["gt"]
    assert gt.dtype == object and gt.shape == (3,) and gt[2] == [2]


def test_length_mismatch_names_both_keys_and_lengths():
    with pytest.raises(ValueError, match=r"batch\['b'\] has 2 rows but batch\['a'\] has 3"):
        DataProto({"a": torch.zeros(3), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['x'\] has 4 rows.*has 3"):
        DataProto.from_dict({"a": torch.zeros(3)}, {"x": [1, 2, 3, 4]})


def test_rejects_scalar_tensor_and_2d_object_array():
    with pytest.raises(ValueError, match="meta_info"):
        DataProto({"a": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="1-D numpy array.*from_dict"):
        DataProto(non_tensor_batch={"x": np.zeros((2, 2))})


def test_empty_dataproto_has_length_zero():
    assert len(DataProto()) == 0
    assert len(DataProto(non_tensor_batch={"x": as_object_array(["a", "b"])})) == 2


def test_select_shares_tensors_and_keeps_all_by_default():
    data = make()
    picked = data.select(batch_keys=["ids"], non_tensor_batch_keys=[], meta_info_keys=[])
    assert list(picked.batch) == ["ids"] and not picked.non_tensor_batch and not picked.meta_info
    assert picked.batch["ids"] is data.batch["ids"]
    assert data.select().batch.keys() == data.batch.keys()
    with pytest.raises(KeyError, match=r"no key\(s\) \['nope'\]; available: \['ids', 'score'\]"):
        data.select(batch_keys=["nope"])


def test_pop_removes_only_named_keys():
    data = make()
    popped = data.pop(batch_keys=["score"], non_tensor_batch_keys=["gt"])
    assert list(popped.batch) == ["score"] and list(popped.non_tensor_batch) == ["gt"]
    assert list(data.batch) == ["ids"] and list(data.non_tensor_batch) == ["name"]
    assert data.meta_info == {"temperature": 1.0} and popped.meta_info == {}


def test_union_merges_and_rejects_conflicts():
    data = make()
    other = DataProto.from_dict(
        {"ids": data.batch["ids"].clone(), "reward": torch.ones(4)},
        {"name": names(data)},
        {"step": 3},
    )
    merged = data.union(other)
    assert merged is data
    assert set(data.batch) == {"ids", "score", "reward"} and data.meta_info["step"] == 3
    clash = DataProto.from_dict({"reward": torch.zeros(4)})
    with pytest.raises(ValueError, match=r"batch\['reward'\] differs"):
        data.union(clash)
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] differs"):
        data.union(DataProto(meta_info={"temperature": 0.5}))
    with pytest.raises(ValueError, match="different lengths: 4 and 2"):
        data.union(DataProto.from_dict({"x": torch.zeros(2)}))


def test_union_conflict_leaves_data_unchanged():
    data = make()
    other = DataProto.from_dict({"new": torch.ones(4)}, {"name": ["a", "b", "c", "d"]})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['name'\] differs"):
        data.union(other)
    assert "new" not in data.batch


def test_getitem_int_slice_array_and_mask():
    data = make(5)
    row = data[2]
    assert isinstance(row, DataProtoItem)
    assert row.batch["ids"].tolist() == [2, 12] and row.non_tensor_batch["name"] == "r2"
    sliced = data[1:3]
    assert names(sliced) == ["r1", "r2"] and sliced.meta_info == {"temperature": 1.0}
    assert sliced.batch["ids"].data_ptr() == data.batch["ids"][1:].data_ptr()  # a view
    assert names(data[[4, 0]]) == ["r4", "r0"]
    assert data[np.array([3, 1])].batch["ids"][:, 0].tolist() == [3, 1]
    assert names(data[torch.tensor([0, 0])]) == ["r0", "r0"]
    mask = torch.tensor([True, False, True, False, True])
    assert names(data[mask]) == ["r0", "r2", "r4"]
    assert len(data[[]]) == 0
    with pytest.raises(IndexError, match=r"mask has shape \(2,\) but the DataProto has 5 rows"):
        data[np.array([True, False])]


def test_slice_chunk_and_split():
    data = make(6)
    assert names(data.slice(4, 6)) == ["r4", "r5"]
    chunks = data.chunk(3)
    assert [names(c) for c in chunks] == [["r0", "r1"], ["r2", "r3"], ["r4", "r5"]]
    with pytest.raises(ValueError, match="size 6 into 4 equal parts"):
        data.chunk(4)
    parts = data.split(4)
    assert [len(p) for p in parts] == [4, 2]


def test_concat_of_split_equals_original():
    data = make(7)
    again = DataProto.concat(data.split(3))
    assert torch.equal(again.batch["ids"], data.batch["ids"])
    assert torch.equal(again.batch["score"], data.batch["score"])
    assert names(again) == names(data) and list(again.non_tensor_batch["gt"]) == [
        [i] for i in range(7)
    ]
    assert again.meta_info == data.meta_info


def test_concat_needs_matching_keys():
    with pytest.raises(ValueError, match="part 1 has keys"):
        DataProto.concat([make(2), make(2).select(batch_keys=["ids"])])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


def test_repeat_interleaved_and_tiled():
    data = make(2)
    inter = data.repeat(3, interleave=True)
    assert names(inter) == ["r0", "r0", "r0", "r1", "r1", "r1"]
    assert inter.batch["ids"][:, 0].tolist() == [0, 0, 0, 1, 1, 1]
    assert inter.batch["ids"].shape == (6, 2)
    tiled = data.repeat(2, interleave=False)
    assert names(tiled) == ["r0", "r1", "r0", "r1"]
    assert tiled.batch["ids"].tolist() == [[0, 10], [1, 11], [0, 10], [1, 11]]
    assert list(tiled.non_tensor_batch["gt"]) == [[0], [1], [0], [1]]


def test_reorder_in_place():
    data = make(3)
    data.reorder(torch.tensor([2, 0, 1]))
    assert names(data) == ["r2", "r0", "r1"] and data.batch["ids"][:, 0].tolist() == [2, 0, 1]


def test_to_moves_tensors_and_returns_self():
    data = make(2)
    assert data.to("cpu") is data and data.batch["ids"].device.type == "cpu"


def test_pad_unpad_round_trip_repeats_rows_from_the_start():
    data = make(5)
    padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert pad_size == 3 and len(padded) == 8
    assert names(padded) == ["r0", "r1", "r2", "r3", "r4", "r0", "r1", "r2"]
    back = unpad_dataproto(padded, pad_size)
    assert names(back) == names(data) and torch.equal(back.batch["ids"], data.batch["ids"])
    assert data.pad_to_divisor(5) == (data, 0)


def test_pad_beyond_length_cycles_rows():
    padded, pad_size = make(2).pad_to_divisor(7)
    assert pad_size == 5 and names(padded) == ["r0", "r1", "r0", "r1", "r0", "r1", "r0"]
    assert names(padded.unpad(pad_size)) == ["r0", "r1"]
    with pytest.raises(ValueError, match="pad_size must be between 0 and 7"):
        padded.unpad(9)


def test_pickle_round_trip_keeps_every_dtype_and_gives_writable_tensors():
    import pickle

    batch = {
        "ids": torch.arange(12).reshape(3, 4),
        "mask": torch.tensor([[True, False], [True, True], [False, False]]),
        "logp": torch.randn(3, 4),
        "half": torch.randn(3, 2).to(torch.bfloat16),  # numpy has no bfloat16: stays a tensor
        "strided": torch.arange(24).reshape(3, 8)[:, ::2],  # a non-contiguous view
    }
    data = DataProto.from_dict(batch, {"uid": ["a", "b", "c"]}, {"temperature": 0.7})
    copy = pickle.loads(pickle.dumps(data, protocol=5))
    assert set(copy.batch) == set(batch)
    for key, tensor in batch.items():
        assert copy.batch[key].dtype == tensor.dtype, key
        assert torch.equal(copy.batch[key], tensor), key
    assert copy.non_tensor_batch["uid"].tolist() == ["a", "b", "c"]
    assert copy.meta_info == {"temperature": 0.7}
    copy.batch["ids"] += 1  # the copy owns writable memory, apart from the original
    assert int(batch["ids"][0, 0]) == 0
