"""Throttles per API key (principal) and per tenant: one atomic counter per fixed window in
Redis, failing open when Redis cannot be reached.

Rates come from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (env ``NVKE_THROTTLE_PRINCIPAL`` /
``NVKE_THROTTLE_TENANT``, DRF's ``"N/period"`` form). Each request costs one round trip: a Lua
script ``INCR``s the key of the current window (``throttle:<scope>:<ident>:<window start>``),
sets its expiry on the first hit and returns the count and the milliseconds left in the window,
whatever the traffic (DRF's ``SimpleRateThrottle`` stores every timestamp of the window and
rewrites the list on every request, so its cost grows with the rate). A fixed window lets a
client send up to twice the rate across a window boundary; that is the usual trade for an
O(1) counter and is well inside what the limits protect.

Over the rate: 429 problem+json with ``Retry-After`` (seconds to the end of the window).

Redis down (or slower than ``NVKE_THROTTLE_REDIS_TIMEOUT_S``): the request is **allowed**,
counted in ``nvke_throttle_fail_open_total{scope}`` and logged (at most once per
``_LOG_EVERY_S`` per process, so an outage does not flood the log). Throttling protects the
service from heavy callers; refusing every tenant because the counter store is away would turn
a Redis outage into a full API outage.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

import redis
from django.conf import settings
from prometheus_client import Counter
from rest_framework.throttling import BaseThrottle

log = logging.getLogger(__name__)

FAIL_OPEN = Counter(
    "nvke_throttle_fail_open",
    "Requests let through unthrottled because the throttle's Redis could not be reached",
    ["scope"],
)

# KEYS[1]: the window's counter; ARGV[1]: window length (ms). Returns {count, ms left}.
_INCR_WINDOW = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {n, ttl}
"""

_LOG_EVERY_S = 30.0
_lock = threading.Lock()
_client: redis.Redis | None = None
_script: Any = None
_last_logged = 0.0


def _redis() -> tuple[redis.Redis, Any]:
    """A process-wide client with short timeouts (a throttle must never hang a request)."""
    global _client, _script
    with _lock:
        if _client is None:
            timeout = float(getattr(settings, "NVKE_THROTTLE_REDIS_TIMEOUT_S", 0.25))
            _client = redis.Redis.from_url(
                settings.REDIS_URL,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry_on_timeout=False,
            )
            _script = _client.register_script(_INCR_WINDOW)
        return _client, _script


def reset_client() -> None:
    """Forget the client (tests that point ``REDIS_URL`` elsewhere)."""
    global _client, _script
    with _lock:
        _client, _script = None, None


def _fail_open(scope: str, exc: Exception) -> None:
    global _last_logged
    FAIL_OPEN.labels(scope).inc()
    now = time.monotonic()
    if now - _last_logged >= _LOG_EVERY_S:
        _last_logged = now
        log.warning("throttle %s fails open: Redis unavailable (%s)", scope, exc)


def parse_rate(rate: str | None) -> tuple[int, int]:
    """``"6000/min"`` -> ``(6000, 60)`` (requests, window in s), as DRF reads it; None -> off."""
    if not rate:
        return 0, 1
    num, period = rate.split("/")
    return int(num), {"s": 1, "m": 60, "h": 3600, "d": 86400}[period[0]]


class WindowRateThrottle(BaseThrottle):
    """A fixed-window counter per ``(scope, ident)``; subclasses say what ``ident`` is."""

    scope = ""

    def __init__(self) -> None:
        rate = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"][self.scope]
        self.num_requests, self.duration = parse_rate(rate)
        self._wait: float | None = None

    def ident_for(self, request: Any) -> str | None:
        raise NotImplementedError

    def allow_request(self, request: Any, view: Any) -> bool:
        ident = self.ident_for(request)
        if ident is None or not self.num_requests:
            return True
        window_ms = int(self.duration * 1000)
        start = int(time.time() * 1000) // window_ms
        key = f"nvke:throttle:{self.scope}:{ident}:{start}"
        try:
            _client, script = _redis()
            count, ttl_ms = script(keys=[key], args=[window_ms])
        except redis.RedisError as exc:
            _fail_open(self.scope, exc)
            return True
        if int(count) <= self.num_requests:
            return True
        self._wait = max(math.ceil(int(ttl_ms) / 1000), 1)
        return False

    def wait(self) -> float | None:
        return self._wait


class PrincipalRateThrottle(WindowRateThrottle):
    scope = "principal"

    def ident_for(self, request: Any) -> str | None:
        return getattr(request.user, "label", None) or None


class TenantRateThrottle(WindowRateThrottle):
    scope = "tenant"

    def ident_for(self, request: Any) -> str | None:
        tenant = getattr(request.user, "tenant", None)
        return str(tenant.pk) if tenant is not None else None
