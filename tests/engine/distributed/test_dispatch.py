"""Splitting batches over data-parallel ranks and gathering the results (no Ray needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.data import DataProto
from engine.distributed.worker_group import (
    ResourcePool,
    check_sharded,
    gather_batches,
    pad_rollouts,
    split_batch,
)
from engine.perf import reduce_rank_metrics
from engine.roles.batch_sizes import per_rank_size


def rows(n: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n)[:, None] * torch.ones(1, 3, dtype=torch.long)},
        {"name": np.array([f"row{i}" for i in range(n)], dtype=object)},
        {"temperature": 1.0},
    )


def test_an_odd_batch_is_padded_split_and_gathered_back_in_order():
    data = rows(5)
    chunks, pad = split_batch(data, 2, pad=True)
    assert pad == 1
    assert [c.batch["x"][:, 0].tolist() for c in chunks] == [[0, 1, 2], [3, 4, 0]]
    # Each rank answers for its own rows; the gathered answer has the padding dropped.
    outputs = [
        DataProto.from_dict({"y": c.batch["x"][:, 0] * 10}, {"name": c.non_tensor_batch["name"]})
        for c in chunks
    ]
    gathered = gather_batches(outputs, pad)
    assert gathered.batch["y"].tolist() == [0, 10, 20, 30, 40]
    assert list(gathered.non_tensor_batch["name"]) == [f"row{i}" for i in range(5)]


def test_a_batch_smaller_than_the_world_is_padded_by_repeating_rows():
    chunks, pad = split_batch(rows(1), 3, pad=True)
    assert pad == 2
    assert [c.batch["x"][:, 0].tolist() for c in chunks] == [[0], [0], [0]]
    assert len(gather_batches(chunks, pad)) == 1


def test_updates_refuse_padding_and_name_the_fix():
    with pytest.raises(ValueError, match="cannot be split evenly over 2 ranks.*train_batch_size"):
        split_batch(rows(5), 2, pad=False)
    chunks, pad = split_batch(rows(6), 2, pad=False)
    assert pad == 0 and [len(c) for c in chunks] == [3, 3]


def test_gather_keeps_the_slowest_rank_timing():
    a, b = rows(2), rows(2)
    a.meta_info = {"timing_s/update_weights": 0.5, "other": 1}
    b.meta_info = {"timing_s/update_weights": 2.0, "other": 2}
    assert gather_batches([a, b], 0).meta_info == {"timing_s/update_weights": 2.0, "other": 1}


def test_metrics_are_reduced_over_the_ranks_that_report_them_as_verl_does():
    merged = reduce_rank_metrics(
        [
            {"loss": 1.0, "lr": 0.1, "perf/max_rss_gb": 1.5, "perf/min_memory_available_gb": 9},
            {"loss": 3.0, "lr": 0.1, "kl": 4.0, "perf/max_rss_gb": 2.5},
            {"perf/max_rss_gb": 0.5, "perf/min_memory_available_gb": 7},
        ]
    )
    assert merged == pytest.approx(
        {
            "loss": 2.0,
            "lr": 0.1,
            "kl": 4.0,
            "perf/max_rss_gb": 2.5,  # a name with "max": the largest rank
            "perf/min_memory_available_gb": 7,  # with "min": the smallest
        }
    )


def test_per_rank_mini_batch_must_divide():
    assert per_rank_size(8, 2, "actor_rollout_ref.actor.ppo_mini_batch_size") == 4
    with pytest.raises(ValueError, match="ppo_mini_batch_size x rollout.n = 6 .* 4 data-parallel"):
        per_rank_size(6, 4, "actor_rollout_ref.actor.ppo_mini_batch_size")


def test_resource_pool_counts_ranks_and_asks_for_a_gpu_only_on_cuda():
    pool = ResourcePool("global_pool", (2, 2), device_type="cuda")
    assert pool.world_size == 4
    assert pool.bundle() == {"CPU": 1.0, "GPU": 1.0}
    assert ResourcePool("p", (2,), cpus_per_rank=0.5).bundle() == {"CPU": 0.5}


class FakeGroup:
    world_size = 2


def test_a_sharded_checkpoint_only_fits_a_group_of_its_size():
    state = {"format": "fsdp2_sharded", "world_size": 2, "ranks": ["r0", "r1"]}
    assert check_sharded(state, FakeGroup()) == [("r0",), ("r1",)]
    with pytest.raises(ValueError, match="shards of 4 ranks but this run has 2"):
        check_sharded({**state, "world_size": 4}, FakeGroup())
    with pytest.raises(ValueError, match="single-process trainer.*controller=local"):
        check_sharded({"model": {}}, FakeGroup())


def rollout(responses: list[list[int]], prompt_len: int = 2) -> DataProto:
    """Return a rank's rollout: every response token is real (mask 1), log-prob -0.5, with the
    reference pass (log-prob -0.7) the rollout call computes for training."""
    resp = torch.tensor(responses)
    prompts = torch.full((len(responses), prompt_len), 9)
    response_mask = torch.ones_like(resp)
    attention_mask = torch.cat([torch.ones_like(prompts), response_mask], dim=-1)
    return DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": resp,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, resp], dim=-1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "rollout_log_probs": torch.full(resp.shape, -0.5),
            "ref_log_prob": torch.full(resp.shape, -0.7),
        }
    )


def test_rollouts_of_different_lengths_are_padded_like_one_rollout():
    short, long = pad_rollouts([rollout([[5]]), rollout([[6, 7, 8]])], pad_token_id=0)
    assert long.batch["responses"].tolist() == [[6, 7, 8]]
    assert short.batch["responses"].tolist() == [[5, 0, 0]]
    assert short.batch["response_mask"].tolist() == [[1, 0, 0]]
    assert short.batch["rollout_log_probs"].tolist() == [[-0.5, 0.0, 0.0]]
    torch.testing.assert_close(short.batch["ref_log_prob"], torch.tensor([[-0.7, 0.0, 0.0]]))
    assert short.batch["input_ids"].tolist() == [[9, 9, 5, 0, 0]]
    assert short.batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0]]
    assert short.batch["position_ids"].tolist() == [[0, 1, 2, 2, 2]]
    assert short.batch["prompts"].tolist() == [[9, 9]]
    assert len(gather_batches([short, long], 0)) == 2


def test_an_unknown_column_of_uneven_width_is_named():
    a, b = rollout([[5]]), rollout([[6, 7]])
    a.batch["token_scores"], b.batch["token_scores"] = torch.zeros(1, 1), torch.zeros(1, 2)
    with pytest.raises(ValueError, match="'token_scores' has different widths"):
        pad_rollouts([a, b], pad_token_id=0)
