"""Settings for the test suite: the production settings, with a throwaway secret key.

DEBUG stays off, as in production, so the suite runs what a deployment runs. The variables are
set in the environment (not only here) so that the processes the tests start (Celery workers,
``manage.py`` commands) load the same settings; the test client's host is one of the hosts.
"""

import os
import secrets

os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,testserver")

from webapp.settings import *  # noqa: E402, F403
