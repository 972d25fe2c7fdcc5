"""``{% launch_key_field %}``: the hidden one-time key of a launch or resume form.

Each render gets a fresh key; ``run_create`` turns a second POST of the same key (a double
click, a retried request) into the run the first one made.
"""

from __future__ import annotations

import secrets

from django import template
from django.utils.html import format_html

register = template.Library()


@register.simple_tag
def launch_key_field() -> str:
    """Render ``<input type="hidden" name="launch_key">`` with a new random key."""
    return format_html(
        '<input type="hidden" name="launch_key" value="{}">', secrets.token_urlsafe(24)
    )
