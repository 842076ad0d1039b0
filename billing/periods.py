"""Billing periods and usage buckets in a tenant's time zone; everything stored is UTC.

A tenant's month ``YYYY-MM`` is ``[local midnight of the 1st, local midnight of the next 1st)``
in its IANA time zone, converted to UTC with :mod:`zoneinfo` (so a month with a DST change is
one hour shorter or longer: March 2026 in Europe/Berlin is 743 hours, November 2026 in
America/New_York 721). A local midnight that does not exist (a DST jump at 00:00) is the first
instant of that day.

Usage buckets (:func:`bucket_bounds`) are cut at every UTC hour, every local midnight of the
tenant and every price change, so a bucket lies inside one UTC hour, one local day (hence one
billing period, even in zones with a :30 or :45 offset) and one price version.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

HOUR = timedelta(hours=1)
_LABEL_RE = re.compile(r"^(\d{4})-(\d{2})$")


@lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; ValueError when it does not exist."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name like Europe/Berlin)") from None


def local_midnight(tz: str, day: date) -> datetime:
    """The UTC instant at which ``day`` starts in ``tz``."""
    return datetime.combine(day, time(0), tzinfo=zone(tz)).astimezone(UTC)


@dataclass(frozen=True)
class Period:
    """A billing month of a tenant: ``[start, end)`` in UTC, ``label`` ``YYYY-MM`` (local)."""

    label: str
    start: datetime
    end: datetime

    @property
    def hours(self) -> float:
        return (self.end - self.start) / HOUR


def month_period(tz: str, label: str) -> Period:
    """The month ``label`` (``YYYY-MM``) of time zone ``tz``; ValueError for a bad label."""
    match = _LABEL_RE.match(label or "")
    if match is None or not 1 <= int(match.group(2)) <= 12:
        raise ValueError(f"period must look like 2026-11, not {label!r}")
    year, month = int(match.group(1)), int(match.group(2))
    first = date(year, month, 1)
    nxt = date(year + (month == 12), month % 12 + 1, 1)
    return Period(label, local_midnight(tz, first), local_midnight(tz, nxt))


def period_of(tz: str, instant: datetime) -> Period:
    """The month of ``tz`` that contains ``instant``."""
    local = instant.astimezone(zone(tz))
    return month_period(tz, f"{local.year:04d}-{local.month:02d}")


def month_to_date(tz: str, end: datetime) -> tuple[datetime, datetime]:
    """The default window of every usage, cost and utilization view (the API, ``nvkectl usage``,
    the portal): ``[start of the billing month of tz that holds the last instant before end,
    end)``, ``end`` usually now: this month so far, as the cost views of AWS (Cost Explorer's
    month-to-date), Google Cloud (billing reports: current month) and Azure (cost analysis:
    this month) open. Example: Europe/Berlin, end 2026-12-07 03:00 UTC: from 2026-11-30
    23:00 UTC; an end of exactly 2026-12-01 00:00 local gives all of November."""
    return period_of(tz, end - timedelta(microseconds=1)).start, end


def local_date(tz: str, instant: datetime) -> date:
    """The calendar date of ``instant`` in ``tz``."""
    return instant.astimezone(zone(tz)).date()


def local_midnights(tz: str, start: datetime, end: datetime) -> list[datetime]:
    """Every UTC instant in ``[start, end]`` at which a local day of ``tz`` starts."""
    out = []
    day = local_date(tz, start)
    while True:
        instant = local_midnight(tz, day)
        if instant > end:
            return out
        if instant >= start:
            out.append(instant)
        day += timedelta(days=1)


def bucket_bounds(
    tz: str, start: datetime, end: datetime, cuts: Iterable[datetime] = ()
) -> list[tuple[datetime, datetime]]:
    """The usage buckets ``[(s, e)]`` covering ``[start, end)``, in order.

    Cut at every whole UTC hour, every local midnight of ``tz`` and every instant of ``cuts``
    (price changes). ``start``/``end`` themselves are bounds. Each bucket is at most one hour.
    """
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if end <= start:
        return []
    bounds = {start, end}
    hour = start.replace(minute=0, second=0, microsecond=0)
    if hour < start:
        hour += HOUR
    while hour < end:
        bounds.add(hour)
        hour += HOUR
    bounds.update(local_midnights(tz, start, end))
    bounds.update(c.astimezone(UTC) for c in cuts if start < c < end)
    ordered = sorted(bounds)
    return list(itertools.pairwise(ordered))


def _on_bound(tz: str, instant: datetime) -> bool:
    """Whether ``instant`` is a whole UTC hour or a local midnight of ``tz``: a bound of every
    usage bucket of a tenant in ``tz`` (:func:`bucket_bounds`)."""
    instant = instant.astimezone(UTC)
    if instant == instant.replace(minute=0, second=0, microsecond=0):
        return True
    return local_midnight(tz, local_date(tz, instant)) == instant


def usage_window(
    tz: str, start: datetime, end: datetime, now: datetime
) -> tuple[datetime, datetime]:
    """The window ``[start, end)`` that the stored usage records can give exactly, for the
    usage and utilization views alike. Usage is stored in buckets of an hour or less
    (:func:`bucket_bounds`), so a window bound inside a bucket cannot be honoured: a
    ``start`` that is neither a whole UTC hour nor a local midnight of ``tz`` moves up to the
    next whole UTC hour, and such an ``end`` before ``now`` moves down to its whole UTC hour
    (an ``end`` at or after ``now`` stays: the records end at their last aggregation, before
    it). Example: ``end`` 04:21:00Z (a past time) -> 04:00:00Z; ``start`` 04:21:00Z ->
    05:00:00Z; a Kolkata tenant's local midnight 18:30:00Z stays. The result may be empty
    (``end <= start``)."""
    if not _on_bound(tz, start):
        start = start.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + HOUR
    if end < now and not _on_bound(tz, end):
        end = end.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return start, end
