"""Runs with generated samples, written through the recorder's COPY path (``samples_write``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from engine.trainer.reporting import SampleRecord
from tests.webapp.fixtures import make_experiment
from webapp.runs.driver_writes import samples_write
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_create


def records(
    step: int,
    prompt_index: int,
    rewards: Sequence[float],
    *,
    split: str = "train",
    prompt_text: str | None = None,
    responses: Sequence[str] | None = None,
    **fields: Any,
) -> list[SampleRecord]:
    """Return one group: a response per reward, with three tokens each and known log-probs."""
    prompt = prompt_text if prompt_text is not None else f"What is {prompt_index} + 1?"
    out = []
    for i, reward in enumerate(rewards):
        response = responses[i] if responses is not None else f"answer {prompt_index}-{i} at {step}"
        values: dict[str, Any] = dict(
            step=step,
            split=split,
            prompt_index=prompt_index,
            sample_index=i,
            group_id=f"{split}-{step}-{prompt_index}",
            data_source="tiny_arithmetic",
            prompt_text=prompt,
            response_text=response,
            ground_truth=str(prompt_index + 1),
            reward=reward,
            reward_parts={"correct": reward, "format": 0.5},
            advantage=float(i) - 1.0,
            response_length=3 + i,
            truncated=i == 3,
            tokens=["Ġ4", "2", "</s>"],
            token_logprobs=[-0.25, -1.5, -0.125],
            token_ref_logprobs=[-0.5, -1.0, -0.125],
            token_advantages=[float(i) - 1.0] * 3,
        )
        values.update(fields)
        out.append(SampleRecord(**values))
    return out


def finished_run(owner: Any, name: str = "tiny grpo") -> Run:
    run = run_create(experiment=make_experiment(owner, name=name))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    return run


@pytest.fixture
def sampled_run(owner) -> Run:
    """A finished run: train steps 1-3 with 3 prompts x 4 samples, validation at steps 0 and 3.

    Train rewards at step s for prompt p: [p, p + 1, p + 2, p + 3] / 4 + s, with one NaN
    (step 2, prompt 2, sample 3) and one null advantage (step 3, prompt 0, sample 0).
    """
    run = finished_run(owner)
    rows: list[SampleRecord] = []
    for step in (1, 2, 3):
        for prompt in range(3):
            rewards = [(prompt + i) / 4 + step for i in range(4)]
            if (step, prompt) == (2, 2):
                rewards[3] = float("nan")
            group = records(step, prompt, rewards)
            if (step, prompt) == (3, 0):
                group[0].advantage = None
            rows += group
    for step in (0, 3):
        for prompt in range(2):
            rows += records(
                step, prompt, [float(step == 3)], split="val", prompt_text=f"val {prompt}"
            )
    samples_write(run_id=run.pk, samples=rows)
    return run
