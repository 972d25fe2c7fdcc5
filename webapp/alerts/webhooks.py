"""Webhook URLs a member may set, and a POST that goes only where the check allowed.

A webhook URL is checked when the member saves it and again at every send (:func:`post_json`):
``http``/``https`` only, a host and no credentials, and every address the host resolves to must
be a public one: no loopback, link-local (cloud metadata at 169.254.169.254), private, shared,
multicast, reserved or unspecified address, IPv4-mapped IPv6 included, unless the server allows
private destinations (``POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS``, for an intranet chat server).
The send connects to one of the addresses it just checked, never resolving the name again, so a
name that rebinds to an internal address between the check and the connection (DNS rebinding)
is refused rather than followed; TLS still verifies the certificate against the URL's host name.
Redirects are not followed.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
TIMEOUT_S = 10.0


class WebhookRefused(ValueError):
    """The URL may not be used as a webhook; the message says why and what to do."""


def _address_problem(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for attribute, what in (
        ("is_loopback", "a loopback"),
        ("is_link_local", "a link-local"),
        ("is_multicast", "a multicast"),
        ("is_unspecified", "an unspecified"),
        ("is_reserved", "a reserved"),
        ("is_private", "a private"),
    ):
        if getattr(address, attribute):
            return f"{address} is {what} address"
    if not address.is_global:
        return f"{address} is not a public address"
    return None


def resolve_webhook(url: str, *, allow_private: bool) -> tuple[str, list[str]]:
    """Return the URL's host and the addresses it may be sent to; WebhookRefused otherwise."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in SCHEMES:
        raise WebhookRefused(
            f"a webhook URL must start with http:// or https://, not {parts.scheme or 'nothing'}"
            "://; paste the incoming-webhook URL your Slack or Mattermost gave you"
        )
    if parts.username or parts.password:
        raise WebhookRefused("a webhook URL may not carry a user name or password")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise WebhookRefused(f"the webhook URL's port is not valid: {exc}") from None
    if not host:
        raise WebhookRefused("the webhook URL has no host name")
    port = port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookRefused(f"the webhook host {host!r} does not resolve ({exc})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not allow_private:
        for text in addresses:
            problem = _address_problem(ipaddress.ip_address(text.split("%")[0]))
            if problem:
                raise WebhookRefused(
                    f"the webhook host {host!r} resolves to {problem}; webhooks go only to "
                    "public addresses (an administrator can allow private ones with "
                    "POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS)"
                )
    return host, addresses


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to ``address`` for a request naming ``host``."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection to ``address`` whose certificate is checked against ``host``."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


def post_json(url: str, payload: dict[str, Any], *, allow_private: bool) -> int:
    """POST ``payload`` as JSON to a checked address of ``url``; return the HTTP status.

    WebhookRefused when the URL fails the check now; OSError or http.client's errors when the
    connection fails.
    """
    host, addresses = resolve_webhook(url, allow_private=allow_private)
    parts = urlsplit(url.strip())
    https = parts.scheme.lower() == "https"
    port = parts.port or (443 if https else 80)
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    connection_class = _PinnedHTTPSConnection if https else _PinnedHTTPConnection
    connection = connection_class(host, port, addresses[0], TIMEOUT_S)
    try:
        body = json.dumps(payload).encode()
        connection.request(
            "POST",
            path,
            body=body,
            headers={"Content-Type": "application/json", "User-Agent": "PostTrain-Studio"},
        )
        response = connection.getresponse()
        response.read(65536)
        return response.status
    finally:
        connection.close()
