"""WebSocket URL patterns, served by ``webapp.asgi``."""

websocket_urlpatterns: list = []
