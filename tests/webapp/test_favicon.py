"""The studio's icon: every page links it, so a first visit logs no 404 for /favicon.ico."""

from __future__ import annotations

import pytest
from django.contrib.staticfiles import finders

pytestmark = pytest.mark.django_db


def test_every_page_links_the_icon_and_favicon_ico_leads_to_it(client, client_in):
    assert finders.find("img/favicon.svg") is not None
    link = '<link rel="icon" href="/static/img/favicon.svg" type="image/svg+xml">'
    assert link in client.get("/accounts/login/").content.decode()
    assert link in client_in.get("/").content.decode()
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/img/favicon.svg"
