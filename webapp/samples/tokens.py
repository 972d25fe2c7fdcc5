"""A response's text as its tokens spell it: byte-level BPE symbols mapped back to bytes.

The trainer records each response token as the tokenizer's own symbol
(``convert_ids_to_tokens``). For byte-level BPE (GPT-2, Qwen, the tiny model) a symbol is bytes
written in GPT-2's printable alphabet (``bytes_to_unicode``: a space is ``Ġ``, byte 0xDE is
``Þ``), so the token view showed ``9Þ7`` where the model wrote the digit 9, the lone byte 0xDE
and 7, and a character split across two tokens (``×`` is 0xC3 0x97) showed as two unrelated
letters. SentencePiece writes a space as ``▁`` and a byte it has no piece for as ``<0xDE>``.

:func:`decode_tokens` maps each token back to its bytes and decodes the response as UTF-8 once,
giving every character to the token that completes it, as a streaming decode prints it: a token
that starts a character the next one ends shows nothing of its own (it is marked ``partial``,
its bytes in its title) and the next shows the whole character. A byte
that begins no valid character (the model wrote half of one) is kept as that byte, marked,
instead of a bare ``�``: the text view writes it ``DE`` in a box that says so, the token view as
``\\xDE``.

Which kind a response's tokens are is decided against its stored text (``tokenizer.decode``):
the byte-level reading must spell the same text. Anything else (a character-level tokenizer
whose vocabulary has ``é``, a multi-turn response) shows its tokens and text as recorded.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache


@cache
def _byte_alphabet() -> dict[str, int]:
    """Return GPT-2's ``bytes_to_unicode`` inverted: printable character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPECIAL = re.compile(r"^<\|?[^<>\s]+\|?>$")  # <|im_end|>, </s>, <eos>: skipped by decode


def token_bytes(token: str) -> bytes | None:
    """Return a byte-level BPE or SentencePiece token's bytes, or None when it is neither."""
    match = _SENTENCEPIECE_BYTE.fullmatch(token)
    if match:
        return bytes([int(match.group(1), 16)])
    alphabet = _byte_alphabet()
    if all(ch in alphabet for ch in token):
        return bytes(alphabet[ch] for ch in token)
    if "\u2581" in token:  # SentencePiece's space
        return token.replace("\u2581", " ").encode()
    return None


@dataclass(frozen=True)
class Piece:
    """A run of a response's text: ``text``, or with ``bad_byte`` one byte that is not UTF-8."""

    text: str
    bad_byte: int | None = None


@dataclass(frozen=True)
class TokenText:
    """One token as the token view shows it."""

    raw: str  # the tokenizer's symbol, as recorded
    text: str  # the characters this token completes ('' for the first half of one)
    hex: str  # its bytes in hex ('' when it is not byte-level)
    partial: bool = False  # it ends inside a character the next token finishes
    bad: bool = False  # it holds a byte that begins no valid character


def _utf8_chars(data: bytes) -> list[tuple[int, int, str | None]]:
    """Return ``(start, length, char or None for a bad byte)`` for each character of ``data``."""
    out = []
    i = 0
    while i < len(data):
        for size in (1, 2, 3, 4):
            try:
                char = data[i : i + size].decode("utf-8")
            except UnicodeDecodeError:
                continue
            out.append((i, size, char))
            i += size
            break
        else:
            out.append((i, 1, None))
            i += 1
    return out


def _byte_level(tokens: Sequence[str]) -> list[bytes] | None:
    parts = [token_bytes(t) if not _SPECIAL.match(t) else b"" for t in tokens]
    return None if any(p is None for p in parts) else parts  # type: ignore[return-value]


def _spells(parts: Sequence[bytes], text: str | None) -> bool:
    """Return whether the bytes decode to ``text`` (the tokenizer's own decoding)."""
    if text is None:
        return True
    decoded = b"".join(parts).decode("utf-8", "replace")
    return decoded.strip() == text.strip() or decoded.replace("\ufffd", "") == text.replace(
        "\ufffd", ""
    )


def decode_tokens(tokens: Sequence[str], text: str | None = None) -> list[TokenText] | None:
    """Return each token's text, decoding byte-level tokens across token boundaries.

    None when the tokens are not byte-level, or do not spell ``text`` (the recorded response).
    """
    parts = _byte_level(tokens)
    if parts is None or not _spells(parts, text):
        return None
    data = b"".join(parts)
    owner: list[int] = []  # the token of each byte
    for index, part in enumerate(parts):
        owner += [index] * len(part)
    texts = [""] * len(tokens)
    partial = [False] * len(tokens)
    bad = [False] * len(tokens)
    for start, size, char in _utf8_chars(data):
        if char is None:
            texts[owner[start]] += f"\\x{data[start]:02X}"
            bad[owner[start]] = True
            continue
        texts[owner[start + size - 1]] += char  # shown once whole, as a streaming decode does
        for position in range(start, start + size - 1):
            if owner[position] != owner[position + 1]:
                partial[owner[position]] = True
    return [
        TokenText(raw, texts[i], parts[i].hex(" ").upper(), partial[i], bad[i])
        for i, raw in enumerate(tokens)
    ]


def response_pieces(tokens: Sequence[str], text: str) -> list[Piece] | None:
    """Return the response's text with each byte that is not UTF-8 kept as that byte, or None
    when the tokens are not byte-level or the text has no such byte."""
    if "\ufffd" not in text:
        return None
    parts = _byte_level(tokens)
    if parts is None or not _spells(parts, text):
        return None
    pieces: list[Piece] = []
    data = b"".join(parts)
    for start, _, char in _utf8_chars(data):
        if char is None:
            pieces.append(Piece("", data[start]))
        elif pieces and pieces[-1].bad_byte is None:
            pieces[-1] = Piece(pieces[-1].text + char)
        else:
            pieces.append(Piece(char))
    return pieces
