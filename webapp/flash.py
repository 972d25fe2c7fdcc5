"""A form's POST told on the next page: the service's refusal as an error message, its success as
a success message.

The views that change one object and then go back to a page all answer this way, so they share
:func:`flash_outcome` rather than each spelling out the ``try``/``except``/``else``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.contrib import messages
from django.http import HttpRequest

T = TypeVar("T")


def flash_outcome(
    request: HttpRequest,
    action: Callable[[], T],
    refused: type[Exception],
    done: str | Callable[[T], str],
    *,
    failed: str = "{exc}",
) -> T | None:
    """Run ``action`` and return what it returns, with ``done`` (a text, or one made of that
    result) as a success message; on ``refused``, show ``failed`` (``{exc}``: the refusal's own
    words) as an error message and return None."""
    try:
        result = action()
    except refused as exc:
        messages.error(request, failed.format(exc=exc))
        return None
    messages.success(request, done if isinstance(done, str) else done(result))
    return result
