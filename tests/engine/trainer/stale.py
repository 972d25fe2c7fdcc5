"""What the asynchronous trainers' tests share: recording the weights each step trained from,
scoring a batch under given weights, and the check that a trainer with no lead trains exactly
as the synchronous one does."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from engine.data import DataProto
from engine.roles.actor import response_logits
from engine.roles.model_loading import policy_state
from engine.trainer import PPOTrainer

# One set of weights scored by two fp32 kernels (the sampler's cached decode, a full forward)
# agrees to about 3e-5 in a log-prob; the weights one update away differ by over 1e-2.
SAME_WEIGHTS_ATOL = 1e-4


class RecordsSteps:
    """A trainer mixin that keeps each step's batch and the actor's weights it was trained from."""

    arr: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.weights_before: list[dict[str, torch.Tensor]] = []
        self.batches: list[DataProto] = []
        super().__init__(*args, **kwargs)

    def train_step(self, prompts, more_prompts=None):
        self.weights_before.append(policy_state(self.arr.model))
        metrics, batch, reward_info = super().train_step(prompts, more_prompts)  # type: ignore[misc]
        self.batches.append(batch)
        return metrics, batch, reward_info


def log_probs_under(model: torch.nn.Module, weights: dict, batch: DataProto) -> torch.Tensor:
    """Return the log-prob (bs, R) of each sampled response token under ``weights``."""
    policy = copy.deepcopy(model)
    policy.load_state_dict(weights)
    policy.eval()
    with torch.no_grad():
        logits = response_logits(policy, batch.batch)  # (bs, R, V)
        chosen = torch.log_softmax(logits, -1).gather(-1, batch.batch["responses"][..., None])
    return chosen.squeeze(-1)  # (bs, R)


def parameter_diff(expected, got) -> float:
    """Return the largest absolute difference between two models' (or state dicts')
    parameters and buffers."""
    want, have = (m.state_dict() if isinstance(m, torch.nn.Module) else m for m in (expected, got))
    return max((want[k] - have[k]).abs().max().item() for k in want)


def assert_trains_as_the_synchronous_trainer(
    make_config: Callable[..., Any], make_trainer: Callable[[], PPOTrainer]
) -> tuple[PPOTrainer, list[dict[str, float]]]:
    """Fit the synchronous trainer on the tiny preset, then ``make_trainer()``'s (with a
    ``ListRecorder``, no lead); assert equal weights, no staleness and the expected policy
    versions; return the asynchronous trainer and its steps' metrics."""
    sync = PPOTrainer(make_config("grpo_tiny"))
    assert sync.fit() == "succeeded"
    trainer = make_trainer()  # built after the synchronous run, as a run of its own would be
    assert trainer.fit() == "succeeded"
    # Same seeds, the same samples from the worker process, the same updates: in fp32 (the CPU
    # engine's only dtype) the parameters agree to the bit, well within 1e-6.
    diff = parameter_diff(sync.arr.model, trainer.arr.model)
    assert diff <= 1e-6
    assert diff == 0.0
    steps = trainer.recorder.steps  # type: ignore[attr-defined]
    for step, metrics in steps:
        assert metrics["async/staleness_max"] == 0.0
        assert metrics["async/rollout_policy_version"] == step - 1
    return trainer, [metrics for _, metrics in steps]
