"""Fixtures shared by the data tests."""

import pytest
from transformers import PreTrainedTokenizerFast

from tests.engine.data.helpers import build_char_tokenizer


@pytest.fixture(scope="session")
def char_tokenizer() -> PreTrainedTokenizerFast:
    """Return the character-level chat tokenizer (built once per session)."""
    return build_char_tokenizer()
