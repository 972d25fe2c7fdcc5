"""DAPO's dynamic sampling (algorithm.filter_groups): the group filter worked out by hand, the
generation loop, and a run on the tiny model whose data position resumes exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.data import DataProto
from engine.trainer.dynamic_sampling import (
    fill_batch,
    kept_rows,
    metric_values,
    pad_to_common_width,
)
from engine.trainer.reporting import Recorder


def test_a_group_is_kept_when_its_values_vary_or_it_has_one_response():
    uids = np.array(["a", "a", "b", "b", "c", "c", "d"], dtype=object)
    values = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    # a: std 0 -> dropped; b: std 0.5 -> kept; c: std 0 -> dropped; d: alone -> kept (as verl).
    assert kept_rows(uids, values).tolist() == [False, False, True, True, False, False, True]


def _prompts(groups: list[list[float]], first: int = 0) -> DataProto:
    """Return prompts ``first, first + 1, ...`` whose responses will score ``groups[i]``."""
    values = np.empty(len(groups), dtype=object)
    values[:] = [list(g) for g in groups]
    ids = torch.arange(first, first + len(groups))[:, None]  # (bs, 1)
    return DataProto.from_dict({"input_ids": ids}, {"values": values})


def _generate(prompts: DataProto) -> tuple[DataProto, dict[str, list]]:
    """Stand in for rollout + reward: each prompt's responses score its listed values.

    Each batch has its own widths, as real ones (prompts 2, 3, 4 wide; responses 3, 4, 3).
    """
    ids, groups = prompts.batch["input_ids"][:, 0].tolist(), prompts.non_tensor_batch["values"]
    rows = [(p, v) for p, vals in zip(ids, groups, strict=True) for v in vals]
    width_p, width_r = 2 + ids[0] % 3, 3 + ids[0] // 4 % 2
    scores = torch.zeros(len(rows), width_r)  # (bs * n, R): the score on the first token
    scores[:, 0] = torch.tensor([v for _, v in rows], dtype=torch.float32)
    batch = DataProto.from_dict(
        {
            "prompts": torch.ones(len(rows), width_p, dtype=torch.long),
            "responses": torch.ones(len(rows), width_r, dtype=torch.long),
            "token_level_scores": scores,
            "prompt": torch.tensor([p for p, _ in rows]),
        },
        {"uid": np.array([f"p{p}" for p, _ in rows], dtype=object)},
    )
    return batch, {"acc": [v for _, v in rows], "score": [v for _, v in rows]}


def test_generation_continues_until_the_batch_is_full_and_is_cut_to_size():
    # train_batch_size 4, n 2. Batch 1 keeps prompt 1 (1 group), batch 2 keeps 5 and 6 (3),
    # batch 3 keeps 8 and 9 (5): cut to 4 groups, prompts 1, 5, 6, 8. Batch 4 is never drawn.
    first = _prompts([[1, 1], [0, 1], [0, 0], [1, 1]])
    more = iter(
        [
            _prompts([[0, 0], [1, 0], [0, 1], [1, 1]], first=4),
            _prompts([[1, 0], [0, 1], [0, 0], [0, 0]], first=8),
            "never drawn",
        ]
    )
    batch, info, stats = fill_batch(
        first, more, _generate, metric="acc", train_batch_size=4, n=2, max_num_gen_batches=0
    )
    assert batch.batch["prompt"].tolist() == [1, 1, 5, 5, 6, 6, 8, 8]
    assert info["acc"] == [0, 1, 1, 0, 0, 1, 1, 0]
    assert stats.metrics() == {
        "train/num_gen_batches": 3.0,
        "train/num_kept_groups": 5.0,  # before the cut
        "train/num_dropped_groups": 7.0,  # 3 + 2 + 2
    }
    assert next(more) == "never drawn"
    assert batch.batch["prompts"].shape == (8, 4) and batch.batch["responses"].shape == (8, 4)


def test_batches_of_other_widths_are_padded_as_the_rollout_pads():
    # Batch A: prompt width 1, response width 2. Batch B: prompt 2, response 1. Pad id 9.
    a = DataProto.from_dict(
        {
            "prompts": torch.tensor([[5]]),
            "responses": torch.tensor([[6, 7]]),
            "input_ids": torch.tensor([[5, 6, 7]]),
            "attention_mask": torch.tensor([[1, 1, 1]]),
            "position_ids": torch.tensor([[0, 1, 2]]),
            "response_mask": torch.tensor([[1, 1]]),
        }
    )
    b = DataProto.from_dict(
        {
            "prompts": torch.tensor([[3, 4]]),
            "responses": torch.tensor([[8]]),
            "input_ids": torch.tensor([[3, 4, 8]]),
            "attention_mask": torch.tensor([[1, 1, 1]]),
            "position_ids": torch.tensor([[0, 1, 2]]),
            "response_mask": torch.tensor([[1]]),
        }
    )
    both = DataProto.concat(pad_to_common_width([a, b], pad_token_id=9)).batch
    assert both["prompts"].tolist() == [[9, 5], [3, 4]]  # left padding
    assert both["responses"].tolist() == [[6, 7], [8, 9]]  # right padding
    assert both["input_ids"].tolist() == [[9, 5, 6, 7], [3, 4, 8, 9]]
    assert both["attention_mask"].tolist() == [[0, 1, 1, 1], [1, 1, 1, 0]]
    assert both["position_ids"].tolist() == [[0, 0, 1, 2], [0, 1, 2, 2]]
    assert both["response_mask"].tolist() == [[1, 1], [1, 0]]


def test_the_limit_on_generation_batches_stops_with_what_to_change():
    first = _prompts([[1, 1], [0, 0]])
    more = iter([_prompts([[0, 1], [0, 0]], first=2), _prompts([[1, 0], [1, 1]], first=4)])
    with pytest.raises(ValueError) as caught:
        fill_batch(
            first, more, _generate, metric="score", train_batch_size=2, n=2, max_num_gen_batches=2
        )
    message = str(caught.value)
    assert "2 generation batches (max_num_gen_batches=2) kept 1 of the 2 groups" in message
    assert "Raise algorithm.filter_groups.max_num_gen_batches" in message
    assert "check the data" in message


def test_seq_reward_reads_the_tensor_and_an_unknown_metric_names_the_choices():
    batch, info = _generate(_prompts([[0.5, 0.25]]))
    assert metric_values(batch, info, "seq_reward").tolist() == [0.5, 0.25]
    assert metric_values(batch, info, "seq_final_reward").tolist() == [0.5, 0.25]
    with pytest.raises(ValueError, match=r"metric='acc_x' is not produced.*acc, score, seq_final"):
        metric_values(batch, info, "acc_x")


# -- on the tiny model ---------------------------------------------------------------------------

# Groups of even-numbered prompts vary in `spread`; odd ones do not: with data.shuffle=False each
# generation batch of 4 prompts keeps exactly 2 groups, so a step of 4 needs 2 batches.
PARITY_REWARD = """
import random

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    even = extra_info["index"] % 2 == 0
    return {"score": 0.0, "spread": random.random() if even else 0.0}
"""


def _filter_config(make_config, tmp_path, *overrides):
    reward = tmp_path / "parity_reward.py"
    reward.write_text(PARITY_REWARD)
    return make_config(
        "grpo_tiny",
        "actor_rollout_ref.rollout.n=2",
        "data.shuffle=False",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=spread",
        f"custom_reward_function.path={reward}",
        "trainer.save_freq=1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]",
        *overrides,
    )


class StepLog(Recorder):
    """Keep each step's metrics and its training samples' prompt indices."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict] = {}
        self.prompts: dict[int, list[int]] = {}

    def on_step(self, step, metrics):
        self.metrics[step] = metrics

    def on_samples(self, step, samples):
        self.prompts[step] = sorted({r.prompt_index for r in samples if r.split == "train"})


def test_a_filtered_run_keeps_the_varying_groups_and_resumes_at_the_next_batch(
    make_config, tmp_path
):
    from engine.trainer import checkpoint
    from engine.trainer.ppo_trainer import PPOTrainer

    log = StepLog()
    trainer = PPOTrainer(_filter_config(make_config, tmp_path), recorder=log)
    trainer.fit()
    # Step 1 used batches 0-3 and 4-7 and kept 0, 2, 4, 6; step 2 used 8-15 and kept the evens.
    assert log.prompts == {1: [0, 2, 4, 6], 2: [8, 10, 12, 14]}
    for step in (1, 2):
        assert log.metrics[step]["train/num_gen_batches"] == 2.0
        assert log.metrics[step]["train/num_kept_groups"] == 4.0
        assert log.metrics[step]["train/num_dropped_groups"] == 4.0
    state = checkpoint.load_state(tmp_path / "ckpt" / "global_step_1" / checkpoint.STATE_FILE)
    assert state["dataloader"] == {"epoch": 0, "position": 2, "seed": 1}  # two batches consumed

    # Resuming from step 1 draws batches 2 and 3, as the uninterrupted run did.
    resumed_log = StepLog()
    resumed = PPOTrainer(
        _filter_config(
            make_config,
            tmp_path,
            f"trainer.resume_from_path={tmp_path / 'ckpt' / 'global_step_1'}",
            "trainer.resume_mode=resume_path",
        ),
        recorder=resumed_log,
    )
    resumed.fit()
    assert resumed_log.prompts == {2: [8, 10, 12, 14]}
    assert resumed.train_loader.state_dict()["position"] == 4


def test_a_run_whose_groups_never_vary_stops_at_max_num_gen_batches(make_config, tmp_path):
    from engine.trainer.ppo_trainer import PPOTrainer

    reward = tmp_path / "constant_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, **kw):\n    return 0.5\n"
    )
    trainer = PPOTrainer(
        make_config(
            "grpo_tiny",
            "actor_rollout_ref.rollout.n=2",
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=score",
            "algorithm.filter_groups.max_num_gen_batches=2",
            "data.gen_batch_size=6",
            f"custom_reward_function.path={reward}",
        )
    )
    assert trainer.train_loader.batch_size == 6  # data.gen_batch_size prompts per generation
    with pytest.raises(
        ValueError, match=r"2 generation batches \(max_num_gen_batches=2\) kept 0 of"
    ):
        trainer.fit()
    assert trainer.train_loader.state_dict()["position"] == 2
