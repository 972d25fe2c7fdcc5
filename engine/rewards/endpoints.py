"""The reward services an administrator allows (``POSTTRAIN_REWARD_ENDPOINTS``).

A run may send responses only to a service the server's administrator lists, never to an
address a member typed: ``reward_model.reward_kwargs.endpoint`` (the remote reward manager) and
``reward_model.sandbox_fusion.url`` (SandboxFusion's code runner) name an endpoint by its listed
name or its exact listed URL, and the validator refuses anything else, for the command line,
the web form and the API alike. The list is comma-separated entries ``name=URL`` (or a bare URL,
its own name)::

    POSTTRAIN_REWARD_ENDPOINTS="judge=http://10.0.0.5:8000/score,sandbox=http://sbx:8080/run_code"

It is read when a config is checked or a manager starts, never at import time, and holds only
``http``/``https`` URLs with a host. No torch here: the config validator asks it.
"""

from __future__ import annotations

import os
from typing import NamedTuple
from urllib.parse import urlsplit

ENDPOINTS_ENV = "POSTTRAIN_REWARD_ENDPOINTS"


class Endpoint(NamedTuple):
    """An allowed reward service: the name errors and metrics show, and where requests go."""

    name: str
    url: str


class EndpointRefused(ValueError):
    """A config named a reward service the administrator does not list."""


def reward_endpoints() -> dict[str, Endpoint]:
    """Return the allowed services by name; raise ValueError for a malformed list entry."""
    endpoints: dict[str, Endpoint] = {}
    for entry in (os.environ.get(ENDPOINTS_ENV) or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, _, url = entry.partition("=") if "=" in entry.split("://")[0] else ("", "", entry)
        name, url = name.strip() or url.strip(), url.strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{ENDPOINTS_ENV} entry {entry!r} is not name=URL with an http:// or https:// "
                "URL; list entries such as judge=http://10.0.0.5:8000/score, separated by ','"
            )
        endpoints[name] = Endpoint(name, url)
    return endpoints


def endpoint_problem(value: object) -> str | None:
    """Return why ``value`` does not name an allowed service (what to do), or None if it does."""
    try:
        resolve_endpoint(value)
    except EndpointRefused as exc:
        return str(exc)
    except ValueError:  # the entry itself is the administrator's to read, not the member's
        return (
            f"cannot be checked: the server's {ENDPOINTS_ENV} has a malformed entry; ask an "
            "administrator to fix it"
        )
    return None


def resolve_endpoint(value: object) -> Endpoint:
    """Return the allowed service ``value`` names (its listed name or exact listed URL)."""
    endpoints = reward_endpoints()
    if isinstance(value, str):
        if value in endpoints:
            return endpoints[value]
        for endpoint in endpoints.values():
            if value == endpoint.url:
                return endpoint
    listed = (
        f"name one of {', '.join(sorted(endpoints))}"
        if endpoints
        else f"none is listed yet: an administrator lists reward services in {ENDPOINTS_ENV} "
        "(name=URL, comma-separated)"
    )
    raise EndpointRefused(
        f"is not a reward service the administrator allows (a run sends responses only to the "
        f"services listed in {ENDPOINTS_ENV}); {listed}"
    )
