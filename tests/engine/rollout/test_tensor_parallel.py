"""One rollout engine over several ranks: the ranks of a tensor-parallel group ask it for the
group's prompts together and each keeps its own rows (gloo, a recording engine in place of vLLM);
before vLLM starts on a CPU, the shared memory killed ranks of the group left is removed.

Four ranks with tensor_model_parallel_size=2 are two engines: ranks 0 and 1, ranks 2 and 3. Each
rank holds a share of another size; every rank of an engine must hand it the same prompts, in
rank order, and get back exactly its own rows, in its own order.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.data import DataProto
from engine.rollout.tensor_parallel import engine_seed, tensor_parallel_group

WORLD, TP = 4, 2
KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


def share(rank: int) -> DataProto:
    """Return rank's prompts: rank + 1 rows of width 3, ids and uids naming rank and row."""
    rows = rank + 1
    ids = torch.tensor([[0, 10 * rank + row, 1] for row in range(rows)])
    uids = np.array([f"{rank}-{row}" for row in range(rows)], dtype=object)
    return DataProto({"input_ids": ids}, {"uid": uids}, {"rank": rank})


class RecordingEngine:
    """Answer every prompt row with its ids + 1000 and record what it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []
        self.loaded: Any = None

    def load_weights(self, weights: Any) -> str:
        self.loaded = weights
        return "loaded"

    def generate_sequences(
        self, prompts: DataProto, *, max_new_tokens: int, sampling: dict, generator: Any = None
    ) -> DataProto:
        self.asked = prompts.batch["input_ids"][:, 1].tolist()
        self.meta = dict(prompts.meta_info)
        responses = prompts.batch["input_ids"] + 1000
        return DataProto(
            {"responses": responses}, prompts.non_tensor_batch, {"max_new_tokens": max_new_tokens}
        )


# What killed ranks of both engines left in a shared-memory folder, and a name of no engine's.
STALE = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "-tp:0-[2-3]-cpushm_0", "psm_1"]


def _rank(rank: int, port: int, out: str) -> None:
    from engine.distributed.process_group import init_process_group
    from engine.rollout.tensor_parallel import TensorParallelShare, cpu_engine_start

    init_process_group(rank=rank, world_size=WORLD, host="127.0.0.1", port=port, backend="gloo")
    with cpu_engine_start(TP, str(Path(out, "shm"))):
        pass
    try:
        tensor_parallel_group(3, KEY)
        refused = ""
    except ValueError as error:
        refused = str(error)
    group = tensor_parallel_group(TP, KEY)
    assert group is not None
    engine = RecordingEngine()
    rollout = TensorParallelShare(engine, group)
    out_rows = rollout.generate_sequences(share(rank), max_new_tokens=5, sampling={})
    uneven = share(rank)
    uneven.batch["input_ids"] = torch.nn.functional.pad(uneven.batch["input_ids"], (rank % 2, 0))
    try:
        rollout.generate_sequences(uneven, max_new_tokens=5, sampling={})
        uneven_refused = ""
    except ValueError as error:
        uneven_refused = str(error)
    result = {
        "uneven_refused": uneven_refused,
        "asked": engine.asked,
        "meta_in": engine.meta,
        "responses": out_rows.batch["responses"][:, 1].tolist(),
        "uids": out_rows.non_tensor_batch["uid"].tolist(),
        "meta_out": out_rows.meta_info,
        "loaded": rollout.load_weights("policy") == "loaded" and engine.loaded == "policy",
        "no_group_for_one": tensor_parallel_group(1, KEY) is None,
        "refused": refused,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    # Leave together: a rank that exits while rank 0's store or a peer's gloo pair is still in
    # use aborts its neighbours ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def test_the_ranks_of_an_engine_generate_the_groups_prompts_and_keep_their_own(tmp_path):
    from engine.distributed.process_group import free_port

    (tmp_path / "shm").mkdir()
    for name in STALE:
        (tmp_path / "shm" / name).write_bytes(b"")
    mp.spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=WORLD)
    # the stale names of both groups are gone, another program's stay; each group's lock stays
    left = sorted(p.name for p in (tmp_path / "shm").iterdir())
    assert left == ["posttrain-vllm-[0-1].lock", "posttrain-vllm-[2-3].lock", "psm_1"]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    ids = {r: share(r).batch["input_ids"][:, 1].tolist() for r in range(WORLD)}
    for rank, result in enumerate(results):
        first = rank - rank % TP  # the first rank of this rank's engine
        assert result["asked"] == ids[first] + ids[first + 1], f"rank {rank}"
        assert result["meta_in"] == {"rank": rank}  # each rank's own meta_info reaches its engine
        assert result["responses"] == [i + 1000 for i in ids[rank]], f"rank {rank}"
        assert result["uids"] == share(rank).non_tensor_batch["uid"].tolist()
        assert result["meta_out"] == {"max_new_tokens": 5}
        assert result["loaded"] and result["no_group_for_one"]
        assert result["uneven_refused"].startswith(
            "the ranks of one rollout engine hold prompts of widths [(3,), (4,)]"
        )
        assert result["refused"] == (
            f"{KEY}=3 must divide the 4 ranks of the actor (trainer.nnodes x "
            "trainer.n_gpus_per_node): each rollout engine is that many consecutive ranks"
        )


def test_a_single_rank_needs_no_group():
    assert tensor_parallel_group(2, KEY) is None  # no process group: the engine is whole


@pytest.mark.parametrize(
    ("rank", "tp", "seed"), [(0, 1, 7), (1, 1, 8), (0, 2, 7), (1, 2, 7), (2, 2, 8), (3, 2, 8)]
)
def test_the_ranks_of_one_engine_sample_with_one_seed(rank, tp, seed):
    assert engine_seed(7, rank, tp) == seed


@pytest.fixture
def one_rank(fresh_group):
    """A one-rank gloo world in this process (or the one an earlier test left)."""
    from engine.distributed.process_group import free_port, init_process_group

    if not dist.is_initialized():
        init_process_group(rank=0, world_size=1, host="127.0.0.1", port=free_port(), backend="gloo")


def _held(path: Path) -> int:
    """Hold ``path``'s lock from another open file, as another run's engine start would."""
    descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor


def test_an_engine_start_waits_while_another_over_the_same_ranks_starts(tmp_path, one_rank):
    from engine.rollout.tensor_parallel import cpu_engine_start

    other = _held(tmp_path / "posttrain-vllm-[0].lock")
    (tmp_path / "-tp:0-[0]-cpushm_0").write_bytes(b"")  # the other engine's, being made
    started = threading.Event()

    def start() -> None:
        with cpu_engine_start(1, str(tmp_path)):
            started.set()

    thread = threading.Thread(target=start)
    thread.start()
    assert not started.wait(1.0), "started while the other engine's start held the lock"
    assert (tmp_path / "-tp:0-[0]-cpushm_0").exists()  # nothing of the other's removed meanwhile
    os.close(other)
    thread.join(10)
    assert started.is_set()
    assert not (tmp_path / "-tp:0-[0]-cpushm_0").exists()  # left over once the other had started


def test_an_engine_start_held_up_too_long_says_which_lock(tmp_path, one_rank):
    from engine.rollout.tensor_parallel import cpu_engine_start

    lock = tmp_path / "posttrain-vllm-[0].lock"
    other = _held(lock)
    try:
        named = f"held {re.escape(str(lock))} for 0.3 s .*'fuser {re.escape(str(lock))}'"
        with (
            pytest.raises(TimeoutError, match=named),
            cpu_engine_start(1, str(tmp_path), wait_seconds=0.3),
        ):
            pytest.fail("the engine started without the lock")
    finally:
        os.close(other)
