"""HTTP client for the NVKE agent API, with exponential backoff and full jitter.

Endpoints (the server implements exactly these):

* ``POST {server}/api/v1/agent/register`` ``{"bootstrap_token", "hostname", "agent_version"}``
  -> 201 ``{"host_id", "credential", "report_interval_s"}``; 401 problem+json
  (``code`` ``"invalid_bootstrap_token"``) when the token is unknown, used or expired.
* ``POST {server}/api/v1/agent/reports`` with ``Authorization: Bearer <credential>`` and a
  report body -> 200 ``{"seq", "duplicate", "samples_stored", "samples_rejected"}``.

Outcome of a report send (:meth:`ApiClient.send_report`, one HTTP attempt):

* 200 -> :class:`Ack` (the batch may be deleted);
* 401 -> :class:`Unauthorized` is raised (the credential is bad: stop, keep the spool);
* 408, 429, 5xx, connection errors, timeouts -> :class:`RetryLater` (with ``Retry-After``);
* any other 4xx -> :class:`Refused` (the batch is refused for good).

Errors are RFC 9457 problem+json (``type, title, status, detail, code``, DESIGN.md §7).
Backoff (:class:`Backoff`): attempt *n* waits ``uniform(0, min(cap, base * 2**n))`` seconds
("full jitter", AWS Architecture Blog, "Exponential Backoff And Jitter"), base 1 s, cap 60 s,
and never less than the server's ``Retry-After`` (RFC 9110 §10.2.3: seconds or an HTTP date).
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import requests

from nvke_agent import __version__

log = logging.getLogger(__name__)

REGISTER_PATH = "/api/v1/agent/register"
REPORTS_PATH = "/api/v1/agent/reports"
RETRYABLE_4XX = frozenset({408, 429})
MAX_RETRY_AFTER_S = 3600.0  # a server asking for more than an hour is not taken literally


class ApiError(RuntimeError):
    """The API answered with an error that retrying will not fix."""

    def __init__(self, status: int, detail: str, code: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.code = code


class RegistrationRefused(ApiError):
    """Registration was refused (401 ``invalid_bootstrap_token``, or another 4xx)."""


class Unauthorized(ApiError):
    """A report was answered 401: the host credential is not (or no longer) valid."""


class Stopped(RuntimeError):
    """A retry loop was interrupted by the stop event (SIGTERM/SIGINT)."""


@dataclass(frozen=True)
class Registration:
    """What the server returns from registration."""

    host_id: str
    credential: str
    report_interval_s: int | None
    #: the highest report seq the server has accepted from this host (0: none, or an older
    #: server that does not say): a re-registered agent numbers its reports above it
    seq_baseline: int = 0


@dataclass(frozen=True)
class Ack:
    """200 on a report. ``commands`` are what the server asks the agent to do (scrubs)."""

    seq: int | None
    duplicate: bool
    samples_stored: int
    samples_rejected: int
    commands: tuple[dict[str, Any], ...] = ()
    #: the server had this seq with other content: another agent uses this host's identity
    identity_conflict: bool = False


@dataclass(frozen=True)
class Refused:
    """A 4xx other than 401/408/429: the batch is refused for good."""

    status: int
    detail: str


@dataclass(frozen=True)
class RetryLater:
    """A transient failure; try again after a backoff of at least ``retry_after_s``."""

    reason: str
    retry_after_s: float | None = None


SendOutcome = Ack | Refused | RetryLater


class Backoff:
    """Exponential backoff with full jitter (see module docstring). Not thread-safe."""

    def __init__(
        self, *, base_s: float = 1.0, cap_s: float = 60.0, rng: random.Random | None = None
    ) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("need 0 < base_s <= cap_s")
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def ceiling(self) -> float:
        """Upper bound of the next delay: ``min(cap, base * 2**attempt)`` seconds."""
        return min(self.cap_s, self.base_s * float(2 ** min(self.attempt, 62)))

    def next_delay(self, retry_after_s: float | None = None) -> float:
        """Seconds to wait before the next attempt; advances the attempt counter."""
        delay = self._rng.uniform(0.0, self.ceiling())
        self.attempt += 1
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, MAX_RETRY_AFTER_S))
        return delay

    def reset(self) -> None:
        """A success: the next failure starts from ``base`` again."""
        self.attempt = 0


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or HTTP-date), ``None`` if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class ApiClient:
    """Talks to one NVKE server. ``timeout`` is (connect, read) seconds per request."""

    def __init__(
        self,
        server: str,
        *,
        timeout: tuple[float, float] = (5.0, 30.0),
        session: requests.Session | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = f"nvke-agent/{__version__}"

    def close(self) -> None:
        """Close pooled connections."""
        self.session.close()

    # --- register -----------------------------------------------------------------------------

    def register(
        self,
        *,
        bootstrap_token: str,
        hostname: str,
        agent_version: str = __version__,
        backoff: Backoff | None = None,
        stop: threading.Event | None = None,
    ) -> Registration:
        """Exchange a bootstrap token for a host credential, retrying transient failures.

        Raises :class:`RegistrationRefused` (401 or another final 4xx, or a malformed answer)
        and :class:`Stopped` if ``stop`` is set while waiting to retry.
        """
        backoff = backoff or Backoff()
        stop = stop or threading.Event()
        payload = {
            "bootstrap_token": bootstrap_token,
            "hostname": hostname,
            "agent_version": agent_version,
        }
        while True:
            outcome = self._post(REGISTER_PATH, payload, headers={})
            if isinstance(outcome, RetryLater):
                delay = backoff.next_delay(outcome.retry_after_s)
                log.warning(
                    "registration failed (%s); retrying in %.1f s",
                    outcome.reason,
                    delay,
                    extra={"fields": {"retry_in_s": round(delay, 3)}},
                )
                if stop.wait(delay):
                    raise Stopped("stopped while registering")
                continue
            response = outcome
            if response.status_code in (200, 201):
                body = _json(response)
                try:
                    interval = body.get("report_interval_s")
                    baseline = int(body.get("seq_baseline") or 0)
                    if baseline < 0:
                        raise ValueError(f"seq_baseline {baseline} < 0")
                    return Registration(
                        host_id=str(body["host_id"]),
                        credential=str(body["credential"]),
                        report_interval_s=int(interval) if interval is not None else None,
                        seq_baseline=baseline,
                    )
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise RegistrationRefused(
                        response.status_code, f"malformed registration answer: {exc!r}"
                    ) from exc
            detail, code = _problem(response)
            raise RegistrationRefused(response.status_code, detail, code)

    # --- reports ------------------------------------------------------------------------------

    def send_report(self, credential: str, body: dict[str, Any]) -> SendOutcome:
        """Send one report body, once. Raises :class:`Unauthorized` on 401."""
        outcome = self._post(REPORTS_PATH, body, headers={"Authorization": f"Bearer {credential}"})
        if isinstance(outcome, RetryLater):
            return outcome
        response = outcome
        status = response.status_code
        if status == 200:
            answer = _json(response)
            return Ack(
                seq=_int_or_none(answer.get("seq")),
                duplicate=bool(answer.get("duplicate", False)),
                samples_stored=_int_or_none(answer.get("samples_stored")) or 0,
                samples_rejected=_int_or_none(answer.get("samples_rejected")) or 0,
                commands=tuple(c for c in answer.get("commands") or () if isinstance(c, dict)),
                identity_conflict=answer.get("identity_conflict") is True,
            )
        detail, code = _problem(response)
        if status == 401:
            raise Unauthorized(status, detail, code)
        if 400 <= status < 500:
            return Refused(status, f"{code}: {detail}" if code else detail)
        # 2xx other than 200, 3xx: not an acknowledgement; treat as transient.
        return RetryLater(f"unexpected HTTP {status}: {detail}")

    # --- transport ----------------------------------------------------------------------------

    def _post(
        self, path: str, payload: dict[str, Any], *, headers: dict[str, str]
    ) -> requests.Response | RetryLater:
        """POST JSON; transient failures (network, 408, 429, 5xx) come back as RetryLater."""
        try:
            response = self.session.post(
                self.server + path, json=payload, headers=headers, timeout=self.timeout
            )
        except requests.RequestException as exc:
            return RetryLater(f"{type(exc).__name__}: {exc}")
        status = response.status_code
        if status >= 500 or status in RETRYABLE_4XX:
            detail, _ = _problem(response)
            return RetryLater(
                f"HTTP {status}: {detail}",
                parse_retry_after(response.headers.get("Retry-After")),
            )
        return response


def _json(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _problem(response: requests.Response) -> tuple[str, str | None]:
    """``(detail, code)`` of a problem+json answer; falls back to the body text."""
    body = _json(response)
    detail = body.get("detail") or body.get("title")
    if not detail:
        detail = response.text[:500].strip() or response.reason or f"HTTP {response.status_code}"
    code = body.get("code")
    return str(detail), (str(code) if code is not None else None)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
