"""Byte-level BPE tokens read as the tokenizer decodes them (issue 39, item 9): the tiny
tokenizer's symbols for '9×7' are 9, Ã, Ĺ, 7 (× is the bytes C3 97), and a lone byte 0xDE is
written Þ in GPT-2's byte alphabet."""

from __future__ import annotations

import pytest

from webapp.samples.tokens import Piece, decode_tokens, response_pieces, token_bytes


def test_each_symbol_maps_back_to_its_bytes():
    assert token_bytes("Ġ4") == b" 4"  # GPT-2 writes a space as Ġ
    assert token_bytes("Ċ") == b"\n"
    assert token_bytes("Ã") == b"\xc3" and token_bytes("Ĺ") == b"\x97"
    assert token_bytes("Þ") == b"\xde"
    assert token_bytes("<0xDE>") == b"\xde"  # SentencePiece's byte fallback
    assert token_bytes("\u2581hello") == b" hello"  # SentencePiece's space
    assert token_bytes("中") is None  # not a byte symbol


def test_a_character_split_across_tokens_shows_whole_on_the_token_that_ends_it():
    tokens = decode_tokens(["9", "Ã", "Ĺ", "7"], "9×7")
    assert [(t.text, t.hex, t.partial, t.bad) for t in tokens] == [
        ("9", "39", False, False),
        ("", "C3", True, False),
        ("×", "97", False, False),
        ("7", "37", False, False),
    ]


def test_a_byte_that_begins_no_character_is_kept_as_that_byte():
    tokens = decode_tokens(["9", "Þ", "7"], "9\ufffd7")
    assert [(t.text, t.bad) for t in tokens] == [("9", False), ("\\xDE", True), ("7", False)]
    assert response_pieces(["9", "Þ", "7"], "9\ufffd7") == [Piece("9"), Piece("", 0xDE), Piece("7")]
    assert response_pieces(["9", "Ã", "Ĺ", "7"], "9×7") is None  # nothing broken: plain text


@pytest.mark.parametrize(
    ("tokens", "text"),
    [
        (["a", "é", "b"], "aéb"),  # a character-level vocabulary with é: not bytes
        (["He", "llo"], "Hello, world"),  # tokens that do not spell the text
        (["中", "文"], "中文"),
    ],
)
def test_tokens_that_are_not_byte_level_are_shown_as_recorded(tokens, text):
    assert decode_tokens(tokens, text) is None


def test_special_tokens_the_decoder_skips_do_not_stop_the_byte_reading():
    tokens = decode_tokens(["4", "2", "</s>"], "42")
    assert [t.text for t in tokens] == ["4", "2", ""]
