"""System metrics of a training step: memory, CPU and MFU, under verl's ``perf/`` names.

verl's FSDP workers record, after each update, ``perf/max_memory_allocated_gb`` and
``perf/max_memory_reserved_gb`` (the CUDA caching allocator's peaks), ``perf/cpu_memory_used_gb``
(the machine's used memory, ``psutil.virtual_memory().used``) and ``perf/mfu/actor`` (model FLOPs
of the update over the device's peak, ``verl/utils/flops_counter.py``); the controller reduces
the ranks' values with ``reduce_metrics``: the max of a name containing ``max``, the min of one
containing ``min``, else the mean (:func:`reduce_rank_metrics`). We add what verl leaves to its
profiler: each process's resident memory and CPU use, the driver's as ``perf/driver/*`` and the
ranks' as ``perf/max_rss_gb`` / ``perf/max_cpu_percent`` (the largest rank), and the memory
still available on the machine (``perf/min_memory_available_gb``, the tightest node), which the
studio's memory-growth health check extrapolates against.

MFU: the FLOPs are verl's estimate for a dense decoder (Qwen2, Llama, Mistral, Qwen3):
``6 x dense parameters x tokens`` for the linear layers, forward and backward, plus
``6 x sum(seqlen^2) x head_dim x heads x layers`` for attention, times ``ppo_epochs``. The
device's peak is the dense bf16 figure of :data:`DEVICE_PEAK_FLOPS` (verl's table) for a known
GPU; on a CPU it is measured once per process (:func:`measured_cpu_peak_flops`: the best of a
few fp32 matmuls on torch's current threads), since a CPU's peak depends on its cores, vector
units and the threads a run may use, which no table knows. An unknown GPU gets no MFU rather
than verl's 0 (its infinite peak).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psutil
import torch

GB = 1024**3

# Dense bf16 peak FLOP/s of known accelerators (verl's ``_DEVICE_FLOPS``); the longest name
# contained in the device's name wins, so "H100" does not match an "H1000".
DEVICE_PEAK_FLOPS: dict[str, float] = {
    "GB200": 2.5e15,
    "B200": 2.25e15,
    "MI300X": 1336e12,
    "H100": 989e12,
    "H800": 989e12,
    "H200": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362.05e12,
    "L40": 181.05e12,
    "A40": 149.7e12,
    "L20": 119.5e12,
    "H20": 148e12,
    "910B": 354e12,
    "RTX 3070 Ti": 21.75e12,
}


def table_peak_flops(device_name: str) -> float | None:
    """Return the table's peak FLOP/s for a device name, or None when no entry matches."""
    matches = [name for name in DEVICE_PEAK_FLOPS if name in device_name]
    return DEVICE_PEAK_FLOPS[max(matches, key=len)] if matches else None


@functools.cache
def measured_cpu_peak_flops(size: int = 512, repeats: int = 32) -> float:
    """Return the fp32 matmul FLOP/s this process reaches on torch's current threads.

    The best of ``repeats`` ``(size, size) @ (size, size)`` products after one warm-up
    (``2 * size^3`` FLOPs each): the figure a CPU run's MFU is measured against. A shared
    machine preempts some of them, which would understate the peak and put MFU over 1 (a CI run on
    a loaded machine read 1.02 with the best of 8); the more products, the likelier one of them
    ran alone.
    """
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / max(best, 1e-9)


def device_peak_flops(device: torch.device) -> float | None:
    """Return the peak FLOP/s of ``device``: the table's for a GPU (None when unknown), the
    measured figure on a CPU."""
    if device.type == "cuda":
        return table_peak_flops(torch.cuda.get_device_name(device))
    return measured_cpu_peak_flops()


def estimate_decoder_flops(model_config: Any, seqlens: Sequence[int]) -> float:
    """Return the FLOPs of one forward and backward pass over sequences of ``seqlens`` tokens.

    verl's ``_estimate_qwen2_flops``, which verl uses for Qwen2/3, Llama and Mistral; another
    model type with the same config fields is counted the same way (a mixture of experts is
    over-counted), one without them as 0.
    """
    c = model_config
    if not all(
        hasattr(c, k)
        for k in ("hidden_size", "vocab_size", "num_hidden_layers", "intermediate_size")
    ):
        return 0.0
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    mlp = c.hidden_size * c.intermediate_size * 3  # gate, up and down projections
    attn_linear = c.hidden_size * (2 * heads * head_dim + 2 * kv_heads * head_dim)  # q, o, k, v
    embeddings = c.vocab_size * c.hidden_size * 2  # embedding and LM head, as verl counts them
    dense = (mlp + attn_linear) * c.num_hidden_layers + embeddings
    tokens = sum(seqlens)
    attention = 6 * sum(n * n for n in seqlens) * head_dim * heads * c.num_hidden_layers
    return float(6 * dense * tokens + attention)


def compute_mfu(flops: float, seconds: float, peak_flops: float | None) -> float | None:
    """Return achieved FLOP/s over the peak, or None without a peak or a duration."""
    if not peak_flops or seconds <= 0:
        return None
    return flops / seconds / peak_flops


def update_mfu(
    model_config: Any,
    attention_mask: torch.Tensor,
    seconds: float,
    *,
    epochs: int,
    device: torch.device,
) -> float | None:
    """Return the MFU of an update of ``epochs`` passes over a batch in ``seconds``.

    Args:
        attention_mask: (bs, L) 1 on the prompt and response tokens of each sequence.
    """
    seqlens = attention_mask.sum(-1).tolist()  # (bs,)
    flops = estimate_decoder_flops(model_config, seqlens) * epochs
    return compute_mfu(flops, seconds, device_peak_flops(device))


class ProcessMeter:
    """This process's resident memory and CPU use since the previous reading."""

    def __init__(self) -> None:
        self.process = psutil.Process(os.getpid())
        self._last = self._clock()

    def _clock(self) -> tuple[float, float]:
        times = self.process.cpu_times()
        return time.perf_counter(), times.user + times.system

    def read(self) -> tuple[float, float]:
        """Return ``(rss_gb, cpu_percent)``: 100 is one core busy for the whole interval."""
        now = self._clock()
        wall = now[0] - self._last[0]
        cpu = now[1] - self._last[1]
        self._last = now
        rss = self.process.memory_info().rss / GB
        return rss, 100.0 * cpu / wall if wall > 0 else 0.0


def machine_memory_metrics() -> dict[str, float]:
    """Return the machine's used memory (verl's name) and what is still available."""
    memory = psutil.virtual_memory()
    return {
        "perf/cpu_memory_used_gb": memory.used / GB,
        "perf/min_memory_available_gb": memory.available / GB,
    }


def rank_system_metrics(meter: ProcessMeter, device: torch.device) -> dict[str, float]:
    """Return one rank's memory and CPU use, and the CUDA allocator's peaks on a GPU."""
    rss, cpu = meter.read()
    metrics = {"perf/max_rss_gb": rss, "perf/max_cpu_percent": cpu, **machine_memory_metrics()}
    if device.type == "cuda":
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / GB
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / GB
    return metrics


def driver_system_metrics(meter: ProcessMeter) -> dict[str, float]:
    """Return the driver process's resident memory and CPU use, and the machine's memory."""
    rss, cpu = meter.read()
    return {"perf/driver/rss_gb": rss, "perf/driver/cpu_percent": cpu, **machine_memory_metrics()}


def reduce_rank_metrics(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Return each metric reduced over the ranks that report it, as verl's ``reduce_metrics``:
    the max of a name containing ``max``, the min of one containing ``min``, else the mean."""
    keys = dict.fromkeys(k for metrics in per_rank for k in metrics)
    reduced = {}
    for key in keys:
        values = [m[key] for m in per_rank if key in m]
        if "max" in key:
            reduced[key] = max(values)
        elif "min" in key:
            reduced[key] = min(values)
        else:
            reduced[key] = sum(values) / len(values)
    return reduced
