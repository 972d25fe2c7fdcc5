"""The vLLM rollout adapter: its contract against a fake engine at the vLLM boundary (CPU), and a
real vLLM engine on a random small Qwen2 (``gpu``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch

from engine.config import RolloutConfig
from engine.roles.actor_rollout_ref import get_rollout
from engine.rollout.vllm_rollout import (
    VLLM_MISSING,
    VLLMRollout,
    assemble_responses,
    iter_buckets,
    sampling_kwargs,
)
from engine.tiny.tokenizer import build_tokenizer
from tests.engine.rollout.contract import (
    EOS,
    GREEDY,
    PAD,
    SCRIPT,
    assert_matches_hf_and_reload_changes_outputs,
    assert_scripted_batch,
    gpu_rollout_config,
    prompt_batch,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None


class FakeLLM:
    """The slice of ``vllm.LLM`` the adapter uses; ``script`` maps prompt ids to a response."""

    def __init__(self, script: dict[tuple[int, ...], tuple[list[int], list[float]]]) -> None:
        self.script = script
        self.calls: list[tuple] = []
        self.buckets: list[list[tuple[str, tuple[int, ...], torch.dtype]]] = []

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append(("generate",))
        self.prompts, self.params = prompts, sampling_params
        outputs = []
        for prompt in prompts:
            tokens, logps = self.script[tuple(prompt["prompt_token_ids"])]
            logprobs = [
                {t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, logps, strict=True)
            ]
            completion = SimpleNamespace(token_ids=tuple(tokens), logprobs=logprobs)
            outputs.append(SimpleNamespace(outputs=[completion]))
        return outputs

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", *tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def apply_model(self, fn):
        self.calls.append(("apply_model",))
        return [fn(self)]

    def load_weights(self, weights):  # the model inside the engine, as apply_model hands it over
        bucket = [(name, tuple(t.shape), t.dtype) for name, t in weights]
        self.buckets.append(bucket)
        return {name for name, *_ in bucket}


def make_rollout(tmp_path, engine, **overrides) -> VLLMRollout:
    config = dataclasses.replace(
        RolloutConfig(name="vllm", enable_sleep_mode=False, dtype="float32"), **overrides
    )
    return VLLMRollout(
        str(tmp_path), build_tokenizer(), config, engine=engine, sampling_params_cls=SimpleNamespace
    )


def test_sampling_kwargs_map_training_and_greedy_validation():
    train = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9}
    greedy = {"do_sample": False, "temperature": 0.0, "top_k": -1, "top_p": 1.0}
    assert sampling_kwargs(train, 16, [2, 5]) == {
        "n": 1,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.9,
        "max_tokens": 16,
        "logprobs": 0,
        "detokenize": False,
        "stop_token_ids": [2, 5],
        "ignore_eos": False,
    }
    params = sampling_kwargs(greedy, 8, [2])
    assert params["temperature"] == 0.0 and params["top_k"] == -1 and params["max_tokens"] == 8
    # do_sample=False wins over a positive temperature.
    assert sampling_kwargs({**train, "do_sample": False}, 8, [2])["temperature"] == 0.0
    through = sampling_kwargs({**train, "ignore_eos": True}, 8, [2])
    assert through["ignore_eos"] is True and through["stop_token_ids"] == []


def test_generate_sends_unpadded_token_ids_and_the_sampling_params(tmp_path):
    engine = FakeLLM(SCRIPT)
    rollout = make_rollout(tmp_path, engine)
    sampling = {"do_sample": True, "temperature": 0.5, "top_k": -1, "top_p": 0.8}
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=sampling)
    assert engine.prompts == [{"prompt_token_ids": [7, 8]}, {"prompt_token_ids": [9, 10, 11, 12]}]
    params = engine.params
    assert (params.n, params.temperature, params.top_p, params.max_tokens) == (1, 0.5, 0.8, 3)
    assert (params.logprobs, params.detokenize, params.stop_token_ids) == (0, False, [EOS])


def test_generate_assembles_padded_responses_masks_and_log_probs(tmp_path):
    rollout = make_rollout(tmp_path, FakeLLM(SCRIPT))
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": -1, "top_p": 1.0}
    assert_scripted_batch(
        rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=sampling)
    )


def test_assemble_masks_tokens_after_the_first_eos():
    responses, mask, logp, truncated = assemble_responses(
        [[5, EOS, 6], []], [[-1.0, -2.0, -3.0], []], eos_ids=[EOS], pad_token_id=PAD
    )
    assert torch.equal(responses, torch.tensor([[5, EOS, PAD], [PAD, PAD, PAD]]))
    assert torch.equal(mask, torch.tensor([[1, 1, 0], [0, 0, 0]]))
    torch.testing.assert_close(logp, torch.tensor([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0]]))
    assert truncated.tolist() == [False, True]


def test_generation_config_eos_ids_stop_generation_too(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 40]}))
    rollout = make_rollout(tmp_path, FakeLLM(SCRIPT))
    assert rollout.eos_ids == [2, 40]


def test_weights_are_pushed_in_order_in_buckets_of_at_most_bucket_bytes(tmp_path):
    engine = FakeLLM(SCRIPT)
    rollout = make_rollout(tmp_path, engine)
    rollout.bucket_bytes = 100
    weights = [
        ("a", torch.zeros(10)),  # 40 bytes
        ("b", torch.zeros(15)),  # 60 bytes: fills the first bucket exactly
        ("c", torch.zeros(30)),  # 120 bytes: larger than a bucket, travels alone
        ("d", torch.zeros(5, dtype=torch.float64)),  # cast to the rollout dtype (float32)
    ]
    stats = rollout.load_weights(weights)
    assert [[name for name, *_ in bucket] for bucket in engine.buckets] == [
        ["a", "b"],
        ["c"],
        ["d"],
    ]
    assert engine.buckets[2] == [("d", (5,), torch.float32)]
    assert stats == {"buckets": 3.0, "tensors": 4.0, "bytes": 240.0}
    assert engine.calls[-1] == ("reset_prefix_cache",)  # cached prefixes used the old weights


def test_iter_buckets_rejects_a_non_positive_size():
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        list(iter_buckets([("a", torch.zeros(1))], 0))


def test_load_weights_accepts_a_module_by_its_state_dict_names(tmp_path):
    engine = FakeLLM(SCRIPT)
    make_rollout(tmp_path, engine, dtype="bfloat16").load_weights(torch.nn.Linear(3, 2))
    assert engine.buckets == [[("weight", (2, 3), torch.bfloat16), ("bias", (2,), torch.bfloat16)]]


def test_sleep_mode_follows_the_hybrid_engine_order(tmp_path):
    engine = FakeLLM(SCRIPT)
    rollout = make_rollout(tmp_path, engine, enable_sleep_mode=True, free_cache_engine=True)
    assert engine.calls == [("sleep", 1)]  # asleep while the trainer builds its model
    engine.calls.clear()
    sampling = GREEDY
    for _ in range(2):  # two steps: update weights, then generate
        rollout.load_weights([("w", torch.zeros(2))])
        rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=sampling)
    step = [
        ("wake_up", "weights"),
        ("apply_model",),
        ("reset_prefix_cache",),
        ("wake_up", "kv_cache"),
        ("generate",),
        ("sleep", 1),
    ]
    assert engine.calls == step + step


def test_generating_without_a_weight_load_wakes_weights_then_cache(tmp_path):
    engine = FakeLLM(SCRIPT)
    rollout = make_rollout(tmp_path, engine, enable_sleep_mode=True, free_cache_engine=False)
    sampling = GREEDY
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=sampling)
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=sampling)
    assert engine.calls == [
        ("sleep", 1),
        ("wake_up", "weights"),
        ("wake_up", "kv_cache"),
        ("generate",),
        ("generate",),  # free_cache_engine=False: stays awake
    ]


def test_without_sleep_mode_the_engine_is_never_put_to_sleep(tmp_path):
    engine = FakeLLM(SCRIPT)
    rollout = make_rollout(tmp_path, engine, enable_sleep_mode=False, free_cache_engine=True)
    rollout.load_weights([("w", torch.zeros(2))])
    sampling = GREEDY
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=sampling)
    assert engine.calls == [("apply_model",), ("reset_prefix_cache",), ("generate",)]


def test_an_injected_engine_needs_a_sampling_params_class(tmp_path):
    with pytest.raises(ValueError, match="sampling_params_cls"):
        VLLMRollout(str(tmp_path), build_tokenizer(), RolloutConfig(), engine=FakeLLM({}))


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_missing_vllm_raises_an_import_error_that_says_what_to_do(tmp_path):
    with pytest.raises(ImportError) as info:
        VLLMRollout(str(tmp_path), build_tokenizer(), RolloutConfig(name="vllm"))
    assert str(info.value) == VLLM_MISSING
    assert "pip install -e .[gpu]" in VLLM_MISSING and "rollout.name=hf" in VLLM_MISSING


def test_get_rollout_vllm_needs_a_model_path():
    with pytest.raises(ValueError, match="actor_rollout_ref.model.path"):
        get_rollout("vllm", torch.nn.Linear(1, 1), build_tokenizer(), RolloutConfig(name="vllm"))


# -- real vLLM on a GPU ------------------------------------------------------------------------
gpu = pytest.mark.gpu
needs_vllm_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and HAS_VLLM), reason="needs a CUDA GPU and vLLM"
)


@gpu
@needs_vllm_gpu
def test_vllm_log_probs_match_hf_and_a_weight_reload_changes_outputs(tmp_path):
    def build(model_path, tokenizer):
        config = gpu_rollout_config("vllm")
        return VLLMRollout(model_path, tokenizer, config, max_model_len=128, seed=0)

    assert_matches_hf_and_reload_changes_outputs(build, tmp_path)
