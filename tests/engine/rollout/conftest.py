"""Fixtures of the rollout tests on the embedded tiny model (the vLLM engine's and server's):
its tokenizer and the policy as the trainer holds it. A module with a tokenizer of its own
defines its own ``tokenizer``."""

from __future__ import annotations

import sys

import pytest
import torch


@pytest.fixture(scope="module")
def tokenizer(tiny_assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_assets.model_dir)


@pytest.fixture(scope="module")
def policy(tiny_assets):
    """The tiny model as the trainer holds it (fp32, eval); tests that change it copy it."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_assets.model_dir, dtype=torch.float32).eval()


@pytest.fixture
def hide_package(monkeypatch):
    """Return a function that makes ``import <name>`` fail for the test, as on a machine without
    that package's extra."""

    def hide(name: str) -> None:
        monkeypatch.setitem(sys.modules, name, None)

    return hide
