"""Two FSDP2 ranks as Ray actors on a CPU (gloo): parity with one rank, dispatch, hybrid engine,
sharded checkpoints, and the GRPO loop under ``trainer.controller=ray``.

One Ray session and one two-rank worker group serve the whole module; tests that need a known
starting point restore the group's initial sharded state first.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.distributed.worker_group import ActorRolloutRefGroup, RayWorkerGroup, ResourcePool
from engine.workers.actor_rollout_ref import ActorRolloutRefWorker
from tests.engine.distributed.helpers import prompt_batch, tiny_config, update_batch

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

QUESTIONS = ["1+2=", "13+4=", "5+60=", "7+8=", "9+10="]


@pytest.fixture(scope="module")
def ray_session():
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def two_ranks(ray_session):
    """Return ``(config, group proxy, initial sharded state, initial full weights)``."""
    config = tiny_config(lr=1e-2, mini_batch=4)
    group = RayWorkerGroup(ResourcePool("test_pool", (2,), "cpu", cpus_per_rank=0.5))
    try:
        arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=True)
        yield config, arr, arr.state_dict(), arr.full_state_dict()
    finally:
        group.shutdown()


def one_rank(config, weights: dict[str, torch.Tensor]) -> ActorRolloutRefWorker:
    """Return a single-process worker (policy and reference) holding ``weights``."""
    worker = ActorRolloutRefWorker(
        copy.deepcopy(config), device=torch.device("cpu"), total_steps=10, need_ref=True
    )
    worker.model.load_state_dict(weights)
    worker.ref_model.load_state_dict(weights)
    return worker


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_two_ranks_update_like_one_rank(two_ranks):
    config, arr, initial, initial_full = two_ranks
    arr.load_state_dict(initial)
    local = one_rank(config, initial_full)
    vocab = len(config.actor_rollout_ref.model.tokenizer)
    # Unequal response lengths; each rank's half holds 3 + 5 response tokens.
    batch = update_batch(4, 5, [3, 5, 5, 3], vocab)
    local_metrics = local.update_actor(batch)
    ray_metrics = arr.update_actor(batch)
    after = arr.full_state_dict()
    assert max_diff(after, initial_full) > 1e-3  # the AdamW step (lr 1e-2) moved the weights
    assert max_diff(after, local.model.state_dict()) < 1e-4
    assert ray_metrics["actor/pg_loss"] == pytest.approx(local_metrics["actor/pg_loss"], abs=1e-5)
    assert ray_metrics["actor/grad_norm"] == pytest.approx(
        local_metrics["actor/grad_norm"], rel=1e-4
    )


def test_an_odd_batch_comes_back_in_order_without_padding(two_ranks):
    config, arr, initial, initial_full = two_ranks
    arr.load_state_dict(initial)
    local = one_rank(config, initial_full)
    prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS)
    gen = arr.generate_sequences(prompts)
    assert len(gen) == 5
    assert torch.equal(gen.batch["prompts"], prompts.batch["input_ids"])
    old = arr.compute_log_prob(gen)
    ref = arr.compute_ref_log_prob(gen)
    expected_old = local.compute_log_prob(gen).batch["old_log_probs"]
    expected_ref = local.compute_ref_log_prob(gen).batch["ref_log_prob"]
    assert old.batch["old_log_probs"].shape == expected_old.shape == (5, 6)
    torch.testing.assert_close(old.batch["old_log_probs"], expected_old, atol=1e-5, rtol=0)
    torch.testing.assert_close(ref.batch["ref_log_prob"], expected_ref, atol=1e-5, rtol=0)


def test_after_an_update_the_rollout_samples_from_the_new_weights(two_ranks):
    config, arr, initial, initial_full = two_ranks
    arr.load_state_dict(initial)
    prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS[:4])
    arr.generate_sequences(prompts)  # the rollout copy now holds the initial weights
    vocab = len(config.actor_rollout_ref.model.tokenizer)
    arr.update_actor(update_batch(4, 5, [6, 6, 6, 6], vocab))
    gen = arr.generate_sequences(prompts.repeat(2))
    assert gen.meta_info["timing_s/update_weights"] > 0
    mask = gen.batch["response_mask"].bool()
    rollout = gen.batch["rollout_log_probs"][mask]
    actor = arr.compute_log_prob(gen).batch["old_log_probs"][mask]
    stale = one_rank(config, initial_full).compute_log_prob(gen).batch["old_log_probs"][mask]
    torch.testing.assert_close(rollout, actor, atol=1e-4, rtol=0)
    assert (rollout - stale).abs().max() > 1e-2  # the pre-update policy would disagree


def test_sharded_checkpoint_round_trip_and_hf_export(two_ranks, tmp_path):
    config, arr, initial, _ = two_ranks
    arr.load_state_dict(initial)
    vocab = len(config.actor_rollout_ref.model.tokenizer)
    batch = update_batch(4, 5, [2, 6, 4, 4], vocab)
    arr.update_actor(batch)
    torch.save(arr.state_dict(), tmp_path / "state.pt")  # as the controller saves it
    arr.update_actor(batch)
    expected = arr.full_state_dict()
    arr.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    arr.update_actor(batch)  # the second step again, from the restored weights and moments
    assert max_diff(arr.full_state_dict(), expected) < 1e-6
    exported = AutoModelForCausalLM.from_pretrained(arr.export_hf(tmp_path / "hf"))
    assert max_diff(exported.state_dict(), expected) == 0.0
