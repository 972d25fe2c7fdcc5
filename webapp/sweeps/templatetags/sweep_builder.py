"""``{% sweep_builder_fields %}``: the builder's sweep section, with its errors after a POST."""

from __future__ import annotations

from typing import Any

from django import template

from webapp.sweeps.forms import SweepForm

register = template.Library()


@register.inclusion_tag("sweeps/_builder_fields.html", takes_context=True)
def sweep_builder_fields(context: Any) -> dict[str, Any]:
    """Render the sweep fields: the page's ``sweep_form`` when it has one, else a fresh form."""
    return {"sweep_form": context.get("sweep_form") or SweepForm()}
