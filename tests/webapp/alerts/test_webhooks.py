"""Webhook URLs: http(s) to public addresses only, every resolved address checked."""

from __future__ import annotations

import pytest

from webapp.alerts.webhooks import WebhookRefused, resolve_webhook


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://93.184.216.34/hook", "must start with http:// or https://, not ftp://"),
        ("javascript:alert(1)", "must start with http:// or https://"),
        ("hooks.slack.com/services/x", "not nothing://"),
        ("http://user:pw@93.184.216.34/", "may not carry a user name or password"),
        ("http://127.0.0.1:8080/hook", "127.0.0.1 is a loopback address"),
        ("http://localhost/hook", "is a loopback address"),
        ("http://[::1]/hook", "::1 is a loopback address"),
        ("http://[::ffff:127.0.0.1]/hook", "127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is a link-local address"),
        ("http://10.0.0.5/hook", "10.0.0.5 is a private address"),
        ("http://192.168.1.20/hook", "192.168.1.20 is a private address"),
        ("http://[fd00::1]/hook", "fd00::1 is a private address"),
        ("http://0.0.0.0/hook", "0.0.0.0 is an unspecified address"),
        ("http://224.0.0.1/hook", "224.0.0.1 is a multicast address"),
        ("http://100.64.0.1/hook", "100.64.0.1 is not a public address"),  # carrier-grade NAT
        ("http://no-such-host.invalid/hook", "does not resolve"),
        ("http://93.184.216.34:99999/", "port is not valid"),
    ],
)
def test_a_webhook_that_is_not_public_http_is_refused_with_why(url, problem):
    with pytest.raises(WebhookRefused, match=problem.replace("(", r"\(").replace(".", r"\.")):
        resolve_webhook(url, allow_private=False)


def test_the_refusal_names_the_setting_that_allows_private_addresses():
    with pytest.raises(WebhookRefused, match="POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS"):
        resolve_webhook("http://10.1.2.3/hooks/abc", allow_private=False)


def test_a_public_address_passes_and_a_private_one_only_where_the_server_allows():
    assert resolve_webhook("https://93.184.216.34/hooks/abc", allow_private=False) == (
        "93.184.216.34",
        ["93.184.216.34"],
    )
    assert resolve_webhook("http://127.0.0.1:9/hook", allow_private=True)[1] == ["127.0.0.1"]


def test_every_address_of_a_name_is_checked(monkeypatch):
    # One public and one internal address: a client may connect to either, so it is refused.
    def two_addresses(host, port, *args, **kwargs):
        return [
            (2, 1, 6, "", ("93.184.216.34", port)),
            (2, 1, 6, "", ("10.0.0.7", port)),
        ]

    monkeypatch.setattr("webapp.alerts.webhooks.socket.getaddrinfo", two_addresses)
    with pytest.raises(WebhookRefused, match="10.0.0.7 is a private address"):
        resolve_webhook("https://hooks.example.org/x", allow_private=False)
