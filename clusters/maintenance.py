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

from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils.dateparse import parse_datetime

DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


class InvalidPolicy(ValueError):
    """The policy is malformed; ``field`` names where (``maintenance_policy.windows[0].start``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def _time(value: Any, field: str) -> time:
    try:
        hours, minutes = str(value).split(":")
        return time(int(hours), int(minutes))
    except (ValueError, TypeError) as exc:
        raise InvalidPolicy(field, "times are HH:MM (24 h)") from exc


def validate_policy(policy: Any) -> dict[str, Any]:
    """Check and normalise a policy (raises InvalidPolicy)."""
    if policy in (None, {}):
        return {}
    if not isinstance(policy, dict):
        raise InvalidPolicy("maintenance_policy", "must be an object")
    tz = policy.get("time_zone", "UTC")
    try:
        ZoneInfo(str(tz))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidPolicy("maintenance_policy.time_zone", f"unknown time zone {tz!r}") from exc
    windows = policy.get("windows") or []
    if not isinstance(windows, list) or not windows:
        raise InvalidPolicy("maintenance_policy.windows", "give at least one window")
    out_windows = []
    for i, window in enumerate(windows):
        where = f"maintenance_policy.windows[{i}]"
        if not isinstance(window, dict):
            raise InvalidPolicy(where, "each window is an object")
        days = window.get("days") or DAYS
        if not isinstance(days, list) or any(d not in DAYS for d in days):
            raise InvalidPolicy(f"{where}.days", f"days are among {DAYS}")
        start, end = (
            _time(window.get("start"), f"{where}.start"),
            _time(window.get("end"), f"{where}.end"),
        )
        if start == end:
            raise InvalidPolicy(f"{where}.end", "a window cannot be empty")
        out_windows.append(
            {"days": days, "start": start.strftime("%H:%M"), "end": end.strftime("%H:%M")}
        )
    exclusions = []
    for i, exclusion in enumerate(policy.get("exclusions") or []):
        where = f"maintenance_policy.exclusions[{i}]"
        start = parse_datetime(str((exclusion or {}).get("start", "")))
        end = parse_datetime(str((exclusion or {}).get("end", "")))
        if not start or not end or start.tzinfo is None or end <= start:
            raise InvalidPolicy(
                where, "exclusions are {start, end} RFC 3339 with offsets, end after start"
            )
        exclusions.append({"start": start.isoformat(), "end": end.isoformat()})
    return {"time_zone": str(tz), "windows": out_windows, "exclusions": exclusions}


def in_window(policy: dict[str, Any], now: datetime) -> bool:
    """True when a disruptive change may run at ``now`` (aware datetime)."""
    if not policy:
        return True
    for exclusion in policy.get("exclusions", []):
        if parse_datetime(exclusion["start"]) <= now < parse_datetime(exclusion["end"]):
            return False
    local = now.astimezone(ZoneInfo(policy.get("time_zone", "UTC")))
    for window in policy["windows"]:
        start, end = _time(window["start"], ""), _time(window["end"], "")
        for day_offset in (0, -1):  # today's window, or yesterday's running past midnight
            day = local.date() + timedelta(days=day_offset)
            if DAYS[day.weekday()] not in window["days"]:
                continue
            opens = datetime.combine(day, start, local.tzinfo)
            closes = datetime.combine(
                day + timedelta(days=1 if end <= start else 0), end, local.tzinfo
            )
            if opens <= local < closes:
                return True
    return False


def next_window_start(
    policy: dict[str, Any], now: datetime, horizon_days: int = 60
) -> datetime | None:
    """The next time a disruptive change may start (``now`` if it may now), or None within
    ``horizon_days``. Candidates are the windows' opening times and the exclusions' ends."""
    if in_window(policy, now):
        return now
    tz = ZoneInfo(policy.get("time_zone", "UTC"))
    local_day = now.astimezone(tz).date()
    candidates = [parse_datetime(e["end"]) for e in policy.get("exclusions", [])]
    for offset in range(horizon_days + 1):
        day = local_day + timedelta(days=offset)
        for window in policy["windows"]:
            if DAYS[day.weekday()] in window["days"]:
                candidates.append(datetime.combine(day, _time(window["start"], ""), tz))
    for candidate in sorted(c for c in candidates if c and c >= now):
        if in_window(policy, candidate):
            return candidate
    return None
