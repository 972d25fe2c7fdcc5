"""A report's notes: CommonMark rendered by markdown-it-py with raw HTML turned off.

Members write the notes; other members read them. With ``html`` off, a ``<script>`` or any other
tag in the text is escaped and shows as text, and markdown-it's link check refuses
``javascript:``, ``vbscript:``, ``file:`` and non-image ``data:`` URLs, so the rendered notes can
be marked safe in the page and the exported file.
"""

from __future__ import annotations

from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough")


def render_notes(text: str) -> SafeString:
    """Return ``text`` as HTML: Markdown rendered, every HTML tag in it escaped."""
    return mark_safe(_MARKDOWN.render(text or ""))  # raw HTML is off: every tag is escaped
