"""Daily partitions of the ``fleet_gpusample`` table (PARTITION BY RANGE (ts), UTC days).

``ensure_partitions`` creates ``fleet_gpusample_pYYYYMMDD`` for each day asked for (idempotent,
safe under concurrency); ``drop_partitions_before`` implements the retention period by
dropping whole partitions (cheap, no row deletes).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

from django.db import connection, transaction
from django.db.utils import ProgrammingError

PARENT = "fleet_gpusample"
_known: set[date] = set()


def partition_name(day: date) -> str:
    return f"{PARENT}_p{day:%Y%m%d}"


def ensure_partitions(days: Iterable[date]) -> list[str]:
    """Create the partitions for ``days`` that do not exist yet; returns the names created."""
    created: list[str] = []
    for day in sorted(set(days) - _known):
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        end = start + timedelta(days=1)
        name = partition_name(day)
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
                if not cursor.fetchone()[0]:
                    cursor.execute(
                        f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {PARENT} "
                        "FOR VALUES FROM (%s) TO (%s)",
                        [start, end],
                    )
                    created.append(name)
        except ProgrammingError:
            # Another process created it between our check and CREATE: it exists now.
            pass
        # Remember it only once committed: a rolled-back creation must be redone.
        transaction.on_commit(lambda d=day: _known.add(d))
    return created


def ensure_partitions_around(now: datetime, days_ahead: int = 3, days_back: int = 1) -> list[str]:
    """Partitions from ``days_back`` before ``now`` to ``days_ahead`` after (beat task)."""
    today = now.astimezone(UTC).date()
    return ensure_partitions(today + timedelta(days=d) for d in range(-days_back, days_ahead + 1))


def existing_partitions() -> list[tuple[str, date]]:
    """``[(name, day)]`` of the partitions attached to ``fleet_gpusample``."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid
            JOIN pg_class p ON p.oid = i.inhparent
            WHERE p.relname = %s ORDER BY c.relname
            """,
            [PARENT],
        )
        names = [row[0] for row in cursor.fetchall()]
    out = []
    for name in names:
        try:
            out.append((name, datetime.strptime(name.rsplit("_p", 1)[1], "%Y%m%d").date()))
        except ValueError:
            continue
    return out


def drop_partitions_before(cutoff: date) -> list[str]:
    """Drop the partitions of days strictly before ``cutoff``; returns their names."""
    dropped = []
    for name, day in existing_partitions():
        if day < cutoff:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TABLE IF EXISTS {name}")
            _known.discard(day)
            dropped.append(name)
    return dropped


def forget_cache() -> None:
    """Forget which partitions this process has seen (tests that recreate the database)."""
    _known.clear()
