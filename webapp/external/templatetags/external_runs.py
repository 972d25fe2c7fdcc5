"""``{% external_run_panel run %}``: where an external run lives, who reports it, whether the
studio may ask it to stop, and the config keys the studio's schema does not know."""

from __future__ import annotations

from typing import Any

from django import template

from webapp.external.models import ExternalSource
from webapp.external.services import external_unknown_keys

register = template.Library()


@register.inclusion_tag("external/_run_panel.html")
def external_run_panel(run: Any) -> dict[str, Any]:
    """Render the external run's panel (nothing for a run the studio launched)."""
    external = getattr(run, "external", None) if run.is_external else None
    if external is None:
        return {"external": None}
    marked = external.source in (ExternalSource.VERL, ExternalSource.ENGINE)
    return {
        "run": run,
        "external": external,
        "unknown_keys": external_unknown_keys(run.config) if marked else [],
        "schema_marked": marked,
    }
