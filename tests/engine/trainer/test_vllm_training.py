"""The single-process trainer with ``actor_rollout_ref.rollout.name=vllm`` (vLLM's CPU build).

The run is the ``hf`` run's: validation before training is greedy, so both backends score the
same answers token for token; each step records ``training/rollout_probs_diff_*`` between
vLLM's sampled-token log-probs and the actor's recomputation, which stay within the fp32
tolerance of ``test_vllm_engine`` after every weight sync.
"""

from __future__ import annotations

import math

import pytest

from engine.trainer.run import run_training
from tests.engine.rollout.test_vllm_engine import KV_CACHE_BYTES, LOGP_ATOL
from tests.engine.trainer.test_trainer import ListRecorder
from tests.vllm_tests import requires_vllm

pytestmark = [
    pytest.mark.slow,
    requires_vllm,
]

VLLM = [
    "actor_rollout_ref.rollout.name=vllm",
    f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={KV_CACHE_BYTES}",
]
VALIDATE = ["trainer.val_before_train=True", "trainer.test_freq=-1", "data.val_max_samples=64"]


def run(config) -> ListRecorder:
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    return recorder


def test_a_grpo_run_on_vllm_validates_as_hf_and_records_the_probs_diff(make_config):
    diff = ["actor_rollout_ref.rollout.calculate_log_probs=True"]
    vllm = run(make_config("grpo_tiny", *VLLM, *VALIDATE, *diff))
    hf = run(make_config("grpo_tiny", *VALIDATE))

    def validation(recorder):
        (step, metrics), *_ = recorder.steps
        assert step == 0
        return {k: v for k, v in metrics.items() if k.startswith("val-")}

    assert validation(vllm) == validation(hf)  # greedy: the same answers, the same scores
    assert [step for step, _ in vllm.steps] == [0, 1, 2]
    for _, metrics in vllm.steps[1:]:
        assert metrics["training/rollout_probs_diff_valid"] == 1.0
        assert math.isfinite(metrics["training/rollout_probs_diff_mean"])
        # |p - q| <= |log p - log q| for probabilities: the log-prob tolerance bounds it.
        assert metrics["training/rollout_probs_diff_max"] <= LOGP_ATOL
        assert metrics["timing_s/update_weights"] > 0
