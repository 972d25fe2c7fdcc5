"""Two FSDP2 ranks as Ray actors on a CPU (gloo): parity with one rank, dispatch, hybrid engine,
sharded checkpoints, and the GRPO loop under ``trainer.controller=ray``.

One Ray session and one two-rank worker group serve the whole module; tests that need a known
starting point restore the group's initial sharded state first.
"""

from __future__ import annotations

import copy
import os
import signal

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.algorithms.rollout_correction import IS_IN_UPDATE
from engine.data import DataProto
from engine.distributed.channel import ENV_SWITCH, RankChannelError
from engine.distributed.worker_group import ActorRolloutRefGroup, RayWorkerGroup, ResourcePool
from engine.trainer import Recorder
from engine.trainer.ray_trainer import RayPPOTrainer
from engine.trainer.run import run_training
from tests.engine.distributed.helpers import (
    max_diff,
    prompt_batch,
    ray_config,
    tiny_config,
    update_batch,
    without_perf,
)
from tests.engine.distributed.helpers import plain_worker as one_rank

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

QUESTIONS = ["1+2=", "13+4=", "5+60=", "7+8=", "9+10="]


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
    # Each rank's process reports its own memory and CPU; the largest rank's are kept.
    assert 0.05 < ray_metrics["perf/max_rss_gb"] < 64
    assert ray_metrics["perf/max_cpu_percent"] > 0
    assert 0 < ray_metrics["perf/mfu/actor"] < 1


@pytest.mark.timeout(180)  # a rank waiting on a forward call its peer never makes hangs for good
def test_ranks_whose_rows_would_bucket_differently_make_the_same_calls(ray_session):
    """The padded forward's length buckets depend on a micro-batch's rows, and every FSDP2
    forward is a collective: rank 0's responses are of one length (one bucket alone), rank 1's
    of two far apart (two buckets alone). A call one rank makes and the other does not pairs its
    parameter gathers with the next model's (the reference's after the policy's), or waits for
    good. Sharded, each rank makes one call a micro-batch, and the group's log-probs and update
    are the single process's, with a policy one update away from its reference."""
    config = tiny_config(lr=1e-2, mini_batch=4)
    arr_config = config.actor_rollout_ref
    arr_config.actor.ppo_micro_batch_size_per_gpu = 2  # each rank's whole share in one call
    arr_config.rollout.log_prob_micro_batch_size_per_gpu = 2
    arr_config.ref.log_prob_micro_batch_size_per_gpu = 2
    group = RayWorkerGroup(ResourcePool("bucket_pool", (2,), "cpu", cpus_per_rank=0.5))
    try:
        arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=True)
        local = one_rank(config, arr.full_state_dict())
        vocab = len(config.actor_rollout_ref.model.tokenizer)
        local.update_actor(update_batch(4, 5, [3] * 4, vocab))  # one length: the same calls
        arr.update_actor(update_batch(4, 5, [3] * 4, vocab))
        assert max_diff(arr.full_state_dict(), local.model.state_dict()) < 1e-4

        batch = update_batch(4, 5, [40, 40, 1, 40], vocab)  # rank 0: rows 0-1, rank 1: 2-3
        mask = batch.batch["response_mask"].bool()  # past a response, a pass may hold anything
        expected = local.compute_log_prob(batch).batch["old_log_probs"][mask]
        got = arr.compute_log_prob(batch).batch["old_log_probs"][mask]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        expected_ref = local.compute_ref_log_prob(batch).batch["ref_log_prob"][mask]
        assert (expected_ref - expected).abs().max() > 1e-3  # the policy moved from it
        got = arr.compute_ref_log_prob(batch).batch["ref_log_prob"][mask]
        torch.testing.assert_close(got, expected_ref, atol=1e-5, rtol=0)
        local_metrics = local.update_actor(copy.deepcopy(batch))
        ray_metrics = arr.update_actor(batch)
        assert ray_metrics["actor/pg_loss"] == pytest.approx(
            local_metrics["actor/pg_loss"], abs=1e-5
        )
        assert max_diff(arr.full_state_dict(), local.model.state_dict()) < 1e-4
    finally:
        group.shutdown()


def test_an_update_weighing_itself_hands_each_ranks_is_weights_back_in_row_order(ray_session):
    # Token IS from the update's own pi_old (the asynchronous trainers' IS_IN_UPDATE): each rank
    # weighs its half, and the controller's batch gets the weights back as an in-process
    # actor's update writes them.
    config = tiny_config(lr=1e-2, mini_batch=4)
    config.algorithm.rollout_correction.rollout_is = "token"
    config.algorithm.rollout_correction.rollout_is_threshold = 2.0
    group = RayWorkerGroup(ResourcePool("weighing_pool", (2,), "cpu", cpus_per_rank=0.5))
    try:
        arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=True)
        local = one_rank(config, arr.full_state_dict())
        vocab = len(config.actor_rollout_ref.model.tokenizer)
        batch = update_batch(4, 5, [3, 5, 5, 3], vocab)
        mask = batch.batch["response_mask"]
        # The sampler's log-probs, a policy away from the actor's: weights off 1, a few clipped.
        noise = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3)) * 0.5
        pi_old = local.compute_log_prob(batch).batch["old_log_probs"]
        batch.batch["rollout_log_probs"] = (pi_old + noise) * mask
        batch.meta_info[IS_IN_UPDATE] = True
        local_batch = copy.deepcopy(batch)
        local_metrics = local.update_actor(local_batch)
        ray_metrics = arr.update_actor(batch)
        expected = local_batch.batch["rollout_is_weights"]
        assert not torch.allclose(expected[mask.bool()], torch.ones(int(mask.sum())))
        torch.testing.assert_close(batch.batch["rollout_is_weights"], expected, atol=1e-5, rtol=0)
        for key in ("actor/pg_loss", "rollout_corr/rollout_is_mean"):
            assert ray_metrics[key] == pytest.approx(local_metrics[key], abs=1e-5), key
        assert max_diff(arr.full_state_dict(), local.model.state_dict()) < 1e-4
    finally:
        group.shutdown()


def test_an_odd_batch_comes_back_in_order_without_padding(two_ranks):
    config, arr, initial, initial_full = two_ranks
    arr.load_state_dict(initial)
    local = one_rank(config, initial_full)
    prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS)
    per_rank, pad = arr.group.call_split(arr.role, "generate_sequences", prompts)
    widths = [out.batch["responses"].shape[1] for out in per_rank]
    # Each rank stops sampling when its own rows end, so the widths may differ; whether they do
    # depends on the samples (uneven widths are padded deterministically in test_dispatch).
    assert pad == 1
    arr.load_state_dict(initial)  # the same sampling again, through the proxy
    gen = arr.generate_sequences(prompts)
    assert len(gen) == 5 and gen.batch["responses"].shape[1] == max(widths)
    assert torch.equal(gen.batch["prompts"], prompts.batch["input_ids"])
    lengths = [int(n) for out in per_rank for n in out.batch["response_mask"].sum(-1)]
    assert gen.batch["response_mask"].sum(-1).tolist() == lengths[:5]
    old = arr.compute_log_prob(gen)
    ref = arr.compute_ref_log_prob(gen)  # computed by the ranks in the rollout call
    expected_old = local.compute_log_prob(gen).batch["old_log_probs"]
    expected_ref = local.compute_ref_log_prob(gen).batch["ref_log_prob"]
    assert old.batch["old_log_probs"].shape == expected_old.shape == (5, max(widths))
    assert ref.batch["ref_log_prob"].shape == expected_ref.shape
    torch.testing.assert_close(old.batch["old_log_probs"], expected_old, atol=1e-5, rtol=0)
    # Each rank scored its own rows at its own width, so only response tokens are comparable.
    mask = gen.batch["response_mask"].bool()
    torch.testing.assert_close(
        ref.batch["ref_log_prob"][mask], expected_ref[mask], atol=1e-5, rtol=0
    )


class CallLog:
    """Record the methods a worker group is asked to run, then run them."""

    def __init__(self, group: RayWorkerGroup) -> None:
        self.group, self.methods = group, []
        self.call_split = group.call_split
        group.call_split = self.record

    def record(self, role, method, *args, **kwargs):
        self.methods.append(method)
        return self.call_split(role, method, *args, **kwargs)

    def restore(self) -> None:
        self.group.call_split = self.call_split


def test_the_reference_pass_rides_in_the_training_rollout_call(two_ranks):
    config, arr, initial, initial_full = two_ranks
    arr.load_state_dict(initial)
    prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS[:4]).repeat(2)
    calls = CallLog(arr.group)
    try:
        gen = arr.generate_sequences(prompts)
        assert "ref_log_prob" not in gen.batch  # held for compute_ref_log_prob
        ref = arr.compute_ref_log_prob(gen)
        assert calls.methods == ["generate_sequences"]
        assert ref.meta_info["timing_s/ref_in_rollout"] > 0
        again = arr.compute_ref_log_prob(gen)  # nothing pending now: the ranks are asked
        assert calls.methods == ["generate_sequences", "compute_ref_log_prob"]
        mask = gen.batch["response_mask"].bool()
        torch.testing.assert_close(
            ref.batch["ref_log_prob"][mask], again.batch["ref_log_prob"][mask], atol=1e-5, rtol=0
        )
        expected = one_rank(config, initial_full).compute_ref_log_prob(gen)
        torch.testing.assert_close(
            ref.batch["ref_log_prob"][mask],
            expected.batch["ref_log_prob"][mask],
            atol=1e-5,
            rtol=0,
        )
        # A validation rollout carries no reference pass and leaves a pending one alone...
        train = arr.generate_sequences(prompts)
        other = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS[1:5])
        val = arr.generate_sequences(other, validate=True)
        assert "ref_log_prob" not in val.batch
        arr.compute_ref_log_prob(train)
        assert calls.methods[-1] == "generate_sequences"
        # ...and a pending pass is never handed out for other sequences.
        arr.generate_sequences(prompts)
        arr.compute_ref_log_prob(val)
        assert calls.methods[-1] == "compute_ref_log_prob"
    finally:
        calls.restore()


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


@pytest.mark.parametrize("route", ["channel", "ray"])
def test_one_rank_does_the_single_process_work_exactly(ray_session, monkeypatch, route):
    # One fp32 rank has nothing to shard: the rank runs the single-process worker unwrapped, so
    # samples, log-probs and the update are bit for bit the local ones, and a checkpoint still
    # round-trips in the sharded format; whether the step's calls go over the direct channel or
    # through Ray (POSTTRAIN_RANK_CHANNEL=0).
    monkeypatch.setenv(ENV_SWITCH, "1" if route == "channel" else "0")
    config = tiny_config(lr=1e-2, mini_batch=4)
    group = RayWorkerGroup(ResourcePool("one_rank", (1,), "cpu", cpus_per_rank=0.5))
    try:
        assert (group.channels is not None) == (route == "channel")
        arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=True)
        local = one_rank(config, arr.full_state_dict())
        prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS[:4])
        gen = arr.generate_sequences(prompts)
        expected = local.generate_sequences(prompts)
        assert torch.equal(gen.batch["responses"], expected.batch["responses"])
        assert torch.equal(gen.batch["rollout_log_probs"], expected.batch["rollout_log_probs"])
        assert torch.equal(
            arr.compute_ref_log_prob(gen).batch["ref_log_prob"],
            local.compute_ref_log_prob(gen).batch["ref_log_prob"],
        )
        vocab = len(config.actor_rollout_ref.model.tokenizer)
        batch = update_batch(4, 5, [3, 5, 5, 3], vocab)
        # The update's own metrics match; the perf/ figures measure the processes (engine.perf).
        assert without_perf(arr.update_actor(batch)) == without_perf(local.update_actor(batch))
        after = arr.full_state_dict()
        assert max_diff(after, local.model.state_dict()) == 0.0
        state = arr.state_dict()
        assert state["format"] == "fsdp2_sharded" and len(state["ranks"]) == 1
        arr.update_actor(batch)
        arr.load_state_dict(state)
        assert max_diff(arr.full_state_dict(), after) == 0.0
        # The next samples come from the updated weights, as the local worker's do.
        assert torch.equal(
            arr.generate_sequences(prompts).batch["responses"],
            local.generate_sequences(prompts).batch["responses"],
        )
    finally:
        group.shutdown()


@pytest.mark.parametrize("route", ["channel", "ray"])
def test_a_rank_error_in_a_step_call_is_raised_with_the_rank_traceback(
    ray_session, monkeypatch, route
):
    monkeypatch.setenv(ENV_SWITCH, "1" if route == "channel" else "0")
    group = RayWorkerGroup(ResourcePool(f"errors_{route}", (1,), "cpu", cpus_per_rank=0.5))
    try:
        data = DataProto.from_dict({"input_ids": torch.ones(2, 3, dtype=torch.long)})
        with pytest.raises(RuntimeError, match="role 'critic' is not built on rank 0") as info:
            group.call_split("critic", "compute_values", data)
        notes = "\n".join(info.value.__notes__)
        assert f"raised on rank 0 (pid {group.pids[0]})" in notes and "rank_worker.py" in notes
    finally:
        group.shutdown()


def test_after_a_rank_error_the_next_call_gets_its_own_replies(two_ranks):
    # Both ranks fail; the controller raises the first error that arrives, so the other rank's
    # reply may still be in its connection when the next call starts, and must not be taken for
    # that call's answer.
    config, arr, initial, _ = two_ranks
    arr.load_state_dict(initial)
    prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS[:4])
    gen = arr.generate_sequences(prompts, validate=True)
    before = arr.compute_ref_log_prob(gen)
    with pytest.raises(RuntimeError, match="'critic' is not built on rank [01]"):
        arr.group.call_split("critic", "compute_values", gen)
    after = arr.compute_ref_log_prob(gen)
    assert torch.equal(before.batch["ref_log_prob"], after.batch["ref_log_prob"])


def test_a_rank_that_dies_is_named_by_the_next_step_call(ray_session):
    group = RayWorkerGroup(ResourcePool("dies", (1,), "cpu", cpus_per_rank=0.5))
    try:
        pid = group.pids[0]
        os.kill(pid, signal.SIGKILL)
        data = DataProto.from_dict({"input_ids": torch.ones(2, 3, dtype=torch.long)})
        with pytest.raises(RankChannelError, match=rf"rank 0 \(pid {pid}\) .* process died"):
            group.call_split("actor_rollout_ref", "compute_ref_log_prob", data)
    finally:
        group.shutdown()


def test_a_rank_that_dies_while_the_other_waits_for_it_in_a_collective_is_named(ray_session):
    # Rank 0 starts the update and blocks in FSDP's first all-gather, which rank 1 never joins;
    # the controller names rank 1 at once instead of waiting out the process group's timeout.
    config = tiny_config(lr=1e-2, mini_batch=4)
    group = RayWorkerGroup(ResourcePool("dies_in_collective", (2,), "cpu", cpus_per_rank=0.5))
    try:
        arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=True)
        pid = group.pids[1]
        os.kill(pid, signal.SIGKILL)
        vocab = len(config.actor_rollout_ref.model.tokenizer)
        with pytest.raises(RankChannelError, match=rf"rank 1 \(pid {pid}\)"):
            arr.update_actor(update_batch(4, 5, [3, 5, 5, 3], vocab))
        assert group.channels.broken
    finally:
        group.shutdown()  # kills rank 0 without waiting for its collective


def test_a_multi_turn_rollout_gets_its_messages_on_the_rank(ray_session, tmp_path):
    # Single-turn rollouts ship the prompt tensors only; a multi-turn one needs each row's
    # messages and extra info on the rank, where its interaction runs.
    interaction = tmp_path / "interaction.py"
    interaction.write_text(
        "def reply(messages, extra_info):\n"
        "    if len(messages) < 3:\n"
        "        return {'role': 'user', 'content': str(extra_info['index'])}\n"
    )
    config = tiny_config(lr=1e-2, mini_batch=4)
    config.data.max_response_length = 24
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    multi_turn.enable, multi_turn.interaction_path = True, str(interaction)
    multi_turn.interaction_name = "reply"
    tokenizer = config.actor_rollout_ref.model.tokenizer
    prompts = prompt_batch(tokenizer, QUESTIONS[:4])
    messages = np.empty(4, dtype=object)  # one list of messages per row
    messages[:] = [[{"role": "user", "content": q}] for q in QUESTIONS[:4]]
    prompts.non_tensor_batch["raw_prompt"] = messages
    prompts.non_tensor_batch["extra_info"] = np.array([{"index": i} for i in range(4)])
    group = RayWorkerGroup(ResourcePool("multi_turn", (1,), "cpu", cpus_per_rank=0.5))
    try:
        arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=True)
        local = one_rank(config, arr.full_state_dict())
        gen = arr.generate_sequences(prompts)
        expected = local.generate_sequences(prompts)
    finally:
        group.shutdown()
    assert torch.equal(gen.batch["responses"], expected.batch["responses"])
    turns = gen.non_tensor_batch["num_turns"].tolist()
    assert turns == expected.non_tensor_batch["num_turns"].tolist()
    assert max(turns) > 1  # the interaction answered on the rank


def test_two_groups_of_one_pool_name_live_side_by_side_in_one_process(ray_session):
    # Two trainers in one driver (an A/B benchmark, say) each reserve a pool called
    # global_pool; Ray refuses a placement group name that is already taken.
    first = RayWorkerGroup(ResourcePool("same_name", (1,), "cpu", cpus_per_rank=0.5))
    try:
        second = RayWorkerGroup(ResourcePool("same_name", (1,), "cpu", cpus_per_rank=0.5))
        try:
            assert first.pids != second.pids
        finally:
            second.shutdown()
    finally:
        first.shutdown()


def test_a_cpu_rank_runs_one_torch_thread_per_reserved_cpu(ray_session):
    group = RayWorkerGroup(ResourcePool("two_cpus", (1,), "cpu", cpus_per_rank=2.0))
    try:
        threads = ray.get(group.workers[0].__ray_call__.remote(lambda _: torch.get_num_threads()))
    finally:
        group.shutdown()
    assert threads == 2


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


# -- the loop under trainer.controller=ray -------------------------------------------------------


class ListRecorder(Recorder):
    """Keep the start step, every step's metrics and the number of samples."""

    def __init__(self) -> None:
        self.start_step: int | None = None
        self.steps: dict[int, dict[str, float]] = {}
        self.samples = 0

    def on_start(self, *, config, total_steps, start_step):
        self.start_step = start_step

    def on_step(self, step, metrics):
        self.steps[step] = metrics

    def on_samples(self, step, samples):
        self.samples += len(samples)


def test_grpo_runs_end_to_end_on_two_ranks_and_resumes_from_its_shards(
    ray_session, assets, tmp_path
):
    first = ListRecorder()
    config = ray_config(
        assets,
        tmp_path,
        "grpo_tiny",
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
    )
    assert run_training(config, first) == "succeeded"
    assert sorted(first.steps) == [0, 1, 2]  # validation before training, then two steps
    for key in ("actor/pg_loss", "actor/kl_loss", "timing_s/update_weights", "timing_s/gen"):
        assert key in first.steps[2], key
    assert "val-core/tiny_arithmetic/reward/mean@1" in first.steps[2]
    perf = first.steps[2]
    # The reference pass ran inside the rollout call; its time is booked under ref, not gen.
    assert perf["timing_s/ref"] > 0 and perf["timing_s/gen"] > 0
    per_rank = perf["perf/total_num_tokens"] / perf["perf/time_per_step"] / 2
    assert perf["perf/throughput"] == pytest.approx(per_rank)  # tokens/s per rank, as verl's
    # The driver's own process and the largest of the two rank processes (engine.perf).
    assert 0.05 < perf["perf/driver/rss_gb"] < 64 and 0.05 < perf["perf/max_rss_gb"] < 64
    assert perf["perf/max_rss_gb"] != perf["perf/driver/rss_gb"]  # other processes
    assert 0 < perf["perf/mfu/actor"] < 1 and perf["perf/min_memory_available_gb"] > 0
    assert first.samples == 2 * 4 * 4 + 2 * 6  # two steps of 4 prompts x 4, two validations
    shard = torch.load(
        tmp_path / "ckpt" / "global_step_2" / "actor" / "state.pt", weights_only=False
    )
    assert shard["format"] == "fsdp2_sharded" and len(shard["ranks"]) == 2

    resumed = ListRecorder()
    config = ray_config(
        assets,
        tmp_path,
        "grpo_tiny",
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=3",
        "trainer.test_freq=-1",
    )
    assert run_training(config, resumed) == "succeeded"
    assert resumed.start_step == 2 and sorted(resumed.steps) == [3]


def test_gae_with_the_critic_on_its_own_pool(ray_session, assets, tmp_path):
    config = ray_config(
        assets,
        tmp_path,
        "ppo_tiny",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
    )
    trainer = RayPPOTrainer(
        config,
        ListRecorder(),
        resource_pool_spec={"global_pool": [2], "critic_pool": [1]},
        mapping={"critic": "critic_pool"},
    )
    pools = {name: group.world_size for name, group in trainer.worker_groups.items()}
    assert pools == {"global_pool": 2, "critic_pool": 1}
    assert trainer.fit() == "succeeded"
    metrics = trainer.recorder.steps[1]
    assert "critic/vf_loss" in metrics and "critic/values/mean" in metrics
    assert trainer.worker_groups == {}  # fit released the actors


def test_offload_on_cpu_ranks_fails_before_any_actor_starts(ray_session, assets, tmp_path):
    config = ray_config(
        assets, tmp_path, "grpo_tiny", "actor_rollout_ref.actor.fsdp_config.param_offload=True"
    )
    with pytest.raises(ValueError, match="param_offload=True: offload is unavailable on a CPU"):
        RayPPOTrainer(config)


def test_ulysses_splits_policy_reference_and_critic_over_two_ranks_as_two_data_ranks(
    ray_session, assets, tmp_path
):
    """One PPO step with every role's sequences split over both ranks (sp 2, dp 1) reports the
    numbers of the same step with one sequence per rank (sp 1, dp 2): same rollouts, and the
    losses and gradients are the mini-batch's however it is laid out."""
    steps = {}
    for sp in (1, 2):
        recorder = ListRecorder()
        config = ray_config(
            assets,
            tmp_path / f"sp{sp}",
            "ppo_tiny",
            "actor_rollout_ref.rollout.n=2",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "actor_rollout_ref.model.use_remove_padding=True",
            "critic.model.use_remove_padding=True",
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
            f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={sp}",
            f"critic.ulysses_sequence_parallel_size={sp}",
        )
        assert run_training(config, recorder) == "succeeded"
        steps[sp] = recorder.steps[1]
    for key in (
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "critic/values/mean",
        "critic/returns/mean",
        "actor/reward_kl_penalty",
    ):
        assert steps[2][key] == pytest.approx(steps[1][key], rel=1e-4, abs=1e-6), key
