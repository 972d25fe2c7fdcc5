"""Fixtures for trainer tests: small configs over the embedded tiny model (two steps)."""

from __future__ import annotations

import functools

import pytest


@pytest.fixture
def make_config(tiny_config):
    """Return a function building a two-step tiny-model config with extra overrides."""
    return functools.partial(tiny_config, steps=2)
