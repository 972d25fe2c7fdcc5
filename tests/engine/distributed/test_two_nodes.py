"""Two Ray nodes on one machine, started with ``ray start``: a two-CPU head and a one-CPU node
with a custom resource ``node2``. ``trainer.nnodes=2`` puts one rank on each; killing node 2's
processes mid-run fails the run with the node named; the run resumes on the head alone.
"""

from __future__ import annotations

import os
import re
import signal

import pytest
import torch

from engine.data import DataProto
from engine.distributed.channel import ENV_SWITCH
from engine.distributed.worker_group import RankDiedError, RayWorkerGroup, ResourcePool
from engine.trainer.ray_trainer import RayPPOTrainer
from engine.trainer.run import run_training
from tests.engine.distributed.helpers import ray_config
from tests.engine.distributed.ray_nodes import kill_node, start_head, start_node
from tests.engine.distributed.test_ray import ListRecorder

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    """Return ``(head node id, node 2's RayNode and node id)`` with this process connected."""
    head = start_head(num_cpus=2)
    try:
        node2 = start_node(head, num_cpus=1, resources={"node2": 1})
    except BaseException:
        kill_node(head)
        raise
    try:
        ray.init(address=head.gcs_address)
        ids = {"node2" in n["Resources"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        yield ids[False], node2, ids[True]
    finally:
        ray.shutdown()
        kill_node(node2)
        kill_node(head)


def actor_node_ids(group: RayWorkerGroup) -> list[str]:
    """Return the node each rank's actor runs on, as the actor itself reports it."""
    ask = [
        w.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
        for w in group.workers
    ]
    return ray.get(ask)


def test_one_rank_per_node_lands_on_two_nodes(cluster):
    head_id, _, node2_id = cluster
    # Both slots would fit on the two-CPU head: only STRICT_SPREAD puts one on node 2.
    group = RayWorkerGroup(ResourcePool("spread", (1, 1), "cpu", cpus_per_rank=1.0))
    try:
        where = actor_node_ids(group)
        assert sorted(where) == sorted([head_id, node2_id])
        assert group.node_ids == where
    finally:
        group.shutdown()


def test_a_rank_killed_on_a_live_node_is_named_through_ray_calls(cluster, monkeypatch):
    _, _, node2_id = cluster
    monkeypatch.setenv(ENV_SWITCH, "0")  # the calls go as Ray actor calls
    group = RayWorkerGroup(ResourcePool("ray_route", (1, 1), "cpu", cpus_per_rank=1.0))
    try:
        rank = group.node_ids.index(node2_id)
        pid = group.pids[rank]
        os.kill(pid, signal.SIGKILL)
        data = DataProto.from_dict({"input_ids": torch.ones(2, 3, dtype=torch.long)})
        named = rf"^rank {rank} \(pid {pid}\) on node {node2_id} \(.*resources node2\) died: "
        with pytest.raises(RankDiedError, match=named + r".* process died.*its node is alive"):
            group.call_split("actor_rollout_ref", "compute_ref_log_prob", data)
        assert group.rank_lost
    finally:
        group.shutdown()


class KillNodeAfter(ListRecorder):
    """Kill node 2 once step ``step`` is recorded (its checkpoint is already written)."""

    def __init__(self, node, step: int) -> None:
        super().__init__()
        self.node, self.step = node, step
        self.finish: dict = {}

    def on_step(self, step, metrics):
        super().on_step(step, metrics)
        if step == self.step:
            kill_node(self.node, remove=False)

    def on_finish(self, *, status, error=None):
        self.finish = {"status": status, "error": error}


def test_a_dead_node_fails_the_run_by_name_and_it_resumes_on_the_head(cluster, assets, tmp_path):
    head_id, node2, node2_id = cluster
    address = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node2_id)
    common = ("actor_rollout_ref.rollout.n=4", "trainer.save_freq=1", "trainer.test_freq=-1")
    two_nodes = ("trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.val_before_train=False")
    steps = "trainer.total_training_steps=4"
    config = ray_config(assets, tmp_path, "grpo_tiny", *common, *two_nodes, steps)
    recorder = KillNodeAfter(node2, step=2)
    with pytest.raises(RankDiedError) as failure:
        run_training(config, recorder)
    named = rf"rank [01] \(pid \d+\) on node {node2_id} \({re.escape(address)}, resources node2\)"
    assert re.match(named + " died with its node", str(failure.value)), str(failure.value)
    assert "left the Ray cluster" in str(failure.value)
    assert recorder.finish["status"] == "failed"
    assert re.search(named, recorder.finish["error"], re.MULTILINE)  # what the run's page shows
    assert sorted(recorder.steps) == [1, 2]

    # The same rank count (the shards are per rank), both ranks on the head now.
    one_node = ("trainer.nnodes=1", "trainer.n_gpus_per_node=2")
    config = ray_config(
        assets, tmp_path, "grpo_tiny", *common, *one_node, "trainer.total_training_steps=3"
    )
    resumed = ListRecorder()
    trainer = RayPPOTrainer(config, resumed)
    assert actor_node_ids(trainer.worker_groups["global_pool"]) == [head_id, head_id]
    assert trainer.fit() == "succeeded"
    assert resumed.start_step == 2 and sorted(resumed.steps) == [3]
