"""Character-level tokenizer for the embedded tiny model.

One token per character, so an arithmetic prompt such as ``"12+35="`` costs six tokens and the
model never has to learn a sub-word segmentation of numbers. The vocabulary is the special and
chat-role tokens (``<pad>`` is id 0), then the digits, ASCII letters, punctuation, space and
newline, then the remaining byte values, so any text round-trips (a non-ASCII character costs
one token per UTF-8 byte) and ``<unk>`` is never needed.

Why a byte-level BPE with no merges rather than a WordLevel model: ``AutoTokenizer`` loads the
tokenizer of every ``qwen2`` model folder as ``Qwen2Tokenizer``, which rebuilds its pipeline
(NFC, GPT-2 byte-level pre-tokenizer and decoder, BPE) from the saved vocabulary and merges. A
WordLevel tokenizer saved next to a Qwen2 model therefore came back changed (spaces dropped).
Building the tokenizer as that very class, with an empty merge list, makes every byte (hence every
ASCII character) one token and makes the saved folder load back identical.

The chat template is compact on purpose: ``<bos>`` then, per message, the role token and the
content; an assistant message ends with ``<eos>``. ``add_generation_prompt=True`` appends
``<|assistant|>``, so the model's reply starts right after it and ends with ``<eos>``.
"""

from __future__ import annotations

import string

from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, *ROLE_TOKENS.values()]
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"
MAX_LENGTH = 256

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('tiny chat template: unknown role ' + message['role'] + "
    "'; use system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def byte_symbols() -> list[str]:
    """Return the 256 byte-level symbols: the listed characters' first, then the other bytes'."""
    table = bytes_to_unicode()  # GPT-2's byte -> printable symbol map, as ByteLevel uses
    listed = [table[ord(character)] for character in CHARACTERS]
    rest = [table[value] for value in range(256) if table[value] not in listed]
    return listed + rest


def build_vocab() -> dict[str, int]:
    """Return the token-to-id map: special tokens first (``<pad>`` is 0), then the bytes."""
    return {token: index for index, token in enumerate([*SPECIAL_TOKENS, *byte_symbols()])}


def build_tokenizer() -> Qwen2Tokenizer:
    """Build the character-level tokenizer with its chat template (deterministic, no files)."""
    return Qwen2Tokenizer(
        vocab=build_vocab(),
        merges=[],
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=list(ROLE_TOKENS.values()),
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_LENGTH,
    )
