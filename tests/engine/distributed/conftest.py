"""Fixtures of the distributed tests: a local Ray for the module, and a random tiny policy with
arithmetic data in a folder, as a user's model and files would be."""

from __future__ import annotations

import pytest

from engine.tiny.task import make_problems, write_split
from engine.tiny.tokenizer import build_tokenizer
from tests.engine.distributed.helpers import tiny_policy


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """Return a folder with a random tiny policy and arithmetic train/val parquet files."""
    root = tmp_path_factory.mktemp("ray_assets")
    tokenizer = build_tokenizer()
    tiny_policy(len(tokenizer)).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    write_split(make_problems("train", 16, seed=0), "train", root)
    write_split(make_problems("val", 6, seed=0), "val", root)
    return root
