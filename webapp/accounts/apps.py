from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "webapp.accounts"
    label = "accounts"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out
        from django.contrib.sessions.models import Session
        from django.db.models.signals import post_delete

        from webapp.accounts.sessions import (
            close_sockets_on_logout,
            close_sockets_on_session_delete,
        )

        user_logged_out.connect(close_sockets_on_logout, dispatch_uid="accounts.close_sockets")
        post_delete.connect(
            close_sockets_on_session_delete, sender=Session, dispatch_uid="accounts.close_sockets"
        )
