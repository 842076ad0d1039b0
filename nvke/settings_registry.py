"""Every environment variable NVKE reads, declared once: name, type, default, unit, what it
does and who sets it.

Code reads a variable only through :func:`read` (or, for Django settings, through
``django.conf.settings``, which ``nvke/settings.py`` fills from here), never through
``os.environ`` itself: ``tests/test_settings_registry.py`` intercepts environment reads at run
time and fails on an ``NVKE_*`` name (or a name read by NVKE's own code) that is not declared
below. The configuration reference (``docs/reference/configuration.md``) is generated from
:data:`SETTINGS` when the docs are built (``docs/hooks.py``), so it cannot go stale.

Besides ``NVKE_*``, the standard variables NVKE's own code reads (``DATABASE_URL``,
``REDIS_URL``, ``SECRET_KEY``, ``PORT``, ``LOG_LEVEL``, ``CELERY_*`` …) are declared too, so the
reference lists everything an operator can set; variables read only by libraries
(``OTEL_EXPORTER_*``, ``HTTPS_PROXY`` …) are those libraries' business.

This module imports nothing from Django or the apps: the agent-facing runner, gunicorn's
configuration and ``make run`` read it before Django is set up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Literal

import environ

Kind = Literal["str", "int", "float", "bool", "list", "json"]
Audience = Literal["operator", "developer", "tenant"]

#: the sections of the reference page, in order
SECTIONS = (
    "Core services",
    "Security",
    "API",
    "Tasks and beat",
    "Fleet and agents",
    "Node pools",
    "Providers",
    "Simulated infrastructure",
    "Cluster API provider",
    "Quotas and reservations",
    "Billing",
    "Webhooks",
    "Web server and observability",
    "make run",
    "Tests and benchmarks",
)


@dataclass(frozen=True)
class Setting:
    """One environment variable.

    ``kind`` is how the text is parsed (``bool``: 1/true/yes/on; ``list``: comma-separated;
    ``json``: a JSON document); ``default`` is the value when the variable is unset or empty,
    already parsed; ``unit`` is the unit of a number ("s", "days" …, "" for none); ``audience``
    says who sets it: an ``operator`` running NVKE, a ``developer`` working on it (tests, local
    runs), or a ``tenant`` (none today: tenants configure through the API).
    """

    name: str
    kind: Kind
    default: Any
    help: str
    section: str
    audience: Audience = "operator"
    unit: str = ""
    #: a Django setting of the same name is made from it (``nvke/settings.py``)
    django: bool = True


def _s(
    name: str,
    kind: Kind,
    default: Any,
    help: str,
    section: str,
    *,
    audience: Audience = "operator",
    unit: str = "",
    django: bool | None = None,
) -> Setting:
    return Setting(
        name=name,
        kind=kind,
        default=default,
        help=" ".join(help.split()),
        section=section,
        audience=audience,
        unit=unit,
        django=name.startswith("NVKE_") if django is None else django,
    )


CORE = "Core services"
SEC = "Security"
API = "API"
TASKS = "Tasks and beat"
FLEET = "Fleet and agents"
POOLS = "Node pools"
PROV = "Providers"
SIM = "Simulated infrastructure"
CAPI = "Cluster API provider"
QUOTA = "Quotas and reservations"
BILL = "Billing"
HOOKS = "Webhooks"
WEB = "Web server and observability"
RUN = "make run"
TESTS = "Tests and benchmarks"
DEV: Audience = "developer"

SETTINGS: tuple[Setting, ...] = (
    # ------------------------------------------------------------------ core services
    _s(
        "DATABASE_URL",
        "str",
        "postgres://postgres@127.0.0.1:5432/nvke",
        "PostgreSQL to use (PostgreSQL only). Unset under `make run` / `make test`: they start "
        "an embedded PostgreSQL and set it.",
        CORE,
    ),
    _s(
        "DB_CONN_MAX_AGE",
        "int",
        60,
        "Seconds a database connection is kept for reuse.",
        CORE,
        unit="s",
    ),
    _s(
        "TEST_DATABASE_NAME",
        "str",
        "test_nvke",
        "Name of the database the tests create.",
        CORE,
        audience=DEV,
    ),
    _s(
        "REDIS_URL",
        "str",
        "redis://127.0.0.1:6379/0",
        "Redis for the cache, the throttles, beat's schedule and (unless CELERY_BROKER_URL is "
        "set) the Celery broker. Unset under `make run` / `make test`: an embedded Redis.",
        CORE,
    ),
    _s("CELERY_BROKER_URL", "str", "", "The Celery broker (empty: REDIS_URL).", CORE),
    _s(
        "NVKE_DATA_DIR",
        "str",
        ".nvke",
        "The local data folder of `make run` (embedded PostgreSQL and Redis, keys, simulated "
        "hosts' state files); relative to the repository.",
        CORE,
        audience=DEV,
    ),
    _s(
        "DJANGO_SETTINGS_MODULE",
        "str",
        "nvke.settings",
        "Django's settings module (set by manage.py, the Celery app and wsgi).",
        CORE,
        audience=DEV,
    ),
    _s(
        "STATIC_ROOT",
        "str",
        "",
        "Where `collectstatic` puts the portal's static files (empty: ./staticfiles).",
        CORE,
    ),
    _s(
        "EMAIL_URL",
        "str",
        "",
        "Mail server for password-reset mails as django-environ reads it "
        "(smtp+tls://user:pass@host:587; filemail:///path/dir writes each mail to a file "
        "there). Required with DEBUG off (nvke.E005): unset, NVKE refuses to start, and "
        "consolemail:// (mail, reset links included, printed to the log) is refused too; "
        "NVKE_ALLOW_INSECURE_DEFAULTS=1 lifts that, and an unset one then sends nothing. With "
        "DEBUG on, unset prints mail to the console. `make run` sets "
        "filemail:///<data dir>/mail.",
        CORE,
    ),
    _s("DEFAULT_FROM_EMAIL", "str", "nvke@localhost", "Sender of NVKE's mails.", CORE),
    # ------------------------------------------------------------------ security
    _s(
        "SECRET_KEY",
        "str",
        "nvke-insecure-dev-key-change-me",
        "Django's secret key. With DEBUG off NVKE refuses to start on the default "
        "(see NVKE_ALLOW_INSECURE_DEFAULTS).",
        SEC,
    ),
    _s(
        "NVKE_SECRET_KEYS",
        "list",
        [],
        "Fernet keys that encrypt secrets at rest (kubeconfigs), newest first: add a new key "
        "in front, run `manage.py rotate_secrets`, then drop the old one. Empty: derived from "
        "SECRET_KEY (development only).",
        SEC,
    ),
    _s(
        "NVKE_ALLOW_INSECURE_DEFAULTS",
        "bool",
        False,
        "Start with the default SECRET_KEY and a Fernet key derived from it although DEBUG is "
        "off. `make run` and the test suite set it; never in production.",
        SEC,
        audience=DEV,
    ),
    _s("DEBUG", "bool", False, "Django's debug mode (development only).", SEC, audience=DEV),
    _s(
        "ALLOWED_HOSTS",
        "list",
        [],
        "Host names the web server answers to, besides NVKE_PUBLIC_URL's host, NVKE_POD_IP and "
        "the loopback names. `*` is refused with DEBUG off, whatever "
        "NVKE_ALLOW_INSECURE_DEFAULTS says (a request's Host must never pick a link's origin).",
        SEC,
    ),
    _s(
        "NVKE_PUBLIC_URL",
        "str",
        "",
        "The portal's public origin, https://host[:port]. Links in mail (password resets, "
        "invitations) are built from it, never from a request's Host. Required with DEBUG off.",
        SEC,
    ),
    _s(
        "NVKE_POD_IP",
        "str",
        "",
        "The pod's own address (the Helm chart sets it from the downward API), answered as a "
        "host name so kubelet probes and Prometheus scrapes by IP pass ALLOWED_HOSTS.",
        SEC,
    ),
    _s(
        "NVKE_MAX_API_KEYS_PER_TENANT",
        "int",
        50,
        "API keys a tenant may hold that are neither revoked nor expired; the 409 at the cap "
        "names this setting.",
        SEC,
        unit="count",
    ),
    _s(
        "CSRF_TRUSTED_ORIGINS",
        "list",
        [],
        "The portal's origins behind a TLS-terminating proxy (https://nvke.example.com), so "
        "logins and forms pass the CSRF check.",
        SEC,
    ),
    _s(
        "NVKE_BEHIND_TLS_PROXY",
        "bool",
        False,
        "NVKE runs behind a TLS-terminating ingress: trust X-Forwarded-Proto, secure cookies, "
        "HSTS and redirects to HTTPS.",
        SEC,
    ),
    _s(
        "SECURE_HSTS_SECONDS",
        "int",
        31536000,
        "HSTS max-age (only with NVKE_BEHIND_TLS_PROXY).",
        SEC,
        unit="s",
    ),
    _s(
        "SECURE_HSTS_PRELOAD",
        "bool",
        True,
        "HSTS preload flag (only with NVKE_BEHIND_TLS_PROXY).",
        SEC,
    ),
    _s(
        "SECURE_SSL_REDIRECT",
        "bool",
        True,
        "Redirect plain HTTP to HTTPS, probes and /metrics excepted (only with "
        "NVKE_BEHIND_TLS_PROXY).",
        SEC,
    ),
    _s(
        "NVKE_LOGIN_LOCKOUT",
        "bool",
        True,
        "Lock a username+IP pair out after repeated failed logins (django-axes).",
        SEC,
    ),
    _s(
        "NVKE_LOGIN_FAILURE_LIMIT",
        "int",
        5,
        "Failed logins of one username from one IP before that pair is locked.",
        SEC,
    ),
    _s(
        "NVKE_LOGIN_COOLOFF_MINUTES",
        "float",
        15.0,
        "How long a locked username+IP pair stays locked (`manage.py axes_reset_username` "
        "unlocks sooner).",
        SEC,
        unit="min",
    ),
    _s(
        "NVKE_PASSWORD_MIN_LENGTH",
        "int",
        10,
        "Shortest password accepted anywhere (portal, API, commands).",
        SEC,
        unit="characters",
    ),
    _s(
        "NVKE_PASSWORD_RESET_TIMEOUT_S",
        "int",
        3 * 86400,
        "How long a password-reset link stays valid.",
        SEC,
        unit="s",
    ),
    _s(
        "NVKE_INTERNAL_PORT",
        "int",
        0,
        "/metrics and /admin/ answer only on connections accepted on this port (gunicorn "
        "binds it beside the public one; the Helm chart uses 9000). 0: on every port.",
        SEC,
    ),
    # ------------------------------------------------------------------ API
    _s(
        "NVKE_THROTTLE_PRINCIPAL",
        "str",
        "6000/min",
        "Request rate allowed per API key or portal user (DRF rate: N/s, N/min, N/hour).",
        API,
    ),
    _s(
        "NVKE_THROTTLE_TENANT",
        "str",
        "12000/min",
        "Request rate allowed per tenant, all its keys and users together.",
        API,
    ),
    _s(
        "NVKE_THROTTLE_REDIS_TIMEOUT_S",
        "float",
        0.25,
        "A throttle check waits this long for Redis, then lets the request through.",
        API,
        unit="s",
    ),
    _s(
        "NVKE_OPERATION_RETRY_AFTER_S",
        "int",
        2,
        "Retry-After sent with a 202: how long a client should wait before polling the Operation.",
        API,
        unit="s",
    ),
    _s(
        "DATA_UPLOAD_MAX_MEMORY_SIZE",
        "int",
        16 * 1024 * 1024,
        "Largest request body accepted.",
        API,
        unit="bytes",
    ),
    # ------------------------------------------------------------------ tasks and beat
    _s(
        "NVKE_RESYNC_INTERVAL_S",
        "float",
        15.0,
        "Period of the resync that re-enqueues every unconverged cluster and node pool: a lost "
        "message delays convergence by at most this.",
        TASKS,
        unit="s",
    ),
    _s(
        "NVKE_HEARTBEAT_INTERVAL_S",
        "float",
        10.0,
        "How often workers and beat write their heartbeat (nvke_heartbeat_age_seconds).",
        TASKS,
        unit="s",
    ),
    _s(
        "CELERY_VISIBILITY_TIMEOUT",
        "int",
        120,
        "A message taken by a worker that died is delivered again after this long.",
        TASKS,
        unit="s",
    ),
    _s(
        "CELERY_UNACKED_RESTORE_INTERVAL_S",
        "int",
        5,
        "How often a worker looks for such messages.",
        TASKS,
        unit="s",
    ),
    _s(
        "CELERY_BROKER_CONNECTION_TIMEOUT",
        "float",
        2.0,
        "Connection timeout to the broker.",
        TASKS,
        unit="s",
    ),
    _s(
        "CELERY_REDBEAT_KEY_PREFIX",
        "str",
        "nvke:redbeat:",
        "Prefix of beat's keys in Redis.",
        TASKS,
    ),
    _s(
        "CELERY_REDBEAT_LOCK_TIMEOUT",
        "int",
        60,
        "Beat's lock in Redis: another beat replica takes over within this long.",
        TASKS,
        unit="s",
    ),
    _s("CELERY_TASK_TIME_LIMIT", "int", 300, "Hard time limit of one task.", TASKS, unit="s"),
    _s("CELERY_TASK_SOFT_TIME_LIMIT", "int", 240, "Soft time limit of one task.", TASKS, unit="s"),
    # ------------------------------------------------------------------ fleet and agents
    _s(
        "NVKE_BOOTSTRAP_TOKEN_TTL_HOURS",
        "float",
        24.0,
        "A host's bootstrap token expires this long after it was issued.",
        FLEET,
        unit="h",
    ),
    _s(
        "NVKE_AGENT_REPORT_INTERVAL_S",
        "int",
        10,
        "The report interval the API asks agents for.",
        FLEET,
        unit="s",
    ),
    _s(
        "NVKE_BREAKER_SHARE",
        "float",
        0.05,
        "Circuit breaker: automation (auto-repair) may cordon at most max(1, floor(share x N)) "
        "of a GPU model's hosts, or of one node pool's nodes, within NVKE_BREAKER_WINDOW_S; "
        "beyond it automation pauses until an operator resumes it.",
        FLEET,
    ),
    _s(
        "NVKE_BREAKER_WINDOW_S",
        "int",
        3600,
        "The circuit breaker's sliding window: cordons older than this no longer count.",
        FLEET,
        unit="s",
    ),
    _s(
        "NVKE_HEALTH_ESCALATION_WINDOW_S",
        "int",
        86400,
        "A catalog-default health rule that fires again on the same GPU within this long takes "
        "the next step of its action ladder (GPU reset -> node reboot -> replace -> hardware "
        "ticket); operators set it per rule.",
        FLEET,
        unit="s",
    ),
    _s(
        "NVKE_HOST_HEARTBEAT_TIMEOUT_S",
        "float",
        120.0,
        "A registered host without an agent report for this long becomes NOT_READY.",
        FLEET,
        unit="s",
    ),
    _s(
        "NVKE_AGENT_CLOCK_SKEW_WARNING_S",
        "float",
        60.0,
        "An agent whose clock is off by more than this gets a host warning.",
        FLEET,
        unit="s",
    ),
    _s(
        "NVKE_SAMPLE_RETENTION_DAYS",
        "int",
        14,
        "Raw GPU samples are kept this long (whole daily partitions are dropped).",
        FLEET,
        unit="days",
    ),
    _s(
        "NVKE_SAMPLE_MAX_FUTURE_S",
        "float",
        300.0,
        "Samples stamped further than this ahead of the server's clock are rejected.",
        FLEET,
        unit="s",
    ),
    _s(
        "NVKE_ROLLUP_1M_RETENTION_DAYS",
        "int",
        35,
        "1-minute rollups are kept this long.",
        FLEET,
        unit="days",
    ),
    _s(
        "NVKE_ROLLUP_1H_RETENTION_DAYS",
        "int",
        400,
        "1-hour rollups are kept this long.",
        FLEET,
        unit="days",
    ),
    _s(
        "NVKE_MAX_GPU_POWER_W",
        "float",
        2000.0,
        "Energy-counter jumps implying more than this power between two readings are "
        "discarded as implausible.",
        FLEET,
        unit="W",
    ),
    _s(
        "NVKE_SCRUB_TIMEOUT_S",
        "float",
        1800.0,
        "A GPU scrub the agent has not confirmed after this long is marked FAILED.",
        FLEET,
        unit="s",
    ),
    # ------------------------------------------------------------------ node pools
    _s(
        "NVKE_OBSERVED_STATE_TIMEOUT_S",
        "float",
        300.0,
        "How long a node waits for its host's agent to report what it must run (MIG layout, "
        "driver …) before the operation fails or rolls back.",
        POOLS,
        unit="s",
    ),
    _s(
        "NVKE_NODE_REPAIR_TIMEOUT_S",
        "int",
        300,
        "A node NOT_READY this long is repaired (auto-repair).",
        POOLS,
        unit="s",
    ),
    _s(
        "NVKE_AUTOSCALE_WINDOW_S",
        "int",
        600,
        "Window of measured GPU utilization the autoscaler averages.",
        POOLS,
        unit="s",
    ),
    _s(
        "NVKE_AUTOSCALE_UP_PCT",
        "float",
        80.0,
        "Average GPU utilization above which an autoscaled pool grows.",
        POOLS,
        unit="%",
    ),
    _s(
        "NVKE_AUTOSCALE_DOWN_PCT",
        "float",
        20.0,
        "Average GPU utilization below which an autoscaled pool shrinks.",
        POOLS,
        unit="%",
    ),
    _s(
        "NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S",
        "int",
        600,
        "Scale-down waits this long for pods blocking a node's drain, then evicts them.",
        POOLS,
        unit="s",
    ),
    _s(
        "NVKE_HOST_DRAIN_TIMEOUT_S",
        "int",
        600,
        "Host drains wait this long for pods blocking a moved node's drain, then the move "
        "pauses on that node until the operator drains the host again with force.",
        POOLS,
        unit="s",
    ),
    _s(
        "NVKE_CHECKPOINT_DEADLINE_MAX_S",
        "int",
        3600,
        "The longest checkpoint deadline a tenant may give a node pool's disruption hook: a "
        "planned disruption (upgrade, isolation change, defragmentation move, host "
        "maintenance, scale-down) of a node waits at most this long for the tenant's ack "
        "(a hook without a deadline of its own waits 600 s, or this if it is less).",
        POOLS,
        unit="s",
    ),
    _s(
        "NVKE_DEFRAG_MOVE_MINUTES",
        "float",
        15.0,
        "Expected time of one defragmentation node move (its cost in GPU-hours is the node's "
        "GPUs times this).",
        POOLS,
        unit="min",
    ),
    _s(
        "NVKE_DEFRAG_STEP_TIMEOUT_S",
        "int",
        3600,
        "A defragmentation step taking longer fails the run.",
        POOLS,
        unit="s",
    ),
    # ------------------------------------------------------------------ providers
    _s(
        "NVKE_DEFAULT_PROVIDER",
        "str",
        "hosted",
        "Provider of a cluster created without one: hosted (NVKE runs each tenant's control "
        "plane: clusters/hosted/), clusterapi, or simulated (no Kubernetes at all; a test tool, "
        "the test suite's default).",
        PROV,
    ),
    _s(
        "NVKE_CONTROL_PLANES_DIR",
        "str",
        "",
        "Folder of the shared etcd and each hosted control plane's files (certificates 0600, "
        "logs); empty: NVKE_DATA_DIR/control-planes.",
        PROV,
    ),
    _s(
        "NVKE_HOSTED_PORT_RANGE",
        "str",
        "16400-16999",
        "kube-apiserver ports of hosted control planes are allocated from this range "
        "(first-last, inclusive) and kept per cluster.",
        PROV,
    ),
    _s(
        "NVKE_HOSTED_APISERVER_GOGC",
        "int",
        25,
        "GOGC of every hosted kube-apiserver (under make run and in the rendered Deployments): "
        "how far, in percent, Go lets its heap grow over the live heap before collecting. A "
        "small cluster's apiserver holds about 85 MB live; Go's default (100) kept it near "
        "190 MiB anonymous resident, 25 near 130 MiB, at no measurable idle CPU. Raise it "
        "(100: Go's default) where tenants' API traffic is heavy and CPU matters more than "
        "memory; 1 or more.",
        PROV,
        unit="%",
    ),
    _s(
        "NVKE_K8S_BIN_ROOT",
        "str",
        "",
        "Folder of the Kubernetes binaries built by deploy/k8s/build.sh (empty: "
        "~/.cache/nvke/k8s).",
        PROV,
    ),
    _s(
        "NVKE_KWOK_NODE_LEASE_S",
        "int",
        40,
        "Lease duration of the Nodes KWOK keeps alive for simulated hosts (one KWOK per hosted "
        "cluster); KWOK renews each Lease every quarter of it (a kubelet's default: 40 s).",
        PROV,
        unit="s",
    ),
    _s(
        "NVKE_MAX_DELETE_ATTEMPTS",
        "int",
        12,
        "A reconciler gives up deleting after this many failed attempts (DELETE_FAILED); "
        "with the 1-60 s backoff, 12 is about 6 minutes.",
        PROV,
    ),
    _s(
        "NVKE_PROVIDER_RETRY_DEADLINE_S",
        "float",
        600.0,
        "Retryable provider errors and placement contention are retried (0.5 s doubling to "
        "30 s, jittered) for this long, then the pool goes ERROR saying why.",
        PROV,
        unit="s",
    ),
    # ------------------------------------------------------------------ simulated
    _s(
        "NVKE_SIMULATED_CONTROL_PLANE_DELAY_S",
        "float",
        2.0,
        "Seconds a simulated control plane takes to become ready.",
        SIM,
        audience=DEV,
        unit="s",
    ),
    _s(
        "NVKE_SIMULATED_NODE_DELAY_S",
        "float",
        2.0,
        "Seconds a simulated node takes to become ready.",
        SIM,
        audience=DEV,
        unit="s",
    ),
    _s(
        "NVKE_SIMULATED_CALL_DELAY_S",
        "float",
        0.0,
        "Seconds each simulated machine-creation call takes.",
        SIM,
        audience=DEV,
        unit="s",
    ),
    _s(
        "NVKE_SIMULATED_CALL_DELAY_MAX_S",
        "float",
        0.0,
        "When above NVKE_SIMULATED_CALL_DELAY_S, each call takes a uniformly random time "
        "between the two (the fault suite and the reconcile benchmark use 0.5-3 s).",
        SIM,
        audience=DEV,
        unit="s",
    ),
    _s(
        "NVKE_SIMULATED_HOSTS_DIR",
        "str",
        "",
        "Folder of the simulated hosts' hardware state files (empty: "
        "NVKE_DATA_DIR/simulated-hosts).",
        SIM,
        audience=DEV,
    ),
    _s(
        "NVKE_SIMULATED_IN_PROCESS_AGENT",
        "bool",
        True,
        "A simulated host with no agent registered gets its report in-process (the same "
        "source and ingestion as a real agent).",
        SIM,
        audience=DEV,
    ),
    _s(
        "NVKE_SIMULATED_CONTROL_PLANE_OUTAGE",
        "list",
        [],
        "Cluster names whose simulated control plane is unreachable (* = all).",
        SIM,
        audience=DEV,
    ),
    _s(
        "NVKE_SIMULATED_FAILING_GPUS",
        "json",
        {},
        'GPUs whose simulated MIG configuration fails: {"GPU-uuid": ["config name", ...]}.',
        SIM,
        audience=DEV,
    ),
    _s(
        "NVKE_SIMULATED_FAILING_UPGRADES",
        "list",
        [],
        "GPU UUIDs that lose NVML after a simulated driver install.",
        SIM,
        audience=DEV,
    ),
    # ------------------------------------------------------------------ Cluster API
    _s(
        "NVKE_CLUSTERAPI_KUBECONFIG",
        "str",
        "",
        "Kubeconfig file of the management cluster (empty: the clusterapi provider fails its "
        "calls with clusterapi_not_configured).",
        CAPI,
    ),
    _s(
        "NVKE_CLUSTERAPI_NAMESPACE",
        "str",
        "nvke",
        "Namespace of NVKE's Cluster API objects in the management cluster.",
        CAPI,
    ),
    _s(
        "NVKE_CLUSTERAPI_INFRASTRUCTURE",
        "str",
        "Metal3",
        "Infrastructure provider the objects reference: a kind prefix (Metal3 -> "
        "Metal3Cluster, Metal3MachineTemplate) or <api group>/<prefix>.",
        CAPI,
    ),
    _s(
        "NVKE_CLUSTERAPI_CONTROL_PLANE_REPLICAS",
        "int",
        3,
        "Control-plane machines per cluster (1, 3 or 5).",
        CAPI,
    ),
    _s(
        "NVKE_CLUSTERAPI_MACHINE_SPEC",
        "json",
        {},
        "JSON merged into each node pool's machine template spec (the site's image, "
        "dataTemplate …); NVKE adds the hostSelector.",
        CAPI,
    ),
    _s(
        "NVKE_CLUSTERAPI_WORKLOAD_KUBECONFIG",
        "str",
        "",
        "Test beds only: one kubeconfig file that plays every workload cluster (empty: "
        "each cluster's <cluster>-kubeconfig Secret, as in production).",
        CAPI,
        audience=DEV,
    ),
    _s(
        "NVKE_CLUSTERAPI_SIMULATED_NODES",
        "bool",
        False,
        "Test beds only: the machines are simulated (CAPD's in-memory backend), so no kubelet "
        "or GPU Operator publishes their Nodes; NVKE writes each Machine's Node into the "
        "workload API from its host agent's latest report, as for hosted clusters, and a KWOK "
        "against that API keeps them Ready (off: real machines publish their own Nodes).",
        CAPI,
        audience=DEV,
    ),
    # ------------------------------------------------------------------ quotas, reservations
    _s(
        "NVKE_DEFAULT_MAX_CLUSTERS",
        "int",
        20,
        "A new tenant's cluster quota (operators change it per tenant).",
        QUOTA,
    ),
    _s("NVKE_DEFAULT_MAX_NODES", "int", 200, "A new tenant's node quota.", QUOTA),
    _s(
        "NVKE_DEFAULT_MAX_GPUS_PER_MODEL",
        "int",
        512,
        "A new tenant's GPU quota per GPU model.",
        QUOTA,
    ),
    _s("NVKE_RESERVATION_MAX_GPUS", "int", 4096, "Most GPUs one reservation may hold.", QUOTA),
    _s("NVKE_RESERVATION_MIN_S", "int", 3600, "Shortest reservation.", QUOTA, unit="s"),
    _s("NVKE_RESERVATION_MAX_DAYS", "int", 366, "Longest reservation.", QUOTA, unit="days"),
    _s(
        "NVKE_RESERVATION_MAX_LEAD_DAYS",
        "int",
        365,
        "How far ahead a reservation may start.",
        QUOTA,
        unit="days",
    ),
    _s(
        "NVKE_RESERVATION_NOTICE_LEAD_S",
        "int",
        86400,
        "Default announcement lead before a reservation ends.",
        QUOTA,
        unit="s",
    ),
    _s(
        "NVKE_RESERVATION_CALENDAR_MAX_DAYS",
        "int",
        92,
        "Longest window the capacity calendar answers for.",
        QUOTA,
        unit="days",
    ),
    # ------------------------------------------------------------------ billing
    _s(
        "NVKE_BILLING_AGGREGATE_INTERVAL_S",
        "float",
        300.0,
        "Period of the usage refresh (every tenant's open usage is recomputed).",
        BILL,
        unit="s",
    ),
    _s(
        "NVKE_BILLING_INVOICE_INTERVAL_S",
        "float",
        3600.0,
        "Period of the invoice run (DRAFT invoices of the previous and current month).",
        BILL,
        unit="s",
    ),
    # ------------------------------------------------------------------ webhooks
    _s(
        "NVKE_WEBHOOK_ALLOW_HTTP",
        "bool",
        False,
        "Accept http:// webhook endpoints (https only otherwise).",
        HOOKS,
    ),
    _s(
        "NVKE_WEBHOOK_ALLOWED_NETWORKS",
        "list",
        [],
        "Private networks (CIDR) webhook endpoints may resolve to, e.g. 127.0.0.0/8 for a "
        "local receiver; public addresses are always allowed.",
        HOOKS,
    ),
    _s(
        "NVKE_WEBHOOK_CONNECT_TIMEOUT_S",
        "float",
        3.0,
        "Connect timeout of one delivery attempt (webhooks/transport.py).",
        HOOKS,
        unit="s",
    ),
    _s(
        "NVKE_WEBHOOK_TIMEOUT_S",
        "float",
        5.0,
        "Read timeout of one delivery attempt: the longest wait for each read of the response.",
        HOOKS,
        unit="s",
    ),
    _s(
        "NVKE_WEBHOOK_ATTEMPT_TIMEOUT_S",
        "float",
        10.0,
        "Whole-attempt bound of one delivery (connect, send, read), so a trickling endpoint "
        "cannot hold a worker slot longer.",
        HOOKS,
        unit="s",
    ),
    _s(
        "NVKE_WEBHOOK_TENANT_CONCURRENCY",
        "int",
        2,
        "Delivery attempts of one tenant running at once in the webhooks worker (its fair "
        "share; webhooks/tasks.py).",
        HOOKS,
        unit="count",
    ),
    _s(
        "NVKE_WEBHOOK_BUSY_RETRY_S",
        "float",
        1.0,
        "A delivery of a tenant at its share is tried again after this long, doubling per "
        "round up to NVKE_WEBHOOK_BUSY_RETRY_MAX_S.",
        HOOKS,
        unit="s",
    ),
    _s(
        "NVKE_WEBHOOK_BUSY_RETRY_MAX_S",
        "float",
        10.0,
        "Longest wait of a delivery whose tenant is at its share.",
        HOOKS,
        unit="s",
    ),
    _s(
        "NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT",
        "int",
        20,
        "Webhook endpoints a tenant may hold; the 409 at the cap names this setting.",
        HOOKS,
        unit="count",
    ),
    _s(
        "NVKE_WEBHOOK_BACKOFF_S",
        "float",
        5.0,
        "First retry delay of a failed delivery.",
        HOOKS,
        unit="s",
    ),
    _s("NVKE_WEBHOOK_BACKOFF_MAX_S", "float", 3600.0, "Longest retry delay.", HOOKS, unit="s"),
    _s(
        "NVKE_WEBHOOK_DEADLINE_S",
        "int",
        86400,
        "A delivery still failing this long after the event is given up.",
        HOOKS,
        unit="s",
    ),
    # ------------------------------------------------------------------ web and observability
    _s("LOG_LEVEL", "str", "INFO", "Log level of every process.", WEB),
    _s("LOG_FORMAT", "str", "json", "json (one JSON object per line) or console.", WEB),
    _s(
        "GUNICORN_BIND",
        "str",
        "0.0.0.0:8000",
        "Addresses gunicorn listens on, space-separated.",
        WEB,
    ),
    _s("WEB_CONCURRENCY", "int", 4, "gunicorn worker processes.", WEB),
    _s("GUNICORN_THREADS", "int", 1, "Threads per gunicorn worker.", WEB),
    _s(
        "FORWARDED_ALLOW_IPS",
        "str",
        "127.0.0.1",
        "Proxies whose X-Forwarded-* headers gunicorn trusts.",
        WEB,
    ),
    _s(
        "PROMETHEUS_MULTIPROC_DIR",
        "str",
        "",
        "Folder of prometheus_client's multi-process files (set with several gunicorn "
        "workers or worker processes).",
        WEB,
    ),
    _s(
        "NVKE_WORKER_METRICS_PORT",
        "int",
        0,
        "A Celery worker serves /metrics on this port (0: not served).",
        WEB,
    ),
    _s("NVKE_PROCESS_NAME", "str", "", "The process label of the metrics (empty: pid-<pid>).", WEB),
    _s(
        "NVKE_TRACING",
        "bool",
        False,
        "Export OpenTelemetry traces (the otel extra; OTEL_EXPORTER_OTLP_* configure the "
        "exporter).",
        WEB,
    ),
    _s(
        "OTEL_SERVICE_NAME",
        "str",
        "",
        "Service name of the traces (empty: nvke-web, nvke-worker …).",
        WEB,
    ),
    # ------------------------------------------------------------------ make run
    _s(
        "PORT",
        "int",
        8000,
        "Port of `make run`'s web server on 127.0.0.1 (0: any free port).",
        RUN,
        audience=DEV,
    ),
    # ------------------------------------------------------------------ tests
    _s(
        "NVKE_FUZZ_EXAMPLES",
        "int",
        6,
        "Examples per operation and key of the schema fuzz test (`make fuzz`: 60).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_SOAK_OUTAGE_S",
        "float",
        30.0,
        "API outage of the soak test (`make soak`: 600).",
        TESTS,
        audience=DEV,
        unit="s",
        django=False,
    ),
    _s("NVKE_SOAK_AGENTS", "int", 5, "Agents of the soak test.", TESTS, audience=DEV, django=False),
    _s(
        "NVKE_BENCH_SIZE",
        "str",
        "full",
        "The size benchmarks run at: `full` (`make bench`: DESIGN's sizes and targets, judged) or "
        "`ci` (`make bench-ci`: every benchmark at a small size, targets printed, not judged).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_BENCH_PROFILE_DIR",
        "str",
        "",
        "A folder: the reconcile benchmark's Celery workers run under cProfile and write their "
        "profiles there, merged and printed after the table (empty: no profiling).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_BENCH_HOSTED_CLUSTERS",
        "int",
        0,
        "Hosted control planes the hosted benchmark creates and runs side by side (0: 20 under "
        "`make bench`, 3 under `make bench-ci`).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_BENCH_SCHEDULER_NODES",
        "int",
        0,
        "Simulated GPU nodes of the hosted scheduler benchmark's pool (and CPU nodes of its "
        "baseline); it places twice as many pods (0: 500 under `make bench`, 20 under "
        "`make bench-ci`).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_FAULT_CLUSTERS",
        "int",
        30,
        "Clusters of the fault suite.",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_FAULT_REDIS_OUTAGE_S",
        "float",
        10.0,
        "Redis outage of the fault suite (`make faults`: 60).",
        TESTS,
        audience=DEV,
        unit="s",
        django=False,
    ),
    _s(
        "NVKE_FAULT_PG_OUTAGE_S",
        "float",
        10.0,
        "PostgreSQL outage of the fault suite (`make faults`: 60).",
        TESTS,
        audience=DEV,
        unit="s",
        django=False,
    ),
    _s(
        "NVKE_FAULT_KILL_ROUNDS",
        "int",
        3,
        "Worker SIGKILLs of the fault suite (`make faults`: 10).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_FAULT_CONVERGE_S",
        "float",
        240.0,
        "How long the fault suite waits for convergence.",
        TESTS,
        audience=DEV,
        unit="s",
        django=False,
    ),
    _s(
        "NVKE_FAULT_SEED",
        "int",
        0,
        "Seed of the fault suite's random choices (0: a random seed, printed).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_QUOTA_RACE_SEED",
        "int",
        0,
        "Seed of the quota race test (0: a random seed, printed).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_UPDATE_GOLDEN",
        "bool",
        False,
        "Rewrite the golden files of the GPU-config tests instead of comparing.",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_SCREENSHOTS",
        "str",
        "",
        "Folder the portal screenshot test writes to (docs/screenshots refreshes the docs').",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_CHROMIUM",
        "str",
        "/usr/bin/chromium",
        "Chromium of the browser tests.",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_HELM",
        "str",
        "",
        "helm binary of the chart tests (empty: PATH, then the one `make helm` builds).",
        TESTS,
        audience=DEV,
        django=False,
    ),
    _s(
        "NVKE_CAPI_BIN_DIR",
        "str",
        "",
        "Folder of the Cluster API testbed binaries (empty: ~/.cache/nvke/capi-<hash>).",
        TESTS,
        audience=DEV,
        django=False,
    ),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}

_env = environ.Env()
_PARSERS = {
    "str": _env.str,
    "int": _env.int,
    "float": _env.float,
    "bool": _env.bool,
    "list": _env.list,
    "json": _env.json,
}


class UndeclaredSetting(KeyError):
    """A variable read through :func:`read` that :data:`SETTINGS` does not declare."""


def declared(name: str) -> Setting:
    """The declaration of ``name``; :class:`UndeclaredSetting` when there is none."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise UndeclaredSetting(
            f"{name} is not declared in nvke/settings_registry.py: declare it there"
        ) from None


def read(name: str) -> Any:
    """The value of ``name`` from the environment now, parsed by its declared kind; the
    declared default when the variable is unset or empty.

    Raises :class:`UndeclaredSetting` for an undeclared name and
    ``environ.ImproperlyConfigured`` / ``ValueError`` for text that does not parse (an
    ``int`` given ``abc``), naming the variable.
    """
    setting = declared(name)
    if not os.environ.get(name, "").strip():
        return _copy(setting.default)
    try:
        return _PARSERS[setting.kind](name)
    except (ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"{name}: not a valid {setting.kind}: {exc}") from exc


def django_settings() -> dict[str, Any]:
    """``{name: value}`` of every declared setting that becomes a Django setting."""
    return {s.name: read(s.name) for s in SETTINGS if s.django}


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value)) if isinstance(value, list | dict) else value
