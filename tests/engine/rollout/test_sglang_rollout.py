"""The SGLang rollout adapter: its contract against a fake ``sglang`` module at the SGLang boundary
(CPU), the missing-package error at config validation, and a real SGLang engine on a random small
Qwen2 (``gpu``)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import json
import sys
import types

import pytest
import torch

from engine.config import RolloutConfig
from engine.roles.actor_rollout_ref import get_rollout
from engine.rollout.names import SGLANG_MISSING
from engine.rollout.sglang_rollout import SGLangRollout, sampling_params
from engine.tiny.tokenizer import build_tokenizer
from tests.engine.rollout.contract import (
    EOS,
    GREEDY,
    SCRIPT,
    assert_matches_hf_and_reload_changes_outputs,
    assert_scripted_batch,
    gpu_rollout_config,
    prompt_batch,
)
from tests.engine.validation import validation_errors

HAS_SGLANG = importlib.util.find_spec("sglang") is not None


class FakeEngine:
    """The slice of ``sglang.Engine`` the adapter uses, with its documented signatures.

    ``generate`` answers from :data:`SCRIPT` in SGLang's output shape: one dict per prompt, with
    ``meta_info["output_token_logprobs"]`` as ``(logprob, token_id, text)`` triples.
    """

    def __init__(self, **server_args) -> None:
        self.server_args = server_args
        self.calls: list[tuple] = []
        self.updates: list[list[tuple[str, tuple[int, ...], torch.dtype]]] = []
        self.refuse_updates = False

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False):
        self.calls.append(("generate",))
        self.input_ids, self.sampling_params = input_ids, sampling_params
        self.return_logprob = return_logprob
        outputs = []
        for ids in input_ids:
            tokens, logps = SCRIPT[tuple(ids)]
            finish = {"type": "stop", "matched": EOS} if EOS in tokens else {"type": "length"}
            meta = {"finish_reason": finish, "completion_tokens": len(tokens)}
            if return_logprob:
                meta["output_token_logprobs"] = [
                    (lp, t, None) for t, lp in zip(tokens, logps, strict=True)
                ]
            outputs.append({"output_ids": list(tokens), "meta_info": meta})
        return outputs

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(("update_weights_from_tensor", flush_cache))
        self.updates.append([(name, tuple(t.shape), t.dtype) for name, t in named_tensors])
        if self.refuse_updates:
            return False, "Failed to update weights: no parameter named 'w'."
        return True, "Succeeded to update model weights."

    def flush_cache(self):
        self.calls.append(("flush_cache",))

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release_memory_occupation", *tags))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume_memory_occupation", *tags))


@pytest.fixture
def fake_sglang(monkeypatch):
    """Install a fake ``sglang`` module, so that the adapter's lazy import finds FakeEngine."""
    module = types.ModuleType("sglang")
    module.__spec__ = importlib.machinery.ModuleSpec("sglang", None)
    module.Engine = FakeEngine
    monkeypatch.setitem(sys.modules, "sglang", module)
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    return module


def make_rollout(tmp_path, **overrides) -> SGLangRollout:
    config = dataclasses.replace(
        RolloutConfig(name="sglang", enable_sleep_mode=False, dtype="float32"), **overrides
    )
    return SGLangRollout(str(tmp_path), build_tokenizer(), config)


def test_sampling_params_map_training_and_greedy_validation():
    train = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9}
    assert sampling_params(train, 16, [2, 5]) == {
        "n": 1,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.9,
        "max_new_tokens": 16,
        "stop_token_ids": [2, 5],
        "ignore_eos": False,
        "no_stop_trim": True,
    }
    params = sampling_params(GREEDY, 8, [2])
    assert params["temperature"] == 0.0 and params["top_k"] == -1 and params["max_new_tokens"] == 8
    # do_sample=False (validation's val_kwargs) wins over a positive temperature.
    assert sampling_params({**train, "do_sample": False}, 8, [2])["temperature"] == 0.0
    through = sampling_params({**train, "ignore_eos": True}, 8, [2])
    assert through["ignore_eos"] is True and through["stop_token_ids"] == []


def test_the_engine_is_built_from_the_rollout_config(tmp_path, fake_sglang):
    config = dataclasses.replace(
        RolloutConfig(name="sglang"),
        tensor_model_parallel_size=2,
        gpu_memory_utilization=0.3,
        dtype="float16",
        enforce_eager=False,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        max_model_len=1024,
        enable_sleep_mode=True,
    )
    rollout = SGLangRollout(
        str(tmp_path), build_tokenizer(), config, seed=7, engine_kwargs={"log_level": "info"}
    )
    assert rollout.engine.server_args == {
        "model_path": str(tmp_path),
        "tp_size": 2,
        "mem_fraction_static": 0.3,
        "dtype": "float16",
        "random_seed": 7,
        "disable_cuda_graph": False,
        "max_running_requests": 64,
        "chunked_prefill_size": 4096,
        "context_length": 1024,
        "skip_tokenizer_init": True,
        "enable_memory_saver": True,
        "enable_weights_cpu_backup": True,
        "log_level": "info",  # engine_kwargs win
    }
    awake = make_rollout(tmp_path, enable_sleep_mode=False).engine.server_args
    assert awake["enable_memory_saver"] is False and "enable_weights_cpu_backup" not in awake
    assert "context_length" not in awake  # null: SGLang reads it from the model
    assert "json_model_override_args" not in awake  # no override_config: the folder's config


def test_the_policys_changed_config_attributes_reach_sglang_as_model_override_args(
    tmp_path, fake_sglang
):
    changed = {"rope_parameters": {"rope_theta": 37.0, "rope_type": "default"}}
    rollout = get_rollout(
        "sglang",
        None,
        build_tokenizer(),
        RolloutConfig(name="sglang", enable_sleep_mode=False),
        model_path=str(tmp_path),
        model_overrides=changed,
    )
    assert json.loads(rollout.engine.server_args["json_model_override_args"]) == changed


def test_generate_sends_unpadded_token_ids_and_the_sampling_params(tmp_path, fake_sglang):
    rollout = make_rollout(tmp_path)
    sampling = {"do_sample": True, "temperature": 0.5, "top_k": -1, "top_p": 0.8}
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=sampling)
    engine = rollout.engine
    assert engine.input_ids == [[7, 8], [9, 10, 11, 12]]
    assert engine.return_logprob is True
    assert engine.sampling_params == sampling_params(sampling, 3, [EOS])
    assert engine.sampling_params["stop_token_ids"] == [EOS]


def test_generate_assembles_padded_responses_masks_and_log_probs(tmp_path, fake_sglang):
    rollout = make_rollout(tmp_path)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": -1, "top_p": 1.0}
    assert_scripted_batch(
        rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=sampling)
    )


def test_an_output_without_log_probs_is_an_error(tmp_path, fake_sglang):
    rollout = make_rollout(tmp_path)
    rollout.engine.generate = lambda **kwargs: [{"output_ids": [5], "meta_info": {}}] * 2
    with pytest.raises(RuntimeError, match="no output_token_logprobs"):
        rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)


def test_weights_are_pushed_in_buckets_cast_to_the_rollout_dtype_then_the_cache_flushed(
    tmp_path, fake_sglang
):
    rollout = make_rollout(tmp_path)
    rollout.bucket_bytes = 100
    weights = [
        ("a", torch.zeros(10)),  # 40 bytes
        ("b", torch.zeros(15)),  # 60 bytes: fills the first bucket exactly
        ("c", torch.zeros(30)),  # 120 bytes: larger than a bucket, travels alone
        ("d", torch.zeros(5, dtype=torch.float64)),  # cast to the rollout dtype (float32)
    ]
    stats = rollout.load_weights(weights)
    engine = rollout.engine
    assert [[name for name, *_ in bucket] for bucket in engine.updates] == [
        ["a", "b"],
        ["c"],
        ["d"],
    ]
    assert engine.updates[2] == [("d", (5,), torch.float32)]
    assert stats == {"buckets": 3.0, "tensors": 4.0, "bytes": 240.0}
    # Each bucket leaves the cache alone; one flush at the end (cached prefixes are stale).
    assert engine.calls == [("update_weights_from_tensor", False)] * 3 + [("flush_cache",)]


def test_load_weights_sends_a_module_by_its_state_dict_names(tmp_path, fake_sglang):
    rollout = make_rollout(tmp_path, dtype="bfloat16")
    rollout.load_weights(torch.nn.Linear(3, 2))
    assert rollout.engine.updates == [
        [("weight", (2, 3), torch.bfloat16), ("bias", (2,), torch.bfloat16)]
    ]


def test_a_refused_weight_update_is_an_error(tmp_path, fake_sglang):
    rollout = make_rollout(tmp_path)
    rollout.engine.refuse_updates = True
    with pytest.raises(RuntimeError, match="SGLang refused the weight update: .*no parameter"):
        rollout.load_weights([("w", torch.zeros(2))])


def test_sleep_mode_follows_the_hybrid_engine_order(tmp_path, fake_sglang):
    rollout = make_rollout(tmp_path, enable_sleep_mode=True, free_cache_engine=True)
    engine = rollout.engine
    # Asleep while the trainer builds its model.
    assert engine.calls == [("release_memory_occupation", "weights", "kv_cache")]
    engine.calls.clear()
    for _ in range(2):  # two steps: update weights, then generate
        rollout.load_weights([("w", torch.zeros(2))])
        rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)
    step = [
        ("resume_memory_occupation", "weights"),
        ("update_weights_from_tensor", False),
        ("flush_cache",),
        ("resume_memory_occupation", "kv_cache"),
        ("generate",),
        ("release_memory_occupation", "weights", "kv_cache"),
    ]
    assert engine.calls == step + step


def test_generating_without_a_weight_load_wakes_weights_then_cache(tmp_path, fake_sglang):
    rollout = make_rollout(tmp_path, enable_sleep_mode=True, free_cache_engine=False)
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)
    assert rollout.engine.calls == [
        ("release_memory_occupation", "weights", "kv_cache"),
        ("resume_memory_occupation", "weights"),
        ("resume_memory_occupation", "kv_cache"),
        ("generate",),
        ("generate",),  # free_cache_engine=False: stays awake
    ]


def test_without_sleep_mode_the_engine_never_releases_memory(tmp_path, fake_sglang):
    rollout = make_rollout(tmp_path, enable_sleep_mode=False, free_cache_engine=True)
    rollout.load_weights([("w", torch.zeros(2))])
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)
    assert rollout.engine.calls == [
        ("update_weights_from_tensor", False),
        ("flush_cache",),
        ("generate",),
    ]


def test_original_log_probs_are_refused(tmp_path, fake_sglang, monkeypatch):
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "True")
    with pytest.raises(ValueError, match="before temperature scaling.*unset it"):
        make_rollout(tmp_path)


def test_get_rollout_builds_the_sglang_adapter_from_the_model_path(tmp_path, fake_sglang):
    config = RolloutConfig(name="sglang", enable_sleep_mode=False)
    rollout = get_rollout("sglang", None, build_tokenizer(), config, model_path=str(tmp_path))
    assert isinstance(rollout, SGLangRollout)
    assert rollout.engine.server_args["model_path"] == str(tmp_path)
    with pytest.raises(ValueError, match="name=sglang loads the model from .*model.path"):
        get_rollout("sglang", torch.nn.Linear(1, 1), build_tokenizer(), config)


# -- without the package -------------------------------------------------------------------------
def test_missing_sglang_raises_an_import_error_that_names_the_extra(tmp_path, hide_package):
    hide_package("sglang")
    with pytest.raises(ImportError) as info:
        SGLangRollout(str(tmp_path), build_tokenizer(), RolloutConfig(name="sglang"))
    assert str(info.value) == SGLANG_MISSING
    assert "pip install -e .[sglang]" in SGLANG_MISSING and "rollout.name=hf" in SGLANG_MISSING


def test_config_validation_names_the_extra_when_sglang_is_missing(hide_package):
    hide_package("sglang")
    sglang = ["actor_rollout_ref.rollout.name=sglang", "trainer.device=auto"]
    assert validation_errors(sglang) == {"actor_rollout_ref.rollout.name": SGLANG_MISSING}
    # Ray actors build the engine on their own machines: this one need not have SGLang.
    assert validation_errors([*sglang, "trainer.controller=ray"]) == {}


def test_config_validation_accepts_sglang_where_it_imports(fake_sglang):
    assert validation_errors(["actor_rollout_ref.rollout.name=sglang", "trainer.device=auto"]) == {}


def test_config_validation_refuses_sglang_on_a_cpu():
    found = validation_errors(["actor_rollout_ref.rollout.name=sglang", "trainer.device=cpu"])
    assert found["actor_rollout_ref.rollout.name"] == (
        "SGLang needs a CUDA GPU; use actor_rollout_ref.rollout.name=hf or vllm"
    )
    tp = ["actor_rollout_ref.rollout.name=sglang", "trainer.device=auto", "trainer.controller=ray"]
    found = validation_errors([*tp, "actor_rollout_ref.rollout.tensor_model_parallel_size=64"])
    assert "exceeds the" in found["actor_rollout_ref.rollout.tensor_model_parallel_size"]


# -- real SGLang on a GPU ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and HAS_SGLANG), reason="needs a CUDA GPU and SGLang"
)
def test_sglang_log_probs_match_hf_and_a_weight_reload_changes_outputs(tmp_path):
    def build(model_path, tokenizer):
        config = gpu_rollout_config("sglang")
        return SGLangRollout(model_path, tokenizer, config, max_model_len=128, seed=0)

    assert_matches_hf_and_reload_changes_outputs(build, tmp_path)
