"""Throttles per API key (principal) and per tenant: one atomic counter per fixed window in
Redis, failing open when Redis cannot be reached.

Rates come from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (env ``NVKE_THROTTLE_PRINCIPAL`` /
``NVKE_THROTTLE_TENANT``, DRF's ``"N/period"`` form). Each request costs one round trip for both
throttles: a Lua script ``INCR``s the key of the current window of each
(``throttle:<scope>:<ident>:<window start>``), sets its expiry on the first hit and returns
the count and the milliseconds left in the window, whatever the traffic (DRF's
``SimpleRateThrottle`` stores every timestamp of the window and rewrites the list on every
request, so its cost grows with the rate). A fixed window lets a
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

# KEYS[i]: a window's counter; ARGV[i]: its window length (ms). Returns {count, ms left} of
# each, flat: {count 1, ms left 1, count 2, ms left 2, ...}.
_INCR_WINDOW = """
local out = {}
for i, key in ipairs(KEYS) do
  local n = redis.call('INCR', key)
  if n == 1 then redis.call('PEXPIRE', key, ARGV[i]) end
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then redis.call('PEXPIRE', key, ARGV[i]); ttl = tonumber(ARGV[i]) end
  out[#out + 1] = n
  out[#out + 1] = ttl
end
return out
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
            timeout = float(settings.NVKE_THROTTLE_REDIS_TIMEOUT_S)
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

    def window_key(self, ident: str) -> tuple[str, int]:
        """``(counter key of the current window, window length in ms)``."""
        window_ms = int(self.duration * 1000)
        start = int(time.time() * 1000) // window_ms
        return f"nvke:throttle:{self.scope}:{ident}:{start}", window_ms

    def allow_request(self, request: Any, view: Any) -> bool:
        ident = self.ident_for(request)
        if ident is None or not self.num_requests:
            return True
        counts = getattr(request, "_nvke_throttle_counts", None)
        if counts is None:
            counts = _count(request, view)
        result = counts.get(self.scope)
        if result is None:  # not among the view's throttles when counted: count it alone
            result = _count_windows([(self.scope, *self.window_key(ident))])[self.scope]
        if isinstance(result, redis.RedisError):
            _fail_open(self.scope, result)
            return True
        count, ttl_ms = result
        if int(count) <= self.num_requests:
            return True
        self._wait = max(math.ceil(int(ttl_ms) / 1000), 1)
        return False

    def wait(self) -> float | None:
        return self._wait


def _count(request: Any, view: Any) -> dict[str, Any]:
    """Count the request in the window of every :class:`WindowRateThrottle` of ``view`` with
    one Redis round trip (the principal's and the tenant's counters together), remembered on
    the request for the other throttles: ``{scope: (count, ms left) or the RedisError}``."""
    windows = []
    for throttle in view.get_throttles() if view is not None else ():
        if isinstance(throttle, WindowRateThrottle) and throttle.num_requests:
            ident = throttle.ident_for(request)
            if ident is not None:
                windows.append((throttle.scope, *throttle.window_key(ident)))
    counts = _count_windows(windows)
    request._nvke_throttle_counts = counts
    return counts


def _count_windows(windows: list[tuple[str, str, int]]) -> dict[str, Any]:
    """``[(scope, key, window ms)]`` -> ``{scope: (count, ms left)}``, one script call; on a
    Redis error every scope maps to the error (each throttle then fails open)."""
    if not windows:
        return {}
    try:
        _client, script = _redis()
        flat = script(keys=[w[1] for w in windows], args=[w[2] for w in windows])
    except redis.RedisError as exc:
        return {scope: exc for scope, _key, _ms in windows}
    return {w[0]: (flat[2 * i], flat[2 * i + 1]) for i, w in enumerate(windows)}


class PrincipalRateThrottle(WindowRateThrottle):
    scope = "principal"

    def ident_for(self, request: Any) -> str | None:
        return getattr(request.user, "label", None) or None


class TenantRateThrottle(WindowRateThrottle):
    scope = "tenant"

    def ident_for(self, request: Any) -> str | None:
        tenant = getattr(request.user, "tenant", None)
        return str(tenant.pk) if tenant is not None else None
