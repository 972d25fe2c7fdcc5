"""The inspector's filters: numbers (four significant digits, a dash for missing or NaN), a
response's text with each byte that is not UTF-8 shown as that byte (``samples.tokens``), and a
sample's reward parts split into scores and a generative judge's replies."""

from __future__ import annotations

import json
import math
from typing import Any

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

register = template.Library()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@register.filter
def num(value: Any) -> str:
    """Format a number with four significant digits; '—' for None or a non-finite value."""
    number = _number(value)
    if number is None:
        return "—" if value is None or isinstance(value, int | float) else str(value)
    return f"{number:.4g}"


# A generative judge's reply is kept among the reward parts as ``<component>/judge_text``
# (engine.rewards.composite.JUDGE_TEXT); it is shown as text beside the scores, not as a number.
JUDGE_TEXT_SUFFIX = "/judge_text"


@register.filter
def score_parts(parts: Any) -> list[tuple[str, Any]]:
    """Return the reward parts that are not a judge's reply, as (key, value) pairs."""
    items = parts.items() if isinstance(parts, dict) else []
    return [(k, v) for k, v in items if not str(k).endswith(JUDGE_TEXT_SUFFIX)]


@register.filter
def judge_texts(parts: Any) -> list[tuple[str, str]]:
    """Return each judge's reply among the reward parts as (component, reply text)."""
    items = parts.items() if isinstance(parts, dict) else []
    return [
        (str(k).removesuffix(JUDGE_TEXT_SUFFIX), str(v))
        for k, v in items
        if str(k).endswith(JUDGE_TEXT_SUFFIX) and v is not None
    ]


@register.filter
def signed(value: Any) -> str:
    """Format a difference with its sign (+0.25, -1); '—' when missing."""
    number = _number(value)
    return "—" if number is None else f"{number:+.4g}"


@register.filter
def json_text(value: Any) -> str:
    """Return ``value`` as compact JSON text (a tool call's arguments), escaped by the template."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


BAD_BYTE_TITLE = "byte 0x{:02X} is not UTF-8 here: the model wrote part of a character"


@register.filter
def response_text(sample: Any) -> SafeString | str:
    """Return the sample's response, a byte that is not UTF-8 boxed as its hex (``DE``) instead
    of a bare U+FFFD; the plain text (escaped by the template) when it has none."""
    from webapp.samples.tokens import response_pieces

    pieces = getattr(sample, "pieces", None)
    broken = "\ufffd" in (sample.response_text or "")
    if pieces is None and broken and "tokens" not in sample.get_deferred_fields():
        pieces = response_pieces(list(sample.tokens), sample.response_text)
    if not pieces:
        return sample.response_text
    return format_html_join(
        "",
        "{}",
        (
            (
                format_html(
                    '<span class="bad-byte" title="{}">{}</span>',
                    BAD_BYTE_TITLE.format(p.bad_byte),
                    f"{p.bad_byte:02X}",
                )
                if p.bad_byte is not None
                else p.text,
            )
            for p in pieces
        ),
    )
