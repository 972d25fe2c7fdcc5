"""The one-rank group in the controller's process: the CUDA trainer's workers, without Ray.

On a CPU one fp32 rank shards nothing, so the in-process rank must do the plain worker's work bit
for bit: that checks the dispatch (device moves, the fused reference pass, checkpoints) here. The
``gpu`` tests run the real thing: FSDP2 over NCCL in bf16, and a GRPO run of the trainer.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from engine.distributed.local_group import LocalWorkerGroup, join_local_process_group
from engine.distributed.worker_group import ActorRolloutRefGroup
from tests.engine.distributed.helpers import (
    max_diff,
    plain_worker,
    prompt_batch,
    tiny_config,
    update_batch,
    without_perf,
)

QUESTIONS = ["1+2=", "13+4=", "5+60=", "7+8="]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_one_cpu_rank_in_process_does_the_plain_workers_work_exactly(fresh_group):
    config = tiny_config(lr=1e-2, mini_batch=4)
    group = LocalWorkerGroup("cpu")
    arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=True)
    local = plain_worker(config, arr.full_state_dict())
    prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS)
    gen = arr.generate_sequences(prompts)
    expected = local.generate_sequences(prompts)
    assert torch.equal(gen.batch["responses"], expected.batch["responses"])
    assert torch.equal(gen.batch["rollout_log_probs"], expected.batch["rollout_log_probs"])
    # The reference pass rode in the rollout call, as on a Ray rank.
    assert arr.pending_ref is not None
    assert torch.equal(
        arr.compute_ref_log_prob(gen).batch["ref_log_prob"],
        local.compute_ref_log_prob(gen).batch["ref_log_prob"],
    )
    batch = update_batch(4, 5, [3, 5, 5, 3], len(config.actor_rollout_ref.model.tokenizer))
    # The update's own metrics match; the perf/ figures measure the processes (engine.perf).
    assert without_perf(arr.update_actor(batch)) == without_perf(local.update_actor(batch))
    # In process the gathered tensors are the rank's own (no pickling copies them): clone.
    after = {k: v.clone() for k, v in arr.full_state_dict().items()}
    assert max_diff(after, local.model.state_dict()) == 0.0
    state = arr.state_dict()
    assert state["format"] == "fsdp2_sharded" and state["world_size"] == 1
    arr.update_actor(batch)
    assert max_diff(arr.full_state_dict(), after) > 0.0
    arr.load_state_dict(state)
    assert max_diff(arr.full_state_dict(), after) == 0.0
    group.shutdown()
    assert group.worker.roles == {}


def test_a_second_group_reuses_the_process_group_and_a_larger_one_is_refused(fresh_group):
    join_local_process_group("cpu")
    first = dist.group.WORLD
    LocalWorkerGroup("cpu")
    assert dist.group.WORLD is first and dist.get_world_size() == 1
    with pytest.raises(RuntimeError, match="uses gloo, but a cuda trainer needs nccl"):
        join_local_process_group("cuda")


def test_only_the_rank_methods_are_dispatched(fresh_group):
    group = LocalWorkerGroup("cpu")
    with pytest.raises(ValueError, match="'shutdown' is not one of build_role, call"):
        group.execute_all("shutdown")
    with pytest.raises(ValueError, match="expected 1 argument tuple, got 2"):
        group.call_each("actor_rollout_ref", "load_state_dict", [(), ()])


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_rank_trains_fsdp2_in_bf16_over_nccl_and_samples_the_new_weights(fresh_group):
    config = tiny_config(lr=1e-2, mini_batch=4)
    group = LocalWorkerGroup("cuda")
    assert dist.get_backend() == "nccl"
    arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=True)
    role = group.worker.roles["actor_rollout_ref"]
    assert role.sharded and role.rollout_model is not None
    params = list(role.worker.model.parameters())
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in params)
    assert next(role.rollout_model.parameters()).dtype == torch.bfloat16
    before = arr.full_state_dict()
    prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS)
    gen = arr.generate_sequences(prompts)
    assert gen.batch["responses"].device.type == "cpu"  # results come back to the controller
    ref = arr.compute_ref_log_prob(gen).batch["ref_log_prob"]
    mask = gen.batch["response_mask"].bool()
    # The bf16 rollout's log-probs and the reference's (bf16 compute) agree to bf16 rounding.
    assert (gen.batch["rollout_log_probs"][mask] - ref[mask]).abs().max() < 0.1
    batch = update_batch(4, 5, [3, 5, 5, 3], len(config.actor_rollout_ref.model.tokenizer))
    metrics = arr.update_actor(batch)
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    after = arr.full_state_dict()
    assert all(v.dtype == torch.float32 for v in after.values())  # fp32 master weights
    assert max_diff(after, before) > 1e-4
    # The rollout copy is refreshed from the updated shards before the next generation.
    arr.generate_sequences(prompts)
    copy_weights = {k: v.float().cpu() for k, v in role.rollout_model.state_dict().items()}
    assert max_diff({k: copy_weights[k] for k in after}, after) < 1e-2  # bf16 rounding


@pytest.mark.gpu
@needs_cuda
def test_the_trainer_runs_grpo_on_a_cuda_device_with_fsdp2_ranks(fresh_group, tmp_path):
    from engine.config import load_config
    from engine.tiny.task import make_problems, write_split
    from engine.tiny.tokenizer import build_tokenizer
    from engine.trainer import Recorder
    from engine.trainer.ppo_trainer import PPOTrainer
    from tests.engine.distributed.helpers import tiny_policy

    tokenizer = build_tokenizer()  # a random policy: no warm start to wait for
    tiny_policy(len(tokenizer)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    train, _ = write_split(make_problems("train", 16, seed=0), "train", tmp_path)

    class Steps(Recorder):
        def __init__(self) -> None:
            self.metrics: list[dict[str, float]] = []

        def on_step(self, step: int, metrics: dict[str, float]) -> None:
            self.metrics.append(metrics)

    config = load_config(
        "grpo_tiny.yaml",
        overrides=[
            f"actor_rollout_ref.model.path={tmp_path / 'model'}",
            f"data.train_files={train}",
            "data.val_files=null",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "trainer.device=cuda",
            "trainer.total_training_steps=3",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            "trainer.save_freq=3",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ],
    )
    steps = Steps()
    trainer = PPOTrainer(config, steps)
    assert isinstance(trainer.arr, ActorRolloutRefGroup)
    assert trainer.fit() == "succeeded"
    assert len(steps.metrics) == 3
    assert all(torch.isfinite(torch.tensor(m["actor/pg_loss"])) for m in steps.metrics)
    assert (tmp_path / "ckpt" / "global_step_3" / "actor" / "state.pt").exists()
