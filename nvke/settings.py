"""NVKE settings: 12-factor, everything from environment variables (django-environ).

Required in production: ``SECRET_KEY``, ``DATABASE_URL`` (PostgreSQL only), ``REDIS_URL``.
The defaults point at a developer's local PostgreSQL / Redis; ``make run`` sets both to the
embedded servers it starts (see ``nvke/embedded``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import environ
import structlog

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
#: the development default; with DEBUG off NVKE refuses to start on it (nvke/secrets_check.py)
DEFAULT_SECRET_KEY = "nvke-insecure-dev-key-change-me"
SECRET_KEY = env("SECRET_KEY", default=DEFAULT_SECRET_KEY)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["*"])
# Fernet keys for secrets at rest (kubeconfigs), newest first; see nvke/crypto.py.
NVKE_SECRET_KEYS = env.list("NVKE_SECRET_KEYS", default=[])
# Development only (DEBUG on, or NVKE_ALLOW_INSECURE_DEFAULTS=1 for the embedded `make run` and
# the test suite): start on the default SECRET_KEY / derive the Fernet key from SECRET_KEY.
NVKE_ALLOW_INSECURE_DEFAULTS = env.bool("NVKE_ALLOW_INSECURE_DEFAULTS", default=False)
# Behind a TLS-terminating ingress: trust its X-Forwarded-Proto and list the portal's origin
# (https://nvke.example.com) so logins and forms pass the CSRF check.
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
if env.bool("NVKE_BEHIND_TLS_PROXY", default=False):
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
    "nvke.audit_middleware.AuditFallbackMiddleware",
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

DATABASES = {
    "default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/nvke"),
}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["TEST"] = {"NAME": env("TEST_DATABASE_NAME", default="test_nvke")}
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise environ.ImproperlyConfigured(
        "NVKE supports PostgreSQL only (DATABASE_URL=postgres://...)"
    )

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "nvke",
    }
}

# ---------------------------------------------------------------- security (README "Security")
AUTHENTICATION_BACKENDS = [
    # django-axes first: it refuses a locked-out username+IP before any password is checked
    "axes.backends.AxesStandaloneBackend",
    # Django's ModelBackend, the username matched whatever its case (tenants/login.py)
    "tenants.login.CaseInsensitiveModelBackend",
]
# Login throttling and lockout (django-axes): after NVKE_LOGIN_FAILURE_LIMIT failed logins of
# one username from one IP, that pair is locked for NVKE_LOGIN_COOLOFF_MINUTES (429 page; the
# right password does not help meanwhile). `manage.py axes_reset_username <name>` unlocks.
AXES_FAILURE_LIMIT = env.int("NVKE_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("NVKE_LOGIN_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_USERNAME_CALLABLE = "tenants.login.axes_username"  # lower-cased: one lockout per account
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "portal/locked_out.html"
AXES_VERBOSE = False
AXES_ENABLED = env.bool("NVKE_LOGIN_LOCKOUT", default=True)
# Every password set (portal forms, API, management commands) passes these validators.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": env.int("NVKE_PASSWORD_MIN_LENGTH", default=10)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Password reset mails (portal "Forgot your password?"): EMAIL_URL as django-environ reads it
# (smtp+tls://user:pass@host:587); the default writes mails to the log (console backend).
vars().update(env.email_url("EMAIL_URL", default="consolemail://"))
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="nvke@localhost")
PASSWORD_RESET_TIMEOUT = env.int("NVKE_PASSWORD_RESET_TIMEOUT_S", default=3 * 86400)
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
if env.bool("NVKE_BEHIND_TLS_PROXY", default=False):
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    # probes and the metrics scrape come in over plain HTTP inside the cluster
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = env("STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=16 * 1024 * 1024)

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
        "principal": env("NVKE_THROTTLE_PRINCIPAL", default="6000/min"),
        "tenant": env("NVKE_THROTTLE_TENANT", default="12000/min"),
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
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
# Recovery of lost messages vs duplicates (README "Broker outages"): a message delivered to a
# worker that dies sits in Redis' unacked set until the visibility timeout has passed, then a
# live worker's periodic sweep (every unacked_restore_interval s) puts it back in its queue. A
# countdown message also waits there, unacked, in the worker that holds it, so a countdown
# longer than the timeout would be handed out twice; nvke.queueing caps countdowns at half the
# timeout (and at 60 s). 120 s: a lost message comes back within ~2 min instead of an hour; a
# step running longer than that (time limit 300 s) may be run once more, which the reconcilers
# tolerate (idempotent, one at a time by row lock). The beat resync (below) covers the rest.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=120),
    "unacked_restore_interval": env.int("CELERY_UNACKED_RESTORE_INTERVAL_S", default=5),
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
CELERY_BROKER_CONNECTION_TIMEOUT = env.float("CELERY_BROKER_CONNECTION_TIMEOUT", default=2.0)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # keep the JSON logging configured above
# Beat is safe with several replicas: celery-redbeat keeps the schedule in Redis and only the
# replica holding the Redis lock runs it; another takes over within the lock timeout.
CELERY_BEAT_SCHEDULER = "nvke.beat.ResilientRedBeatScheduler"
CELERY_REDBEAT_REDIS_URL = REDIS_URL
CELERY_REDBEAT_KEY_PREFIX = env("CELERY_REDBEAT_KEY_PREFIX", default="nvke:redbeat:")
CELERY_REDBEAT_LOCK_TIMEOUT = env.int("CELERY_REDBEAT_LOCK_TIMEOUT", default=60)
CELERY_BEAT_MAX_LOOP_INTERVAL = 10
CELERY_TASK_ROUTES = {
    "clusters.tasks.*": {"queue": "reconcile"},
    "nodepools.tasks.*": {"queue": "reconcile"},
    "fleet.tasks.*": {"queue": "telemetry"},
    "billing.tasks.*": {"queue": "billing"},
}
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=300)
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", default=240)
# The resync re-enqueues every unconverged object (enqueue_once: at most one pending message
# each): a shorter period recovers a lost message sooner and costs two indexed queries per
# period plus one Redis SET NX per unconverged object.
RESYNC_INTERVAL_S = env.float("NVKE_RESYNC_INTERVAL_S", default=15.0)
NVKE_HEARTBEAT_INTERVAL_S = env.float("NVKE_HEARTBEAT_INTERVAL_S", default=10.0)
NVKE_THROTTLE_REDIS_TIMEOUT_S = env.float("NVKE_THROTTLE_REDIS_TIMEOUT_S", default=0.25)
CELERY_BEAT_SCHEDULE = {
    "resync-clusters": {
        "task": "clusters.tasks.resync_clusters",
        "schedule": RESYNC_INTERVAL_S,
        "options": {"expires": RESYNC_INTERVAL_S * 0.9},
    },
    "resync-nodepools": {
        "task": "nodepools.tasks.resync_nodepools",
        "schedule": RESYNC_INTERVAL_S,
        "options": {"expires": RESYNC_INTERVAL_S * 0.9},
    },
    "kubernetes-version-end-of-life": {
        "task": "clusters.tasks.refresh_version_conditions",
        "schedule": 86400.0,
        "options": {"expires": 3600.0},
    },
    "autoscale-nodepools": {
        "task": "nodepools.tasks.autoscale_nodepools",
        "schedule": 60.0,
        "options": {"expires": 50.0},
    },
    "mark-silent-hosts-not-ready": {
        "task": "fleet.tasks.mark_silent_hosts_not_ready",
        "schedule": 60.0,
        "options": {"expires": 50.0},
    },
    "sweep-reservations": {
        "task": "reservations.tasks.sweep_reservations",
        "schedule": 60.0,
        "options": {"expires": 50.0},
    },
    "ensure-sample-partitions": {
        "task": "fleet.tasks.ensure_sample_partitions",
        "schedule": 3600.0,
        "options": {"expires": 3000.0},
    },
}

# ---------------------------------------------------------------- NVKE
# Simulated provider: seconds a control plane / node takes to become ready (0 in tests).
NVKE_SIMULATED_CONTROL_PLANE_DELAY_S = env.float(
    "NVKE_SIMULATED_CONTROL_PLANE_DELAY_S", default=2.0
)
NVKE_SIMULATED_NODE_DELAY_S = env.float("NVKE_SIMULATED_NODE_DELAY_S", default=2.0)
# Provider of new clusters: "hosted" (NVKE runs each control plane: clusters/hosted/), or
# "clusterapi"; "simulated" (no Kubernetes at all) is a test tool, the test suite's default.
NVKE_DEFAULT_PROVIDER = env("NVKE_DEFAULT_PROVIDER", default="hosted")
# Hosted control planes (clusters/hosted/): the folder of the shared etcd and each control
# plane's files (certificates 0600, logs); kube-apiserver ports are allocated from
# NVKE_HOSTED_PORT_RANGE ("first-last", inclusive) and kept per cluster; NVKE_K8S_BIN_ROOT
# overrides the builder's cache folder (default ~/.cache/nvke/k8s, deploy/k8s/build.sh).
NVKE_CONTROL_PLANES_DIR = env(
    "NVKE_CONTROL_PLANES_DIR",
    default=str(Path(env("NVKE_DATA_DIR", default=str(BASE_DIR / ".nvke"))) / "control-planes"),
)
NVKE_HOSTED_PORT_RANGE = env("NVKE_HOSTED_PORT_RANGE", default="16400-16999")
NVKE_K8S_BIN_ROOT = env("NVKE_K8S_BIN_ROOT", default="")
# Simulated provider: seconds each machine-creation call takes (0; crash tests make it slow).
NVKE_SIMULATED_CALL_DELAY_S = env.float("NVKE_SIMULATED_CALL_DELAY_S", default=0.0)
# SIMULATED infrastructure API latency: when set above NVKE_SIMULATED_CALL_DELAY_S, each
# machine-creation call takes a uniformly random time between the two (the fault suite and the
# reconcile benchmark use 0.5-3 s)
NVKE_SIMULATED_CALL_DELAY_MAX_S = env.float("NVKE_SIMULATED_CALL_DELAY_MAX_S", default=0.0)
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # a worker waits for its broker, however long
# SIMULATED hosts (clusters/providers/simhosts.py): the folder of their hardware state files
# (read by `nvke-agent --source simulated`), and whether a host with no agent registered gets
# its agent report in-process (the same simulated source, the same ingestion function).
NVKE_SIMULATED_HOSTS_DIR = env(
    "NVKE_SIMULATED_HOSTS_DIR",
    default=str(Path(env("NVKE_DATA_DIR", default=str(BASE_DIR / ".nvke"))) / "simulated-hosts"),
)
NVKE_SIMULATED_IN_PROCESS_AGENT = env.bool("NVKE_SIMULATED_IN_PROCESS_AGENT", default=True)
# Observed-state gates (nodepools/observed.py): how long a node may wait for its host's agent
# to report what it must run before the operation fails or rolls back (s).
NVKE_OBSERVED_STATE_TIMEOUT_S = env.float("NVKE_OBSERVED_STATE_TIMEOUT_S", default=300.0)
# Cluster API provider ("clusterapi"): the management cluster's kubeconfig file (blank = not
# configured: the provider then fails its calls with `clusterapi_not_configured`), the
# namespace NVKE's Cluster API objects live in there, and the infrastructure provider its
# objects reference: a kind prefix ("Metal3" -> Metal3Cluster / Metal3MachineTemplate in
# infrastructure.cluster.x-k8s.io) or "<api group>/<prefix>" for another group.
NVKE_CLUSTERAPI_KUBECONFIG = env("NVKE_CLUSTERAPI_KUBECONFIG", default="")
NVKE_CLUSTERAPI_NAMESPACE = env("NVKE_CLUSTERAPI_NAMESPACE", default="nvke")
NVKE_CLUSTERAPI_INFRASTRUCTURE = env("NVKE_CLUSTERAPI_INFRASTRUCTURE", default="Metal3")
# Control-plane machines per cluster (KubeadmControlPlane replicas: 1, 3 or 5).
NVKE_CLUSTERAPI_CONTROL_PLANE_REPLICAS = env.int(
    "NVKE_CLUSTERAPI_CONTROL_PLANE_REPLICAS", default=3
)
# JSON merged into each node pool's Metal3MachineTemplate spec.template.spec (the site's
# ``image``, ``dataTemplate`` ...); NVKE adds the hostSelector.
NVKE_CLUSTERAPI_MACHINE_SPEC = env.json("NVKE_CLUSTERAPI_MACHINE_SPEC", default={})
# Test beds only: a kubeconfig file that plays every workload cluster (instead of the
# ``<cluster>-kubeconfig`` Secret), where the machines are SIMULATED by CAPD's in-memory backend
# whose API servers cannot hold the GPU Operator's objects. Empty in production.
NVKE_CLUSTERAPI_WORKLOAD_KUBECONFIG = env("NVKE_CLUSTERAPI_WORKLOAD_KUBECONFIG", default="")
# A reconciler gives up deleting after this many failed attempts (-> DELETE_FAILED).
# A cluster's control-plane deletion counts every poll that finds something left (backoff 1, 2,
# 4 ... 60 s): 12 is about 6 minutes, what Cluster API takes to remove a bare-metal cluster.
NVKE_MAX_DELETE_ATTEMPTS = env.int("NVKE_MAX_DELETE_ATTEMPTS", default=12)
# Node creation: retryable provider errors and placement contention are retried with backoff
# (jittered, 0.5 s doubling to 30 s) for this long, then the pool goes ERROR saying why.
NVKE_PROVIDER_RETRY_DEADLINE_S = env.float("NVKE_PROVIDER_RETRY_DEADLINE_S", default=600.0)
# Default quota of a new tenant (operators change it per tenant: PUT /api/v1/quotas/{tenant}).
NVKE_DEFAULT_MAX_CLUSTERS = env.int("NVKE_DEFAULT_MAX_CLUSTERS", default=20)
NVKE_DEFAULT_MAX_NODES = env.int("NVKE_DEFAULT_MAX_NODES", default=200)
NVKE_DEFAULT_MAX_GPUS_PER_MODEL = env.int("NVKE_DEFAULT_MAX_GPUS_PER_MODEL", default=512)
# Agent: bootstrap tokens expire after this long; a host silent this long becomes NOT_READY.
NVKE_BOOTSTRAP_TOKEN_TTL = timedelta(hours=env.float("NVKE_BOOTSTRAP_TOKEN_TTL_HOURS", default=24))
NVKE_AGENT_REPORT_INTERVAL_S = env.int("NVKE_AGENT_REPORT_INTERVAL_S", default=10)
NVKE_HOST_HEARTBEAT_TIMEOUT_S = env.int("NVKE_HOST_HEARTBEAT_TIMEOUT_S", default=120)
# Autoscaling by measured GPU utilization (see nodepools/autoscaling.py).
NVKE_AUTOSCALE_WINDOW_S = env.int("NVKE_AUTOSCALE_WINDOW_S", default=600)
NVKE_AUTOSCALE_UP_PCT = env.float("NVKE_AUTOSCALE_UP_PCT", default=80.0)
NVKE_AUTOSCALE_DOWN_PCT = env.float("NVKE_AUTOSCALE_DOWN_PCT", default=20.0)
# Scale-down waits this long for pods that block a node's drain, then evicts them.
NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S = env.int("NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S", default=600)
# Host drains: pods blocking a moved node's drain are waited for this long, then the move pauses
# on that node until the operator drains the host again with force (nodepools/host_moves.py).
NVKE_HOST_DRAIN_TIMEOUT_S = env.int("NVKE_HOST_DRAIN_TIMEOUT_S", default=600)
# Defragmentation (nodepools/defrag.py): the expected time of one node move (its disruption in
# GPU-hours = the node's GPUs x this), and how long one step may take before the run fails.
NVKE_DEFRAG_MOVE_MINUTES = env.float("NVKE_DEFRAG_MOVE_MINUTES", default=15.0)
NVKE_DEFRAG_STEP_TIMEOUT_S = env.int("NVKE_DEFRAG_STEP_TIMEOUT_S", default=3600)
# Auto-repair: a node NOT_READY this long is replaced (see nodepools/repair.py).
NVKE_NODE_REPAIR_TIMEOUT_S = env.int("NVKE_NODE_REPAIR_TIMEOUT_S", default=300)
# Samples: retention of raw rows, and how far from "now" a sample timestamp may be.
NVKE_SAMPLE_RETENTION_DAYS = env.int("NVKE_SAMPLE_RETENTION_DAYS", default=14)
NVKE_SAMPLE_MAX_FUTURE_S = env.int("NVKE_SAMPLE_MAX_FUTURE_S", default=300)

# Structured JSON logs (structlog through the stdlib logging tree, so Django's, Celery's and
# our own records come out alike); request_id follows a request into the tasks it causes
# (django-structlog's Celery integration). LOG_FORMAT=console for human-readable dev output.
LOG_LEVEL = env("LOG_LEVEL", default="INFO")
_pre_chain = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": structlog.stdlib.ProcessorFormatter,
            # exc_info of stdlib records (Celery's, Django's) becomes an "exception" string
            # with the whole traceback; without format_exc_info it would be a repr
            "processors": [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
            "foreign_pre_chain": _pre_chain,
        },
        "console": {
            "()": structlog.stdlib.ProcessorFormatter,
            "processor": structlog.dev.ConsoleRenderer(colors=False),
            "foreign_pre_chain": _pre_chain,
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": env("LOG_FORMAT", default="json"),
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.request": {"level": "ERROR"}},
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

# ---------------------------------------------------------------- integrations (issue #16)
# Seconds a client should wait before polling an Operation (``Retry-After`` on 202).
NVKE_OPERATION_RETRY_AFTER_S = env.int("NVKE_OPERATION_RETRY_AFTER_S", default=2)
# Webhooks (webhooks/): targets the operator allows, retry backoff and the delivery deadline.
NVKE_WEBHOOK_ALLOW_HTTP = env.bool("NVKE_WEBHOOK_ALLOW_HTTP", default=False)
NVKE_WEBHOOK_ALLOWED_NETWORKS = env.list("NVKE_WEBHOOK_ALLOWED_NETWORKS", default=[])
NVKE_WEBHOOK_BACKOFF_S = env.float("NVKE_WEBHOOK_BACKOFF_S", default=5.0)
NVKE_WEBHOOK_BACKOFF_MAX_S = env.float("NVKE_WEBHOOK_BACKOFF_MAX_S", default=3600.0)
NVKE_WEBHOOK_DEADLINE_S = env.int("NVKE_WEBHOOK_DEADLINE_S", default=86400)

# Capacity reservations (reservations/): bounds of what a client may ask for, the default
# announcement lead before a reservation's end, and the longest calendar window.
NVKE_RESERVATION_MAX_GPUS = env.int("NVKE_RESERVATION_MAX_GPUS", default=4096)
NVKE_RESERVATION_MIN_S = env.int("NVKE_RESERVATION_MIN_S", default=3600)
NVKE_RESERVATION_MAX_DAYS = env.int("NVKE_RESERVATION_MAX_DAYS", default=366)
NVKE_RESERVATION_MAX_LEAD_DAYS = env.int("NVKE_RESERVATION_MAX_LEAD_DAYS", default=365)
NVKE_RESERVATION_NOTICE_LEAD_S = env.int("NVKE_RESERVATION_NOTICE_LEAD_S", default=86400)
NVKE_RESERVATION_CALENDAR_MAX_DAYS = env.int("NVKE_RESERVATION_CALENDAR_MAX_DAYS", default=92)
NVKE_WEBHOOK_TIMEOUT_S = env.float("NVKE_WEBHOOK_TIMEOUT_S", default=10.0)
# /metrics and /admin/ only on connections accepted on this port when set (gunicorn binds it
# beside the public one; nvke/internal_port.py; the Helm chart: 9000). Unset: every port.
NVKE_INTERNAL_PORT = env.int("NVKE_INTERNAL_PORT", default=0)
