"""Django settings for PostTrain Studio.

Every deployment-specific value comes from an environment variable with a working local default:

- ``DATABASE_URL``  PostgreSQL, default ``postgresql://postgres@127.0.0.1:5432/posttrain``
- ``REDIS_URL``     Redis for the Channels layer and the Celery broker, default ``redis://127.0.0.1:6379/0``
- ``RAY_ADDRESS``   a Ray cluster for run drivers; empty means a local head
- ``POSTTRAIN_DATA_DIR``  checkpoints, uploads and caches (see ``engine.env.data_dir``)
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS``, ``POSTTRAIN_ALLOW_SIGNUP``
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/posttrain"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def database_from_url(url: str) -> dict:
    """Return a Django DATABASES entry for a ``postgresql://user:password@host:port/name`` URL."""
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL={url!r} is not a PostgreSQL URL; set it like "
            "postgresql://user:password@127.0.0.1:5432/posttrain"
        )
    name = parsed.path.lstrip("/")
    if not name:
        raise ImproperlyConfigured(
            f"DATABASE_URL={url!r} names no database; append one, e.g. .../posttrain"
        )
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(name),
        "USER": unquote(parsed.username or "postgres"),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "127.0.0.1",
        "PORT": str(parsed.port or 5432),
        "CONN_MAX_AGE": 60,
        "TEST": {"NAME": os.environ.get("POSTTRAIN_TEST_DATABASE") or f"test_{unquote(name)}"},
    }


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "posttrain-local-development-key-change-me")
DEBUG = _env_bool("DJANGO_DEBUG", True)
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "*").split(",") if h]

REDIS_URL = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
RAY_ADDRESS = os.environ.get("RAY_ADDRESS", "")
POSTTRAIN_DATA_DIR = Path(
    os.environ.get("POSTTRAIN_DATA_DIR") or Path.home() / ".cache" / "posttrain-studio"
)
# Serve /static/ from the ASGI app itself (one process to run; fine for a lab deployment).
POSTTRAIN_SERVE_STATIC = _env_bool("POSTTRAIN_SERVE_STATIC", True)
# Sign-up is off by default: accounts come from `manage.py createsuperuser` or the admin.
POSTTRAIN_ALLOW_SIGNUP = _env_bool("POSTTRAIN_ALLOW_SIGNUP", False)
# A run whose heartbeat is older than this is marked lost by the periodic sweep (a driver process
# on the sweep's own host is lost as soon as it exits). Drivers beat every ~10 s.
POSTTRAIN_HEARTBEAT_TIMEOUT_S = int(os.environ.get("POSTTRAIN_HEARTBEAT_TIMEOUT_S", "45"))
# A running run with no new step for this long is flagged stalled; unset: 10 x its median step
# time, at least 600 s.
POSTTRAIN_STALL_AFTER_S: float | None = None
if os.environ.get("POSTTRAIN_STALL_AFTER_S"):
    POSTTRAIN_STALL_AFTER_S = float(os.environ["POSTTRAIN_STALL_AFTER_S"])
# Custom reward functions are picked from the *.py files an administrator places here.
POSTTRAIN_REWARD_MODULES_DIR = Path(
    os.environ.get("POSTTRAIN_REWARD_MODULES_DIR") or BASE_DIR / "rewards_contrib"
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    "webapp.accounts",
    "webapp.experiments",
    "webapp.runs",
    "webapp.datasets",
    "webapp.samples",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "webapp.middleware.RejectNulMiddleware",
    "webapp.middleware.DatabaseUnavailableMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "webapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "webapp" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py 8 gives every read a 5 s socket timeout, as long as the layer's blocking receive
        # waits: without a longer one an idle consumer dies every 5 s (channels_redis issue 422).
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "mark-lost-runs": {"task": "workers.tasks.mark_lost_runs", "schedule": 15.0},
}

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS: list = [BASE_DIR / "frontend"]
# Plotly's bundle ships inside the Python package; the charts load it as /static/plotly/plotly.min.js.
_plotly = importlib.util.find_spec("plotly")
if _plotly is not None and _plotly.submodule_search_locations:
    STATICFILES_DIRS.append(
        ("plotly", str(Path(_plotly.submodule_search_locations[0]) / "package_data"))
    )
MEDIA_ROOT = POSTTRAIN_DATA_DIR / "uploads"
MEDIA_URL = "/media/"
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 20 * 1024 * 1024

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("POSTTRAIN_LOG_LEVEL", "INFO")},
}
