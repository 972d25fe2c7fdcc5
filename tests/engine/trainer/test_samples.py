"""Sample records read off a scored batch: an asynchronous rollout's policy version and IS weight."""

from __future__ import annotations

import numpy as np
import torch

from engine.data import DataProto
from engine.trainer.run import run_training
from engine.trainer.samples import (
    IS_WEIGHT,
    POLICY_VERSION,
    sample_records,
    sample_staleness,
)
from tests.engine.trainer.test_trainer import ListRecorder


class CharTokenizer:
    """Token i is the letter chr(97 + i)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i) for i in ids)

    def convert_ids_to_tokens(self, ids):
        return [chr(97 + i) for i in ids]


def scored_batch(**tensors: torch.Tensor) -> DataProto:
    """Two responses of one prompt: 3 tokens, and 2 tokens then padding (bs=2, R=3)."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # (2, 3)
    non_tensors = {
        "reward_model": np.array([{"ground_truth": "7"}] * 2, dtype=object),
        "extra_info": np.array([{"index": 5}] * 2, dtype=object),
        "index": np.array([5, 5]),
        "uid": np.array(["u", "u"], dtype=object),
        "data_source": np.array(["tiny"] * 2, dtype=object),
        "prompt_text": np.array(["2+5="] * 2, dtype=object),
        "truncated": np.array([False, False]),
    }
    return DataProto.from_dict(
        {
            "responses": torch.tensor([[0, 1, 2], [3, 4, 0]]),
            "response_mask": mask,
            "token_level_scores": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]),
            "old_log_probs": torch.zeros(2, 3),
            **tensors,
        },
        non_tensors,
    )


def records(batch: DataProto):
    return sample_records(batch, {}, CharTokenizer(), step=4, split="train", n=2)


def test_a_synchronous_samples_parts_hold_no_rollout_facts():
    first, second = records(scored_batch())
    assert first.reward_parts == {} == second.reward_parts
    assert (first.response_text, second.response_text) == ("abc", "de")


def test_an_async_sample_keeps_its_policy_version_and_mean_is_weight_over_its_tokens():
    batch = scored_batch(
        rollout_is_weights=torch.tensor([[0.5, 1.0, 1.5], [2.0, 1.0, 9.0]])  # (2, 3)
    )
    batch.non_tensor_batch[POLICY_VERSION] = np.array([2, 1], dtype=np.int64)
    first, second = records(batch)
    assert first.reward_parts == {POLICY_VERSION: 2, IS_WEIGHT: 1.0}
    # The padding token's weight (9.0) is not the sample's: (2.0 + 1.0) / 2.
    assert second.reward_parts == {POLICY_VERSION: 1, IS_WEIGHT: 1.5}
    assert isinstance(first.reward_parts[POLICY_VERSION], int)


def test_a_sample_rejected_whole_has_no_is_weight():
    batch = scored_batch(rollout_is_weights=torch.ones(2, 3))
    batch.batch["response_mask"][1] = torch.tensor([0.0, 0.0, 0.0])
    # Still recorded (its length up to the last response token is 0); no tokens weigh it.
    assert records(batch)[1].reward_parts == {IS_WEIGHT: None}


def test_staleness_counts_the_updates_before_the_step_as_the_trainers_metrics_do():
    # At step 4 the actor has made 3 updates: a sample of version 2 is one update behind.
    assert sample_staleness(4, 2) == 1
    assert sample_staleness(1, 0) == 0


def test_a_one_step_off_runs_samples_carry_their_version_and_is_weight(make_config):
    config = make_config(
        "grpo_tiny",
        "actor_rollout_ref.hybrid_engine=False",
        "algorithm.rollout_correction.rollout_is=token",
    )
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    for step, metrics in recorder.steps:
        train = [s for s in recorder.samples if s.step == step and s.split == "train"]
        stale = [sample_staleness(step, s.reward_parts[POLICY_VERSION]) for s in train]
        # The samples' staleness is the step's async/staleness_* (0, then one update behind).
        assert max(stale) == metrics["async/staleness_max"] == step - 1
        assert all(isinstance(s.reward_parts[IS_WEIGHT], float) for s in train)
        # Each side's busy share of the step, from the step's own timings.
        step_s = metrics["timing_s/step"]
        assert metrics["async/rollout_utilisation"] == (
            metrics["timing_s/rollout_worker_gen"] / step_s
        )
        assert metrics["async/trainer_utilisation"] == (step_s - metrics["timing_s/gen"]) / step_s
