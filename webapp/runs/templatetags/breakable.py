"""``{{ name|breakable }}``: a metric name or config key that may wrap after each ``/``, ``_`` or
``.`` (a ``<wbr>`` there), so long names fit narrow table headers without breaking a word."""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@register.filter
def breakable(text: str) -> SafeString:
    """Return ``text`` escaped, with ``<wbr>`` after each ``/``, ``_`` and ``.``."""
    return mark_safe(re.sub(r"([/_.])", r"\1<wbr>", escape(str(text))))  # noqa: S308 - escaped
