"""PF-PPO's resampling weights by hand, its draws with a fixed generator, and the config keys."""

import dataclasses

import numpy as np
import pytest
import torch

from engine.algorithms.names import PF_PPO_REWEIGHT_METHODS
from engine.algorithms.pf_ppo import (
    compute_pf_ppo_reweight_data,
    pf_ppo_sample_indices,
    pf_ppo_weights,
)
from engine.config.algorithm import AlgorithmConfig, PFPPOConfig
from engine.data import DataProto
from tests.engine.tiny_run import short_run

SCORES = torch.tensor([1.0, 0.0, -2.0, 0.5])


def test_pow_weighs_the_absolute_score_to_the_power():
    weights = pf_ppo_weights(SCORES, "pow", 2.0)
    torch.testing.assert_close(weights, torch.tensor([1.0, 0.0, 4.0, 0.25]) + 1e-8)
    cubed = pf_ppo_weights(SCORES, "pow", 3.0)
    torch.testing.assert_close(cubed, torch.tensor([1.0, 0.0, 8.0, 0.125]) + 1e-8)


def test_max_min_keeps_only_the_best_and_the_worst():
    weights = pf_ppo_weights(SCORES, "max_min", 2.0)
    torch.testing.assert_close(weights, torch.tensor([1.0, 0.0, 1.0, 0.0]) + 1e-8)


def test_max_random_favours_the_best_four_to_one():
    weights = pf_ppo_weights(SCORES, "max_random", 2.0)
    torch.testing.assert_close(weights, torch.tensor([0.4, 0.1, 0.1, 0.1]) + 1e-8)


def test_an_unknown_method_is_refused_with_the_choices():
    with pytest.raises(
        ValueError,
        match=r"algorithm.pf_ppo.reweight_method='best' is not a PF-PPO method; "
        r"use one of pow, max_min, max_random\.",
    ):
        pf_ppo_weights(SCORES, "best", 2.0)


def test_draws_are_multinomial_with_replacement_at_the_batch_size():
    indices = pf_ppo_sample_indices(
        SCORES, "max_min", 2.0, generator=torch.Generator().manual_seed(0)
    )
    # Weights 1, 1e-8, 1, 1e-8: with replacement, same size, only rows 0 and 2 (p ~ 1 - 2e-8).
    assert indices.shape == (4,)
    assert set(indices.tolist()) <= {0, 2}
    # The same generator state draws exactly what torch.multinomial draws on the hand weights.
    expected = torch.multinomial(
        torch.tensor([1.0, 0.0, 4.0, 0.25]) + 1e-8,
        4,
        replacement=True,
        generator=torch.Generator().manual_seed(7),
    )
    drawn = pf_ppo_sample_indices(SCORES, "pow", 2.0, generator=torch.Generator().manual_seed(7))
    assert drawn.tolist() == expected.tolist()


def test_pow_draws_rows_in_proportion_to_their_weights():
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([pf_ppo_sample_indices(SCORES, "pow", 2.0, generator) for _ in range(2000)])
    frequency = torch.bincount(draws, minlength=4).float() / draws.numel()
    # 1, 0, 4, 0.25 out of 5.25
    torch.testing.assert_close(
        frequency, torch.tensor([1 / 5.25, 0.0, 4 / 5.25, 0.25 / 5.25]), atol=0.015, rtol=0
    )


def test_reweight_data_resamples_every_column_alike_and_leaves_the_batch():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0], [3.0, 0.0], [0.0, 0.0]])  # sums 1, 0, 3, 0
    batch = DataProto.from_dict(
        {"token_level_scores": scores, "advantages": torch.arange(8.0).reshape(4, 2)},
        non_tensors={"uid": np.array(["a", "b", "c", "d"], dtype=object)},
    )
    resampled = compute_pf_ppo_reweight_data(
        batch, "max_min", generator=torch.Generator().manual_seed(0)
    )
    assert len(resampled) == 4
    rows = [int(r) for r in resampled.batch["advantages"][:, 0] // 2]  # row i holds 2i, 2i+1
    # max 3 (row 2) and min 0 (rows 1 and 3) have weight 1; row 0 (score 1) ~1e-8.
    assert set(rows) <= {1, 2, 3}
    assert list(resampled.non_tensor_batch["uid"]) == ["abcd"[r] for r in rows]
    torch.testing.assert_close(resampled.batch["token_level_scores"], scores[rows])
    assert list(batch.non_tensor_batch["uid"]) == ["a", "b", "c", "d"]


def test_reweight_data_resamples_the_meta_info_lists_of_batch_length_as_verl():
    scores = torch.tensor([[1.0], [0.0], [3.0], [0.0]])  # (4, 1)
    meta = {"row_names": ["a", "b", "c", "d"], "pair": [1, 2], "global_steps": 7}
    batch = DataProto.from_dict(
        {"token_level_scores": scores, "rows": torch.arange(4.0)}, meta_info=meta
    )
    resampled = compute_pf_ppo_reweight_data(batch, generator=torch.Generator().manual_seed(1))
    rows = [int(r) for r in resampled.batch["rows"]]
    assert resampled.meta_info["row_names"] == ["abcd"[r] for r in rows]
    assert resampled.meta_info["pair"] == [1, 2]  # not of batch length: kept
    assert resampled.meta_info["global_steps"] == 7
    assert batch.meta_info["row_names"] == ["a", "b", "c", "d"]  # the input is left alone


def test_the_config_keys_default_to_verl_and_take_the_registry_choices():
    algorithm = AlgorithmConfig()
    assert algorithm.use_pf_ppo is False
    assert (algorithm.pf_ppo.reweight_method, algorithm.pf_ppo.weight_pow) == ("pow", 2.0)
    field = {f.name: f for f in dataclasses.fields(PFPPOConfig)}["reweight_method"]
    assert field.metadata["choices"] is PF_PPO_REWEIGHT_METHODS


def test_the_trainer_updates_on_the_resampled_batch(tmp_path):
    from engine.config import load_config
    from engine.tiny import ensure_tiny_assets
    from engine.trainer import PPOTrainer, Recorder

    ensure_tiny_assets()
    reward_file = tmp_path / "spread_reward.py"  # many distinct scores for the tiny answers
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(sum(map(ord, solution_str)) % 7)\n"
    )
    config = load_config(
        "grpo_tiny.yaml",
        overrides=[
            *short_run(tmp_path),
            f"custom_reward_function.path={reward_file}",
            "algorithm.use_pf_ppo=True",
            "algorithm.pf_ppo.reweight_method=max_min",
        ],
    )

    class Samples(Recorder):
        def __init__(self) -> None:
            self.samples: list = []
            self.metrics: dict = {}

        def on_samples(self, step, samples):
            self.samples.extend(samples)

        def on_step(self, step, metrics):
            self.metrics = metrics

    trainer = PPOTrainer(config)
    recorder = trainer.recorder = Samples()
    seen = []
    update_actor = trainer.arr.update_actor
    trainer.arr.update_actor = lambda batch: seen.append(batch) or update_actor(batch)
    assert trainer.fit() == "succeeded"
    generated = sorted(s.reward for s in recorder.samples)
    assert len(generated) == 32 and len(set(generated)) >= 3  # else max_min would keep them all
    (update,) = seen
    updated = update.batch["token_level_scores"].sum(-1).tolist()
    assert len(updated) == 32
    assert set(updated) <= {generated[0], generated[-1]}  # only the best and the worst drawn
    assert recorder.metrics["critic/score/min"] == generated[0]
    assert recorder.metrics["critic/score/max"] == generated[-1]
