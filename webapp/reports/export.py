"""A report as one self-contained HTML file: Plotly's bundle, the report's script and the data
inlined, so the file opens offline and asks no other host for anything.

Plotly's bundle is the copy the studio serves (``/static/plotly/plotly.min.js``, from the
``plotly`` package: ``webapp.settings.STATICFILES_DIRS``); the charts are drawn by the same script
as the report page (``frontend/js/report.js``) from the same payload
(``webapp.reports.selectors.report_charts``).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from django.contrib.staticfiles import finders
from django.core.exceptions import ImproperlyConfigured
from django.utils.safestring import SafeString, mark_safe

_CLOSING = re.compile(r"</(script|style)", re.IGNORECASE)


def _static_text(path: str) -> str:
    found = finders.find(path)
    if not found:
        raise ImproperlyConfigured(
            f"static file {path} is missing; install the web extras (the plotly package) "
            "and keep frontend/ beside webapp/"
        )
    return Path(str(found)).read_text(encoding="utf-8")


@lru_cache(maxsize=4)
def inline_static(path: str) -> SafeString:
    """Return static file ``path``'s text, safe to place between ``<script>`` or ``<style>`` tags."""
    # A "</script" inside the code would end the element early; "<\/" means the same in JS.
    return mark_safe(_CLOSING.sub(r"<\\/\1", _static_text(path)))


def export_name(title: str) -> str:
    """Return the download's file name: the title's letters and digits, ``.html``."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", title).strip("-.")[:80] or "report"
    return f"{stem}.html"
