"""Text cells of CSV exports, made safe to open in a spreadsheet.

Excel, LibreOffice and Google Sheets run a cell that starts with ``=``, ``+``, ``-`` or ``@``
(or a tab or carriage return before one) as a formula, and a formula can fetch URLs or start
programs. Model outputs, prompts, metric names from custom reward functions and dataset text are
all written by someone other than the person opening the file, so every text cell that starts
with one of those characters gets a leading apostrophe, which spreadsheets show as the text
itself. Numbers stay numbers; the JSONL exports keep every text verbatim.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_text(text: str) -> str:
    """Return ``text`` for a CSV cell: with a leading ``'`` when a spreadsheet would run it."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text
