"""``{% run_progress run %}``: the progress bar of a run (step of total, elapsed, ETA, status)."""

from __future__ import annotations

from typing import Any

from django import template

from webapp.runs.progress import run_progress_of

register = template.Library()


@register.inclusion_tag("runs/_progress.html")
def run_progress(run: Any) -> dict[str, Any]:
    """Render the progress bar of ``run``; the live charts update it in place."""
    return {"run": run, "progress": run_progress_of(run)}
