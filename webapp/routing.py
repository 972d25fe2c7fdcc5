"""WebSocket URL patterns, served by ``webapp.asgi``."""

from django.urls import path

from webapp.runs.consumers import RunLiveConsumer

websocket_urlpatterns: list = [
    path("ws/runs/<int:run_id>/", RunLiveConsumer.as_asgi()),
]
