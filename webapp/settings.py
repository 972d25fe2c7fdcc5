"""Django settings for PostTrain Studio.

Every deployment-specific value comes from an environment variable; all but the secret key have
a working local default, and the secret key has one only with ``DJANGO_DEBUG=1``:

- ``DATABASE_URL``  PostgreSQL, default ``postgresql://postgres@127.0.0.1:5432/posttrain``
- ``REDIS_URL``     Redis for the Channels layer and the Celery broker, default ``redis://127.0.0.1:6379/0``
- ``RAY_ADDRESS``   a Ray cluster for run drivers; empty means a local head
- ``POSTTRAIN_DATA_DIR``  checkpoints, uploads and caches (see ``engine.env.data_dir``)
- ``DJANGO_DEBUG``  ``1`` on a development machine only (``scripts/dev.sh`` sets it)
- ``DJANGO_SECRET_KEY``  at least 50 random characters; without DEBUG the settings refuse to load
  when it is missing, short or a published development key
- ``DJANGO_ALLOWED_HOSTS``, ``DJANGO_CSRF_TRUSTED_ORIGINS``  comma-separated; hosts default to
  ``localhost,127.0.0.1``
- ``POSTTRAIN_TLS``, ``POSTTRAIN_TLS_PROXY``  HTTPS only (secure cookies, HSTS, redirect), and
  trusting a TLS-terminating proxy's ``X-Forwarded-Proto``
- ``POSTTRAIN_ALLOW_SIGNUP``
- ``POSTTRAIN_API_RATE``  the API's requests per token (and per browser session) per window,
  default ``600/min``

``manage.py check --deploy`` passes with DEBUG off, a real secret and POSTTRAIN_TLS=1.
"""

from __future__ import annotations

import importlib.util
import os
from datetime import timedelta
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


def _env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# The key the studio shipped with before it required one: public, so never accepted.
PUBLIC_SECRET_KEY = "posttrain-local-development-key-change-me"
# With DJANGO_DEBUG=1 only (Django's own checks flag the prefix as insecure).
DEBUG_SECRET_KEY = "django-insecure-posttrain-development-only"
MIN_SECRET_KEY_LENGTH = 50
GENERATE_SECRET_KEY = 'python -c "import secrets; print(secrets.token_urlsafe(50))"'


def secret_key_from_env(*, debug: bool) -> str:
    """Return ``DJANGO_SECRET_KEY``; without DEBUG refuse a missing, public or short one."""
    key = os.environ.get("DJANGO_SECRET_KEY", "")
    if debug:
        return key or DEBUG_SECRET_KEY
    if not key:
        problem = "is not set"
    elif key in {PUBLIC_SECRET_KEY, DEBUG_SECRET_KEY} or key.startswith("django-insecure-"):
        problem = "is a published development key"
    elif len(key) < MIN_SECRET_KEY_LENGTH or len(set(key)) < 5:
        problem = f"is shorter than {MIN_SECRET_KEY_LENGTH} characters (or too repetitive)"
    else:
        return key
    raise ImproperlyConfigured(
        f"DJANGO_SECRET_KEY {problem}; with DJANGO_DEBUG off the studio needs a secret of at "
        f"least {MIN_SECRET_KEY_LENGTH} random characters: generate one with {GENERATE_SECRET_KEY} "
        "and set DJANGO_SECRET_KEY to it (or set DJANGO_DEBUG=1 on a development machine)"
    )


# Production unless DJANGO_DEBUG=1 (scripts/dev.sh sets it).
DEBUG = _env_bool("DJANGO_DEBUG", False)
SECRET_KEY = secret_key_from_env(debug=DEBUG)
# The host names this site answers to (a forged Host header gets a 400, not a link to itself).
ALLOWED_HOSTS = _env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1")
# Origins (https://studio.example.org) whose POSTs are trusted when they differ from the Host.
CSRF_TRUSTED_ORIGINS = _env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")
# POSTTRAIN_TLS=1: the site is served over HTTPS only (secure cookies, HSTS for a year with
# subdomains and preload, http:// redirected). POSTTRAIN_TLS_PROXY=1 additionally trusts the
# X-Forwarded-Proto header of a TLS-terminating proxy in front of Daphne: set it only when that
# proxy sets the header itself and drops it from clients' requests.
POSTTRAIN_TLS = _env_bool("POSTTRAIN_TLS", False)
SECURE_SSL_REDIRECT = SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = POSTTRAIN_TLS
SECURE_HSTS_SECONDS = 365 * 24 * 3600 if POSTTRAIN_TLS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_PRELOAD = POSTTRAIN_TLS
if _env_bool("POSTTRAIN_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

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
# Per-user launch limits (``webapp.runs.quotas``): runs waiting for a worker (queued or
# starting), and runs that hold or are about to hold a driver (queued, starting or running).
POSTTRAIN_MAX_QUEUED_RUNS_PER_USER = int(os.environ.get("POSTTRAIN_MAX_QUEUED_RUNS_PER_USER", "5"))
POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER = int(os.environ.get("POSTTRAIN_MAX_ACTIVE_RUNS_PER_USER", "8"))
# External runs (reported by posttrain watch, the TRL callback, the engine's CLI) a user may have
# active at once: they use no driver slot, this bounds what one token can open.
POSTTRAIN_MAX_ACTIVE_EXTERNAL_RUNS = int(os.environ.get("POSTTRAIN_MAX_ACTIVE_EXTERNAL_RUNS", "20"))
# Per-run caps: ranks (trainer.n_gpus_per_node x trainer.nnodes), reward processes
# (reward.num_workers) and training steps (trainer.total_training_steps, or epochs x batches).
POSTTRAIN_MAX_RANKS = int(os.environ.get("POSTTRAIN_MAX_RANKS", "8"))
POSTTRAIN_MAX_REWARD_WORKERS = int(os.environ.get("POSTTRAIN_MAX_REWARD_WORKERS", "16"))
POSTTRAIN_MAX_TRAINING_STEPS = int(os.environ.get("POSTTRAIN_MAX_TRAINING_STEPS", "100000"))
# Runs with a driver at once on this server (0: no limit); the others wait queued, oldest first.
# One suits a single machine, where two runs would share its cores; raise it for a Ray cluster.
POSTTRAIN_MAX_RUNNING_RUNS = int(os.environ.get("POSTTRAIN_MAX_RUNNING_RUNS", "1"))
# Checkpoint exports and evaluations (a process each, webapp.runs.checkpoints) at once on this
# server (0: no limit); the others wait queued, oldest first.
POSTTRAIN_MAX_CHECKPOINT_JOBS = int(os.environ.get("POSTTRAIN_MAX_CHECKPOINT_JOBS", "1"))
# Folders (colon- or comma-separated) whose models and data any user's run may read, besides
# their own uploads and runs and the tiny:// assets; empty: none (webapp.experiments.configs).
POSTTRAIN_MODEL_ROOTS = os.environ.get("POSTTRAIN_MODEL_ROOTS", "")
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
    "axes",
    "webapp.accounts",
    "webapp.experiments",
    "webapp.runs",
    "webapp.datasets",
    "webapp.samples",
    "ninja",  # the API docs page's scripts as static files, no CDN
    "webapp.api",
    "webapp.health",
    "webapp.sweeps",
    "webapp.external",
    "webapp.alerts",
    "webapp.projects",
    "webapp.reports",
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
    # Last, as django-axes requires: it turns a locked-out log-in into the lockout page.
    "axes.middleware.AxesMiddleware",
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

from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: E402

from webapp.api.rates import parse_rate  # noqa: E402

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py 8 gives every read a 5 s socket timeout, as long as the layer's blocking receive
        # waits: without a longer one an idle consumer dies every 5 s (channels_redis issue 422).
        # After a Redis restart the layer's pooled connections are stale and the first command on
        # each fails: one immediate retry on a fresh connection hides that from the next socket.
        # A refused connect fails within socket_connect_timeout, so a send never hangs for long.
        # A channel holds up to 1,000 events (channels_redis keeps 100): a slow viewer of a fast
        # run falls behind before it loses an event, and a gap is then read from PostgreSQL.
        # POSTTRAIN_CHANNEL_PREFIX keeps studios (or test sessions) that share a Redis apart; the
        # workers and drivers inherit it, so their events reach the same web processes.
        "CONFIG": {
            "prefix": os.environ.get("POSTTRAIN_CHANNEL_PREFIX") or "asgi",
            "capacity": 1000,
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": 15,
                    "socket_connect_timeout": 2,
                    "retry_on_error": [RedisConnectionError],
                }
            ],
        },
    }
}

# The API's rate limit (webapp.api.throttle): each token, and each user's browser session, may
# send POSTTRAIN_API_RATE requests per fixed window ("600/min"; per s, min, hour or day), counted
# in Redis so every web process shares the counts. The default cache stays in-process.
POSTTRAIN_API_RATE = os.environ.get("POSTTRAIN_API_RATE") or "600/min"
try:
    parse_rate(POSTTRAIN_API_RATE)
except ValueError as exc:
    raise ImproperlyConfigured(f"POSTTRAIN_API_RATE={exc}") from None
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "api_rate": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": os.environ.get("POSTTRAIN_CHANNEL_PREFIX") or "posttrain",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    },
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# What a worker imports at start: the tasks, which the studio sends by name (webapp.celery).
CELERY_INCLUDE = ["workers.tasks"]
CELERY_BEAT_SCHEDULE = {
    "mark-lost-runs": {"task": "workers.tasks.mark_lost_runs", "schedule": 15.0},
    "dispatch-queued-runs": {"task": "workers.tasks.dispatch_queued_runs", "schedule": 5.0},
    "resend-overdue-alerts": {"task": "workers.tasks.resend_overdue_alerts", "schedule": 60.0},
    "dispatch-checkpoint-jobs": {
        "task": "workers.tasks.dispatch_checkpoint_jobs",
        "schedule": 5.0,
    },
}

# django-axes first: it refuses a locked-out username+address before the password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# 5 wrong passwords for one username from one address lock that pair out for 15 minutes
# (``manage.py axes_reset_username <name>`` lifts it early); a right one resets the count.
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "webapp.accounts.views.lockout"
# Checked by the sign-up and password-change forms (``manage.py posttrain_demo`` sets its
# demo password directly, so the development user keeps ``demo``).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 10},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

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
# Every upload streams through the size cap first: a file past POSTTRAIN_UPLOAD_MAX_BYTES is
# dropped (its temporary file deleted) as the bytes arrive. The other limits bound what a
# dataset's validation and preview read of the file.
FILE_UPLOAD_HANDLERS = [
    "webapp.datasets.uploads.UploadSizeCapHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]


def _env_count(name: str, default: int) -> int:
    value = os.environ.get(name) or str(default)
    if not value.isdecimal() or int(value) <= 0:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a positive whole number; set it like {name}={default}"
        )
    return int(value)


POSTTRAIN_UPLOAD_MAX_BYTES = _env_count("POSTTRAIN_UPLOAD_MAX_BYTES", 512 * 1024**2)
POSTTRAIN_DATASET_MAX_ROWS = _env_count("POSTTRAIN_DATASET_MAX_ROWS", 10_000_000)
POSTTRAIN_DATASET_MAX_LINE_BYTES = _env_count("POSTTRAIN_DATASET_MAX_LINE_BYTES", 8 * 1024**2)
POSTTRAIN_PREVIEW_MAX_BYTES = _env_count("POSTTRAIN_PREVIEW_MAX_BYTES", 64 * 1024**2)


def _env_positive(name: str, default: float) -> float:
    value = os.environ.get(name) or str(default)
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0 or number == float("inf"):
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a positive number; set it like {name}={default}"
        )
    return number


# RL health checks on each recorded step (webapp.health.checks; docs/health.md): when they fire.
POSTTRAIN_HEALTH_BASELINE_STEPS = _env_count("POSTTRAIN_HEALTH_BASELINE_STEPS", 3)
POSTTRAIN_HEALTH_ENTROPY_FRACTION = _env_positive("POSTTRAIN_HEALTH_ENTROPY_FRACTION", 0.1)
POSTTRAIN_HEALTH_ENTROPY_FLOOR = _env_positive("POSTTRAIN_HEALTH_ENTROPY_FLOOR", 0.01)
POSTTRAIN_HEALTH_KL_TARGET_FACTOR = _env_positive("POSTTRAIN_HEALTH_KL_TARGET_FACTOR", 3.0)
POSTTRAIN_HEALTH_KL_MAX = _env_positive("POSTTRAIN_HEALTH_KL_MAX", 1.0)
POSTTRAIN_HEALTH_CLIPFRAC_MAX = _env_positive("POSTTRAIN_HEALTH_CLIPFRAC_MAX", 0.3)
POSTTRAIN_HEALTH_HACKING_WINDOW = _env_count("POSTTRAIN_HEALTH_HACKING_WINDOW", 4)
POSTTRAIN_HEALTH_HACKING_MIN_CHANGE = _env_positive("POSTTRAIN_HEALTH_HACKING_MIN_CHANGE", 0.05)
POSTTRAIN_HEALTH_LENGTH_FRACTION = _env_positive("POSTTRAIN_HEALTH_LENGTH_FRACTION", 0.2)
POSTTRAIN_HEALTH_LENGTH_CLIP_MAX = _env_positive("POSTTRAIN_HEALTH_LENGTH_CLIP_MAX", 0.5)
POSTTRAIN_HEALTH_GRAD_NORM_FACTOR = _env_positive("POSTTRAIN_HEALTH_GRAD_NORM_FACTOR", 10.0)
POSTTRAIN_HEALTH_GRAD_NORM_WINDOW = _env_count("POSTTRAIN_HEALTH_GRAD_NORM_WINDOW", 20)
POSTTRAIN_HEALTH_REWARD_ERROR_RATE = _env_positive("POSTTRAIN_HEALTH_REWARD_ERROR_RATE", 0.1)
POSTTRAIN_HEALTH_MEMORY_WINDOW = _env_count("POSTTRAIN_HEALTH_MEMORY_WINDOW", 10)
POSTTRAIN_HEALTH_STALE_DROP_RATE = _env_positive("POSTTRAIN_HEALTH_STALE_DROP_RATE", 0.5)
POSTTRAIN_HEALTH_WAIT_SHARE = _env_positive("POSTTRAIN_HEALTH_WAIT_SHARE", 0.5)
POSTTRAIN_HEALTH_WAIT_STEPS = _env_count("POSTTRAIN_HEALTH_WAIT_STEPS", 5)

# Alerts (webapp/alerts): webhooks to private addresses only where the administrator allows it
# (an intranet Mattermost); a member's messages per minute; attempts of one message and the
# first wait between them (doubling); the studio's public address for links in the messages.
POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS = _env_bool(
    "POSTTRAIN_ALERTS_ALLOW_PRIVATE_WEBHOOKS", False
)
POSTTRAIN_ALERTS_PER_MINUTE = _env_count("POSTTRAIN_ALERTS_PER_MINUTE", 10)
POSTTRAIN_ALERTS_MAX_ATTEMPTS = _env_count("POSTTRAIN_ALERTS_MAX_ATTEMPTS", 5)
POSTTRAIN_ALERTS_RETRY_SECONDS = _env_positive("POSTTRAIN_ALERTS_RETRY_SECONDS", 30.0)
POSTTRAIN_PUBLIC_URL = os.environ.get("POSTTRAIN_PUBLIC_URL", "")
# E-mail alerts go through Django's mail backend: SMTP by default, configured from the
# environment (EMAIL_BACKEND=django.core.mail.backends.console.EmailBackend prints them).
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = _env_count("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = _env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "posttrain@localhost")
# A run stops, and ends failed with the reason, when more than this share of a step's rewards
# failed (the reward function raised) in each of this many steps in a row; a share of 1 turns
# the rule off (webapp.runs.reward_failures; docs/health.md).
POSTTRAIN_REWARD_FAILURE_RATE = _env_positive("POSTTRAIN_REWARD_FAILURE_RATE", 0.5)
if POSTTRAIN_REWARD_FAILURE_RATE > 1:
    raise ImproperlyConfigured(
        f"POSTTRAIN_REWARD_FAILURE_RATE={POSTTRAIN_REWARD_FAILURE_RATE} is over 1; it is a share "
        "of a step's samples, e.g. 0.5 (1 turns the rule off)"
    )
POSTTRAIN_REWARD_FAILURE_STEPS = _env_count("POSTTRAIN_REWARD_FAILURE_STEPS", 3)
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
