"""System metrics: verl's MFU arithmetic on known inputs, the device table, the process meter."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from engine.perf import (
    DEVICE_PEAK_FLOPS,
    ProcessMeter,
    compute_mfu,
    device_peak_flops,
    estimate_decoder_flops,
    measured_cpu_peak_flops,
    rank_system_metrics,
    table_peak_flops,
    update_mfu,
)

# A small Qwen2-like config whose FLOPs are worked out by hand below.
CONFIG = SimpleNamespace(
    model_type="qwen2",
    hidden_size=8,
    vocab_size=10,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=16,
)


def test_decoder_flops_match_verl_formula_worked_by_hand():
    # head_dim 4; q,o: 2 heads x 4 = 8 each, k,v: 1 head x 4 = 4 each -> 8 x (8+8+4+4) = 192;
    # mlp 8 x 16 x 3 = 384; per layer 576, x 2 layers = 1152; embeddings 10 x 8 x 2 = 160.
    dense = 1152 + 160
    seqlens = [3, 5]
    # attention: 6 x (9 + 25) x head_dim 4 x heads 2 x layers 2
    attention = 6 * 34 * 4 * 2 * 2
    assert estimate_decoder_flops(CONFIG, seqlens) == 6 * dense * 8 + attention == 66240


def test_mfu_is_achieved_flops_over_the_peak():
    assert compute_mfu(1e12, 2.0, 1e12) == pytest.approx(0.5)
    assert compute_mfu(1e12, 2.0, None) is None  # an unknown GPU gets no MFU
    assert compute_mfu(1e12, 0.0, 1e12) is None
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])  # (bs=2, L=5): seqlens 3 and 5
    peak = measured_cpu_peak_flops()
    mfu = update_mfu(CONFIG, mask, 1e-3, epochs=2, device=torch.device("cpu"))
    assert mfu == pytest.approx(2 * 66240 / 1e-3 / peak)


def test_the_device_table_matches_the_longest_name():
    assert table_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert table_peak_flops("NVIDIA L40S") == DEVICE_PEAK_FLOPS["L40S"]  # not L40's
    assert table_peak_flops("NVIDIA L40") == DEVICE_PEAK_FLOPS["L40"]
    assert table_peak_flops("Some Future GPU") is None


def test_the_measured_cpu_peak_is_a_plausible_figure():
    peak = measured_cpu_peak_flops()
    assert 1e8 < peak < 1e13  # between a slow core and a large server's vector units


def test_the_process_meter_sees_memory_and_a_busy_core():
    meter = ProcessMeter()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    rss, cpu = meter.read()
    assert 0.01 < rss < 64  # GiB: this test process holds torch
    assert 20 < cpu <= 110  # one core busy for most of the interval (a shared machine)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_rank_reports_its_allocator_peaks_and_its_devices_table_peak():
    device = torch.device("cuda")
    block = torch.empty(64 * 1024**2 // 4, device=device)  # 64 MiB held while the rank reads
    metrics = rank_system_metrics(ProcessMeter(), device)
    assert metrics["perf/max_memory_allocated_gb"] >= 64 / 1024
    assert metrics["perf/max_memory_reserved_gb"] >= metrics["perf/max_memory_allocated_gb"]
    del block
    name = torch.cuda.get_device_name(device)
    peak = device_peak_flops(device)
    # The lent machines (H100, H200) are in the table: MFU is measured against it, never 0.
    assert peak == table_peak_flops(name) and peak is not None, name
