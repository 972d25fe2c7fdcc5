"""ASGI entry point: HTTP through Django, WebSockets through Channels with session auth.

Every HTTP request passes ``webapp.body_limit.RequestBodyLimit`` first: a body past
``POSTTRAIN_UPLOAD_MAX_BYTES`` (plus 1 MiB of form fields) is answered 413 before Django spools it.
"""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from webapp.static_files import StaticFilesHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Django must be set up before the consumers (and their models) are imported.
django_asgi_app = get_asgi_application()
if settings.POSTTRAIN_SERVE_STATIC:
    # The studio serves its own static files (Plotly's bundle included): no CDN, no extra server.
    # A path that leaves the static folders is a 400 (webapp.static_files), never a 500.
    django_asgi_app = StaticFilesHandler(django_asgi_app)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from webapp.body_limit import RequestBodyLimit  # noqa: E402
from webapp.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": RequestBodyLimit(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
