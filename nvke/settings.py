"""NVKE settings: 12-factor, everything from environment variables (django-environ).

Required in production: ``SECRET_KEY``, ``DATABASE_URL`` (PostgreSQL only), ``REDIS_URL``.
The defaults point at a developer's local PostgreSQL / Redis; ``make run`` sets both to the
embedded servers it starts (see ``nvke/embedded``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import environ
import structlog

from nvke.redaction import redact_event

from .beat_schedule import celery_beat_schedule
from .settings_registry import BY_NAME as _DECLARED
from .settings_registry import django_settings, read

BASE_DIR = Path(__file__).resolve().parent.parent

# Every NVKE_* variable, declared with its type, default, unit and meaning in
# nvke/settings_registry.py (docs/reference/configuration.md is generated from it), becomes a
# Django setting of the same name here; the rest of this file only derives from them.
_nvke = django_settings()
globals().update(_nvke)

DEBUG = read("DEBUG")
#: the development default; with DEBUG off NVKE refuses to start on it (nvke/secrets_check.py)
DEFAULT_SECRET_KEY = _DECLARED["SECRET_KEY"].default
SECRET_KEY = read("SECRET_KEY")
# The portal's public origin, https://host[:port] (nvke/public_url.py): links in mail and
# invitations are built from it, never from a request's Host. Required with DEBUG off.
NVKE_PUBLIC_URL = _nvke["NVKE_PUBLIC_URL"].rstrip("/")
# Host names the web tier answers: ALLOWED_HOSTS ("*" refuses to start with DEBUG off, whatever
# NVKE_ALLOW_INSECURE_DEFAULTS says), plus NVKE_PUBLIC_URL's host, the loopback names, and
# NVKE_POD_IP (the pod's own address, for kubelet probes and scrapes).
ALLOWED_HOSTS = list(
    dict.fromkeys(
        [
            *read("ALLOWED_HOSTS"),
            *([f"[{h}]" if ":" in h else h] if (h := urlsplit(NVKE_PUBLIC_URL).hostname) else []),
            *([ip] if (ip := _nvke["NVKE_POD_IP"]) else []),
            "localhost",
            "127.0.0.1",
            "[::1]",
        ]
    )
)
CSRF_TRUSTED_ORIGINS = read("CSRF_TRUSTED_ORIGINS")
if _nvke["NVKE_BEHIND_TLS_PROXY"]:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "rest_framework_api_key",
    "django_filters",
    "django_structlog",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "csp",
    "nvke",
    "tenants",
    "catalog",
    "fleet",
    "reservations",
    "clusters",
    "nodepools",
    "billing",
    "webhooks",
    "portal",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "nvke.internal_port.InternalPortMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "nvke.observability.HttpMetricsMiddleware",
    "nvke.middleware.RequestIdMiddleware",
    "django_structlog.middlewares.RequestMiddleware",
    "nvke.middleware.QueryStringGuardMiddleware",
    "nvke.middleware.BodySizeLimitMiddleware",
    "nvke.middleware.FormTextGuardMiddleware",
    "nvke.middleware.ClientIpMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "nvke.idempotency.IdempotencyMiddleware",
    "tenants.audit_middleware.AuditFallbackMiddleware",
    # last, as django-axes requires: answers a locked-out login attempt
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "nvke.urls"
APPEND_SLASH = False
WSGI_APPLICATION = "nvke.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": environ.Env.db_url_config(read("DATABASE_URL"))}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DATABASES["default"]["CONN_MAX_AGE"] = read("DB_CONN_MAX_AGE")
# a kept connection is checked before its first use in a request or a task (one killed by a
# PostgreSQL restart is replaced, not an error)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"]["TEST"] = {"NAME": read("TEST_DATABASE_NAME")}
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise environ.ImproperlyConfigured(
        "NVKE supports PostgreSQL only (DATABASE_URL=postgres://...)"
    )

REDIS_URL = read("REDIS_URL")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "nvke",
    }
}

# ------------------------------------------------------- security (docs/operator/security.md)
AUTHENTICATION_BACKENDS = [
    # django-axes first: it refuses a locked-out username+IP before any password is checked
    "axes.backends.AxesStandaloneBackend",
    # Django's ModelBackend, the username matched whatever its case (tenants/login.py)
    "tenants.login.CaseInsensitiveModelBackend",
]
# Login throttling and lockout (django-axes): after NVKE_LOGIN_FAILURE_LIMIT failed logins of
# one username from one IP, that pair is locked for NVKE_LOGIN_COOLOFF_MINUTES (429 page; the
# right password does not help meanwhile). `manage.py axes_reset_username <name>` unlocks.
AXES_FAILURE_LIMIT = _nvke["NVKE_LOGIN_FAILURE_LIMIT"]
AXES_COOLOFF_TIME = timedelta(minutes=_nvke["NVKE_LOGIN_COOLOFF_MINUTES"])
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_USERNAME_CALLABLE = "tenants.login.axes_username"  # lower-cased: one lockout per account
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "portal/locked_out.html"
AXES_VERBOSE = False
AXES_ENABLED = _nvke["NVKE_LOGIN_LOCKOUT"]
# Every password set (portal forms, API, management commands) passes these validators.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": _nvke["NVKE_PASSWORD_MIN_LENGTH"]},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Password reset mails (portal "Forgot your password?"): EMAIL_URL as django-environ reads it
# (smtp+tls://user:pass@host:587). A mail carries a password-reset link, so it never goes to a
# log in production: unset with DEBUG off, nothing is sent (and nvke/secrets_check.py refuses
# to start, nvke.E005, unless NVKE_ALLOW_INSECURE_DEFAULTS); console mail is for DEBUG only.
_email_url = read("EMAIL_URL").strip()
#: the scheme of EMAIL_URL ("" when unset): what the checks look at (not the URL: a password)
EMAIL_URL_SCHEME = urlsplit(_email_url).scheme
if _email_url:
    vars().update(environ.Env.email_url_config(_email_url))
    if EMAIL_URL_SCHEME == "filemail":  # filemail:///abs/dir is /abs/dir (environ drops a "/")
        EMAIL_FILE_PATH = urlsplit(_email_url).path
elif DEBUG:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
else:
    EMAIL_BACKEND = "nvke.mail.UnconfiguredEmailBackend"
DEFAULT_FROM_EMAIL = read("DEFAULT_FROM_EMAIL")
PASSWORD_RESET_TIMEOUT = _nvke["NVKE_PASSWORD_RESET_TIMEOUT_S"]
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
CSRF_FAILURE_VIEW = "nvke.http.csrf_failure"
# Content-Security-Policy (django-csp): scripts only from this origin (htmx, Chart.js and the
# portal's own files are served from /static/; no inline scripts or handlers); styles from
# this origin plus inline `style` attributes (bars, heat map cells, htmx's indicator style).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# Production behind TLS (NVKE_BEHIND_TLS_PROXY=1): HSTS and HTTPS redirects as well.
if _nvke["NVKE_BEHIND_TLS_PROXY"]:
    SECURE_HSTS_SECONDS = read("SECURE_HSTS_SECONDS")
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = read("SECURE_HSTS_PRELOAD")
    SECURE_SSL_REDIRECT = read("SECURE_SSL_REDIRECT")
    # probes and the metrics scrape come in over plain HTTP inside the cluster
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = read("STATIC_ROOT") or str(BASE_DIR / "staticfiles")
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

DATA_UPLOAD_MAX_MEMORY_SIZE = read("DATA_UPLOAD_MAX_MEMORY_SIZE")

# ---------------------------------------------------------------- REST API
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiKeyAuthentication",
        "tenants.authentication.SessionPrincipalAuthentication",
    ],
    "DEFAULT_THROTTLE_CLASSES": [
        "nvke.throttling.PrincipalRateThrottle",
        "nvke.throttling.TenantRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "principal": _nvke["NVKE_THROTTLE_PRINCIPAL"],
        "tenant": _nvke["NVKE_THROTTLE_TENANT"],
    },
    "DEFAULT_PERMISSION_CLASSES": ["tenants.permissions.IsAuthenticatedPrincipal"],
    "DEFAULT_RENDERER_CLASSES": ["nvke.renderers.FastJSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["nvke.parsers.SafeJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "nvke.pagination.DefaultPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "nvke.openapi.ContractAutoSchema",
    "EXCEPTION_HANDLER": "nvke.errors.problem_exception_handler",
    # django-filter's backend, skipped when a request names none of the view's filters
    "DEFAULT_FILTER_BACKENDS": ["nvke.filters.QuietFilterBackend"],
    "COERCE_DECIMAL_TO_STRING": False,
    "UNAUTHENTICATED_USER": None,
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "NVKE API",
    "DESCRIPTION": (
        "Managed Kubernetes on GPU infrastructure: clusters, GPU node pools, fleet, usage."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # one name per choice set (several models have a `status`; a host's `state` and its
    # `drain_target` share HostState), so `check --deploy` is clean and names are stable
    "ENUM_NAME_OVERRIDES": {
        "HostStateEnum": "fleet.choices.HostState",
        "OperationStatusEnum": "clusters.choices.OperationStatus",
        "InvoiceStatusEnum": "billing.models.InvoiceStatus",
        "CheckStatusEnum": "fleet.choices.CheckStatus",
        "ScrubStatusEnum": "fleet.choices.ScrubStatus",
        "PhaseEnum": "clusters.choices.Phase",
        "NodePhaseEnum": "nodepools.choices.NodePhase",
    },
    # Problem component, protocol headers, examples, valid defaults (nvke/openapi.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "nvke.openapi.postprocess",
    ],
}

# ---------------------------------------------------------------- Celery
CELERY_BROKER_URL = read("CELERY_BROKER_URL") or REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
# Recovery of lost messages vs duplicates (docs/operator/outages-and-observability.md): a message
# delivered to a worker that dies sits in Redis' unacked set until the visibility timeout has
# passed, then a live worker's periodic sweep (every unacked_restore_interval s) puts it back in
# its queue. A countdown message also waits there, unacked, in the worker that holds it, so a
# countdown longer than the timeout would be handed out twice; nvke.queueing caps countdowns at
# half the timeout (and at 60 s). 120 s: a lost message comes back within ~2 min instead of an
# hour; a step running longer than that (time limit 300 s) may be run once more, which the
# reconcilers tolerate (idempotent, one at a time by row lock). The beat resync (below) covers the
# rest.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": read("CELERY_VISIBILITY_TIMEOUT"),
    "unacked_restore_interval": read("CELERY_UNACKED_RESTORE_INTERVAL_S"),
    "unacked_restore_throttle": 1,
}
# Publishing while the broker is away: fail within ~1 s (nvke.queueing logs it, the resync
# sends it later) instead of holding the request.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BROKER_CONNECTION_TIMEOUT = read("CELERY_BROKER_CONNECTION_TIMEOUT")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # keep the JSON logging configured above
# Celery's Django fix-up closes the database connection before and after EVERY task unless this
# is set (celery/fixups/django.py close_database): a new PostgreSQL backend per task, 2,400 in the
# reconcile benchmark. With it set beyond reach, nvke.celery closes them by Django's own rules
# instead (CONN_MAX_AGE, errors, a transaction left open), as Django does around a request.
CELERY_DB_REUSE_MAX = 2**62
# Beat is safe with several replicas: celery-redbeat keeps the schedule in Redis and only the
# replica holding the Redis lock runs it; another takes over within the lock timeout.
CELERY_BEAT_SCHEDULER = "nvke.beat.ResilientRedBeatScheduler"
CELERY_REDBEAT_REDIS_URL = REDIS_URL
CELERY_REDBEAT_KEY_PREFIX = read("CELERY_REDBEAT_KEY_PREFIX")
CELERY_REDBEAT_LOCK_TIMEOUT = read("CELERY_REDBEAT_LOCK_TIMEOUT")
CELERY_BEAT_MAX_LOOP_INTERVAL = 10
CELERY_TASK_ROUTES = {
    "clusters.tasks.*": {"queue": "reconcile"},
    "nodepools.tasks.*": {"queue": "reconcile"},
    "fleet.tasks.*": {"queue": "telemetry"},
    "billing.tasks.*": {"queue": "billing"},
    # deliveries wait on tenants' endpoints: their own queue and worker (docs/operator/
    # security-limits.md), so a slow endpoint never holds a reconcile slot
    "webhooks.tasks.*": {"queue": "webhooks"},
}
CELERY_TASK_TIME_LIMIT = read("CELERY_TASK_TIME_LIMIT")
CELERY_TASK_SOFT_TIME_LIMIT = read("CELERY_TASK_SOFT_TIME_LIMIT")
# Periodic tasks: one schedule, nvke/beat_schedule.py (its periods come from the registry).
CELERY_BEAT_SCHEDULE = celery_beat_schedule(_nvke)
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # a worker waits for its broker, however long

# ---------------------------------------------------------------- NVKE (derived)
# The resync period (the name the reconcilers read).
RESYNC_INTERVAL_S = _nvke["NVKE_RESYNC_INTERVAL_S"]
NVKE_SIMULATED_HOSTS_DIR = _nvke["NVKE_SIMULATED_HOSTS_DIR"] or str(
    BASE_DIR / _nvke["NVKE_DATA_DIR"] / "simulated-hosts"
)
NVKE_CONTROL_PLANES_DIR = _nvke["NVKE_CONTROL_PLANES_DIR"] or str(
    BASE_DIR / _nvke["NVKE_DATA_DIR"] / "control-planes"
)
NVKE_BOOTSTRAP_TOKEN_TTL = timedelta(hours=_nvke["NVKE_BOOTSTRAP_TOKEN_TTL_HOURS"])

# Structured JSON logs (structlog through the stdlib logging tree, so Django's, Celery's and
# our own records come out alike); request_id follows a request into the tasks it causes
# (django-structlog's Celery integration). LOG_FORMAT=console for human-readable dev output.
LOG_LEVEL = read("LOG_LEVEL")
_pre_chain = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
]
# applied by nvke.log_filters.configure: the same loggers and filters however often
# django.setup() runs (Celery's Django fix-up runs it once more in each worker)
LOGGING_CONFIG = "nvke.log_filters.configure"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": structlog.stdlib.ProcessorFormatter,
            # exc_info of stdlib records (Celery's, Django's) becomes an "exception" string
            # with the whole traceback; without format_exc_info it would be a repr
            # invitation tokens and password-reset links redacted from every line
            # (nvke/redaction.py), last before rendering
            "processors": [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact_event,
                structlog.processors.JSONRenderer(),
            ],
            "foreign_pre_chain": _pre_chain,
        },
        "console": {
            "()": structlog.stdlib.ProcessorFormatter,
            "processors": [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                redact_event,
                structlog.dev.ConsoleRenderer(colors=False),
            ],
            "foreign_pre_chain": _pre_chain,
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": read("LOG_FORMAT"),
        }
    },
    "filters": {
        "one_line_per_request": {"()": "nvke.log_filters.OneLinePerRequest"},
        "disallowed_host": {"()": "nvke.log_filters.DisallowedHostOncePerWindow", "window_s": 60},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.request": {"level": "ERROR"},
        # one line per request: request_finished (gunicorn writes no access log either)
        "django_structlog.middlewares.request": {"filters": ["one_line_per_request"]},
        # a bad Host header: one WARNING line a minute, no traceback (a client could flood it)
        "django.security.DisallowedHost": {"filters": ["disallowed_host"]},
    },
}
structlog.configure(
    processors=[
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.filter_by_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    cache_logger_on_first_use=True,
)
DJANGO_STRUCTLOG_CELERY_ENABLED = True
DJANGO_STRUCTLOG_TRUST_UPSTREAM_REQUEST_ID = True
DJANGO_STRUCTLOG_USER_ID_FIELD = "label"
