"""The ``perf/`` system metrics of a tiny training step (``engine.perf``), single process."""

from __future__ import annotations

import os

import pytest

from engine.trainer import PPOTrainer
from tests.engine.trainer.test_trainer import ListRecorder


def test_a_tiny_step_records_memory_cpu_and_mfu(make_config):
    trainer = PPOTrainer(make_config("grpo_tiny", "trainer.total_training_steps=1"))
    trainer.recorder = recorder = ListRecorder()
    assert trainer.fit() == "succeeded"
    ((_, metrics),) = recorder.steps
    for name in ("perf/driver/rss_gb", "perf/max_rss_gb"):
        assert 0.05 < metrics[name] < 64, name  # a process with torch and a model
    # One process on a CPU: the rank is the driver.
    assert metrics["perf/max_rss_gb"] == pytest.approx(metrics["perf/driver/rss_gb"], rel=0.2)
    # Percent of one core: the process's threads (torch's, the tokenizer's, gloo's) can keep
    # several busy, never more than the machine has; a loaded machine may give it almost none.
    for name in ("perf/driver/cpu_percent", "perf/max_cpu_percent"):
        assert 0 <= metrics[name] <= 110 * (os.cpu_count() or 1), name
    assert metrics["perf/min_memory_available_gb"] > 0
    assert metrics["perf/cpu_memory_used_gb"] > 0
    assert 0 < metrics["perf/mfu/actor"] < 1
    assert metrics["perf/throughput"] > 0 and metrics["perf/total_num_tokens"] > 0
    assert metrics["perf/time_per_step"] > 0
    assert "perf/max_memory_allocated_gb" not in metrics  # CUDA only
