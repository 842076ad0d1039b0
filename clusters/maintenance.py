"""Maintenance windows: when disruptive, non-urgent changes (node upgrades, isolation
changes) may run. A policy is stored on the cluster as::

    {"time_zone": "Europe/Berlin",
     "windows": [{"days": ["sat", "sun"], "start": "02:00", "end": "06:00"}],
     "exclusions": [{"start": "2026-12-20T00:00:00Z", "end": "2027-01-04T00:00:00Z"}]}

Windows are wall-clock ranges in the policy's IANA time zone (so they follow DST); a window
whose end is before its start runs past midnight into the next day. Exclusions are absolute
UTC ranges in which nothing disruptive starts. No policy = any time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from nvke.validation import BadValue, parse_aware_datetime, to_utc

DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
#: bounds of a policy (each tenant's policy is evaluated on every upgrade step of its pools)
MAX_WINDOWS = 32
MAX_EXCLUSIONS = 64
#: how far ahead :func:`next_window_start` looks (days)
HORIZON_DAYS = 60

_HHMM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")
_ZONE = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+){0,3}")


class InvalidPolicy(ValueError):
    """The policy is malformed; ``field`` names where (``maintenance_policy.windows[0].start``);
    ``code`` is ``invalid_maintenance_policy``, ``too_many_windows``, ``too_many_exclusions`` or
    ``datetime_out_of_range``."""

    def __init__(self, field: str, message: str, code: str = "invalid_maintenance_policy") -> None:
        self.field = field
        self.code = code
        super().__init__(message)


def _time(value: Any, field: str) -> time:
    match = _HHMM.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidPolicy(field, "times are HH:MM (24 h, ASCII digits)")
    return time(int(match.group(1)), int(match.group(2)))


@functools.cache
def _zone_names() -> frozenset[str]:
    """IANA time zone names (``zoneinfo.available_timezones``, the system's tz database or the
    tzdata package), without the files that are no zone of their own: ``localtime`` (the
    server's own zone), ``posixrules`` and ``Factory``."""
    return frozenset(available_timezones()) - {"localtime", "posixrules", "Factory"}


def _zone(value: Any) -> ZoneInfo:
    if (
        not isinstance(value, str)
        or len(value) > 64
        or not _ZONE.fullmatch(value)
        or value not in _zone_names()
    ):
        raise InvalidPolicy("maintenance_policy.time_zone", f"unknown time zone {value!r}")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidPolicy("maintenance_policy.time_zone", f"unknown time zone {value!r}") from exc


def _exclusion_bound(exclusion: dict[str, Any], key: str, where: str) -> datetime:
    try:
        return parse_aware_datetime(exclusion.get(key))
    except BadValue as exc:
        code = exc.code if exc.code == "datetime_out_of_range" else "invalid_maintenance_policy"
        raise InvalidPolicy(
            f"{where}.{key}",
            f"exclusions are {{start, end}} RFC 3339 with offsets, end after start ({exc})",
            code,
        ) from exc


def validate_policy(policy: Any) -> dict[str, Any]:
    """Check and normalise a policy (raises InvalidPolicy). At most :data:`MAX_WINDOWS`
    windows and :data:`MAX_EXCLUSIONS` exclusions; exclusions are stored in UTC."""
    if policy in (None, {}):
        return {}
    if not isinstance(policy, dict):
        raise InvalidPolicy("maintenance_policy", "must be an object")
    unknown = sorted(str(k) for k in policy if k not in ("time_zone", "windows", "exclusions"))
    if unknown:
        raise InvalidPolicy(f"maintenance_policy.{unknown[0]}", "unknown key")
    tz = policy.get("time_zone", "UTC")
    _zone(tz)
    windows = policy.get("windows") or []
    if not isinstance(windows, list) or not windows:
        raise InvalidPolicy("maintenance_policy.windows", "give at least one window")
    if len(windows) > MAX_WINDOWS:
        raise InvalidPolicy(
            "maintenance_policy.windows",
            f"at most {MAX_WINDOWS} windows",
            "too_many_windows",
        )
    out_windows = []
    for i, window in enumerate(windows):
        where = f"maintenance_policy.windows[{i}]"
        if not isinstance(window, dict):
            raise InvalidPolicy(where, "each window is an object")
        days = window.get("days") or DAYS
        if (
            not isinstance(days, list)
            or len(days) > len(DAYS)
            or any(not isinstance(d, str) or d not in DAYS for d in days)
        ):
            raise InvalidPolicy(f"{where}.days", f"days are among {DAYS}")
        start, end = (
            _time(window.get("start"), f"{where}.start"),
            _time(window.get("end"), f"{where}.end"),
        )
        if start == end:
            raise InvalidPolicy(f"{where}.end", "a window cannot be empty")
        out_windows.append(
            {
                "days": [d for d in DAYS if d in days],
                "start": start.strftime("%H:%M"),
                "end": end.strftime("%H:%M"),
            }
        )
    raw_exclusions = policy.get("exclusions") or []
    if not isinstance(raw_exclusions, list):
        raise InvalidPolicy("maintenance_policy.exclusions", "exclusions are a list")
    if len(raw_exclusions) > MAX_EXCLUSIONS:
        raise InvalidPolicy(
            "maintenance_policy.exclusions",
            f"at most {MAX_EXCLUSIONS} exclusions",
            "too_many_exclusions",
        )
    exclusions = []
    for i, exclusion in enumerate(raw_exclusions):
        where = f"maintenance_policy.exclusions[{i}]"
        if not isinstance(exclusion, dict):
            raise InvalidPolicy(where, "each exclusion is an object {start, end}")
        start_at = _exclusion_bound(exclusion, "start", where)
        end_at = _exclusion_bound(exclusion, "end", where)
        if end_at <= start_at:
            raise InvalidPolicy(f"{where}.end", "an exclusion ends after it starts")
        exclusions.append({"start": start_at.isoformat(), "end": end_at.isoformat()})
    return {"time_zone": str(tz), "windows": out_windows, "exclusions": exclusions}


# --- evaluation ---------------------------------------------------------------------------------
# A policy is evaluated as sorted UTC intervals: each window on each local day of the horizon
# becomes one interval, exclusions are cut out of them in one merge pass. The cost is
# O(n log n) in n = windows x horizon days + exclusions — never windows x exclusions — and one
# call answers both "may a change start now" and "when may it next".


def _window_intervals(
    policy: dict[str, Any], tz: ZoneInfo, first_day: Any, days: int
) -> list[tuple[datetime, datetime]]:
    out = []
    windows = [
        (set(w["days"]), _time(w["start"], ""), _time(w["end"], "")) for w in policy["windows"]
    ]
    for offset in range(days):
        day = first_day + timedelta(days=offset)
        name = DAYS[day.weekday()]
        for window_days, start, end in windows:
            if name not in window_days:
                continue
            opens = datetime.combine(day, start, tz)
            closes = datetime.combine(day + timedelta(days=1 if end <= start else 0), end, tz)
            try:
                out.append((to_utc(opens), to_utc(closes)))
            except BadValue:
                continue
    return out


def _merged(intervals: list[tuple[datetime, datetime]]) -> Iterator[tuple[datetime, datetime]]:
    current: tuple[datetime, datetime] | None = None
    for start, end in sorted(intervals):
        if current is not None and start <= current[1]:
            current = (current[0], max(current[1], end))
            continue
        if current is not None:
            yield current
        current = (start, end)
    if current is not None:
        yield current


def allowed_intervals(
    policy: dict[str, Any], now: datetime, horizon_days: int = HORIZON_DAYS
) -> list[tuple[datetime, datetime]]:
    """The UTC intervals ``[start, end)`` in which disruptive changes may start, from the
    local day before ``now`` (a window running past midnight) to ``horizon_days`` after it,
    sorted, exclusions removed."""
    tz = ZoneInfo(policy.get("time_zone", "UTC"))
    first_day = now.astimezone(tz).date() - timedelta(days=1)
    windows = list(_merged(_window_intervals(policy, tz, first_day, horizon_days + 2)))
    exclusions = list(
        _merged(
            [
                (datetime.fromisoformat(e["start"]), datetime.fromisoformat(e["end"]))
                for e in policy.get("exclusions", [])
            ]
        )
    )
    out: list[tuple[datetime, datetime]] = []
    j = 0
    for start, end in windows:
        while j < len(exclusions) and exclusions[j][1] <= start:
            j += 1
        k = j
        cursor = start
        while k < len(exclusions) and exclusions[k][0] < end:
            if exclusions[k][0] > cursor:
                out.append((cursor, exclusions[k][0]))
            cursor = max(cursor, exclusions[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def next_window_start(
    policy: dict[str, Any], now: datetime, horizon_days: int = HORIZON_DAYS
) -> datetime | None:
    """The next time a disruptive change may start (``now`` if it may now), or None within
    ``horizon_days``. One evaluation of the policy (see :func:`allowed_intervals`)."""
    if not policy:
        return now
    for start, end in allowed_intervals(policy, now, horizon_days):
        if end > now:
            return max(start, now)
    return None


def in_window(policy: dict[str, Any], now: datetime) -> bool:
    """True when a disruptive change may run at ``now`` (aware datetime)."""
    return next_window_start(policy, now, horizon_days=1) == now


def describe_opening(policy: dict[str, Any], opens: datetime | None) -> str:
    """When the next window opens, as its users read it: the policy's local weekday and time
    with the zone named (``"Sat 02:00 Europe/Berlin"``); ``"none in the next 60 days"`` for
    None (exclusions can close every window of the horizon)."""
    if opens is None:
        return f"none in the next {HORIZON_DAYS} days"
    zone = (policy or {}).get("time_zone") or "UTC"
    local = opens.astimezone(ZoneInfo(zone))
    return f"{local:%a %H:%M} {zone}"


def waiting_message(policy: dict[str, Any], opens: datetime | None, now: datetime) -> str:
    """The reason a reconciler gives while it waits for a window: ``"waiting for the
    maintenance window Sat 02:00 Europe/Berlin"`` (the date is added when the opening is a
    week or more away, where the weekday alone would be ambiguous)."""
    text = describe_opening(policy, opens)
    if opens is not None and opens - now >= timedelta(days=6):
        zone = (policy or {}).get("time_zone") or "UTC"
        text = f"{opens.astimezone(ZoneInfo(zone)):%Y-%m-%d} {text}"
    return f"waiting for the maintenance window {text}"
