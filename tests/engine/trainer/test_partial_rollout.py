"""Partial rollout (``async_training.partial_rollout=True``): weights synced while the rollout
worker generates a batch are loaded between two decoding steps, the rest of the batch is
sampled under them, and every token carries the version it was sampled under."""

from __future__ import annotations

import copy

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.config import load_config
from engine.roles.model_loading import policy_skeleton, policy_state
from engine.roles.rollout_worker import RolloutWorkerProcess
from engine.rollout.sampling import TOKEN_VERSIONS
from engine.tiny.tokenizer import build_tokenizer
from engine.trainer.samples import LAST_POLICY_VERSION, POLICY_VERSION, sample_records
from tests.engine.distributed.helpers import prompt_batch
from tests.engine.trainer.stale import SAME_WEIGHTS_ATOL, log_probs_under
from tests.engine.trainer.test_fully_async import RecordingTrainer, fully_async
from tests.engine.trainer.test_trainer import ListRecorder

RESPONSE = 240  # tokens a row: the batch takes long enough for a sync to land inside it


def small_policy(vocab_size: int) -> Qwen2ForCausalLM:
    """Return a random 4-layer Qwen2 of width 256 (about 3.5M parameters), seeded."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=768,
        max_position_embeddings=320,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).eval()


def test_weights_synced_mid_batch_sample_the_rest_of_it():
    tokenizer = build_tokenizer()
    old = small_policy(len(tokenizer))
    new = copy.deepcopy(old)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    rollout = load_config(
        "grpo_tiny.yaml", overrides=["actor_rollout_ref.rollout.ignore_eos=True"]
    ).actor_rollout_ref.rollout
    prompts = prompt_batch(tokenizer, ["1+2=", "13+4=", "5+60=", "7+8="]).repeat(8)
    worker = RolloutWorkerProcess(
        policy_skeleton(old),
        tokenizer,
        rollout,
        max_new_tokens=RESPONSE,
        seed=3,
        partial_rollout=True,
    )
    try:
        worker.sync_weights(policy_state(old), 0)
        worker.submit(prompts)
        worker.submit(prompts)
        first, first_version, _ = worker.result()
        # The worker went straight on to the second batch: this sync lands in the middle of it.
        worker.sync_weights(policy_state(new), 1)
        second, second_version, _ = worker.result()
    finally:
        worker.close()
    assert first_version == second_version == 0  # the version a batch started with
    assert bool((first.batch[TOKEN_VERSIONS] == 0).all())
    versions = second.batch[TOKEN_VERSIONS]  # (bs, T); ignore_eos: every token is real
    assert versions.shape == (len(prompts), RESPONSE)
    switch = int((versions[0] == 1).long().argmax())
    assert 0 < switch < RESPONSE, "the sync did not land inside the batch"
    assert bool((versions[:, :switch] == 0).all()) and bool((versions[:, switch:] == 1).all())
    # Each token's rollout log-prob is its own policy's: the old one's before the switch, the
    # new one's (given the old one's prefix) after it.
    under_old = log_probs_under(old, policy_state(old), second)
    under_new = log_probs_under(old, policy_state(new), second)
    got = second.batch["rollout_log_probs"]
    torch.testing.assert_close(
        got[:, :switch], under_old[:, :switch], atol=SAME_WEIGHTS_ATOL, rtol=0
    )
    torch.testing.assert_close(
        got[:, switch:], under_new[:, switch:], atol=SAME_WEIGHTS_ATOL, rtol=0
    )
    assert (under_old[:, switch:] - under_new[:, switch:]).abs().max() > 1e-2


def test_a_fully_async_run_with_partial_rollout_stamps_each_sample_with_its_first_version(
    make_config,
):
    trainer = RecordingTrainer(
        make_config(
            "grpo_tiny",
            *fully_async(1.0, 1, require_batches=4),  # eight chunks in flight, a sync a step
            "async_training.partial_rollout=True",
            "trainer.total_training_steps=4",
            "actor_rollout_ref.rollout.ignore_eos=True",
            "data.max_response_length=200",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.use_kl_loss=False",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        ),
        ListRecorder(),
    )
    assert trainer.fit() == "succeeded"
    steps = [metrics for _, metrics in trainer.recorder.steps]
    # One prompt a chunk, two responses of 200 tokens, and a light trainer (no reference pass,
    # whole micro-batches): the worker decodes a step's chunks in about 2.4x the time the trainer
    # trains on them here (0.65 s against 0.27 s), so each sync after the first lands inside a
    # chunk. With eight responses and a reference pass the two took about as long on one
    # machine, and no sync landed inside a chunk.
    assert sum(m["async/partial_rollout_samples"] for m in steps) > 0
    assert all(m["async/staleness_max"] <= m["async/max_allowed_staleness"] for m in steps)
    n = trainer.config.actor_rollout_ref.rollout.n
    for step, batch in enumerate(trainer.batches, start=1):
        mask = batch.batch["response_mask"].bool()
        versions = batch.batch[TOKEN_VERSIONS].masked_fill(~mask, 10**6)
        first = versions.min(-1).values.numpy()
        # A sample is as stale as its oldest token; later tokens are never older.
        assert np.array_equal(batch.non_tensor_batch[POLICY_VERSION], first)
        assert bool((versions[:, 1:] >= versions[:, :-1]).all())
        # The inspector's record keeps the last token's version where it differs.
        last = batch.batch[TOKEN_VERSIONS].masked_fill(~mask, -1).max(-1).values.tolist()
        records = sample_records(batch, {}, trainer.tokenizer, step=step, split="train", n=n)
        for record, first_version, last_version in zip(records, first, last, strict=True):
            expected = last_version if last_version > first_version else None
            assert record.reward_parts.get(LAST_POLICY_VERSION) == expected
