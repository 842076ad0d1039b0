"""Billing months and usage buckets in a tenant's time zone, across DST and month ends."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from billing.periods import bucket_bounds, month_period


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_a_month_with_the_spring_dst_change_is_one_hour_short():
    # Europe/Berlin: CET (+1) until 2026-03-29 01:00 UTC, then CEST (+2).
    march = month_period("Europe/Berlin", "2026-03")
    assert (march.start, march.end) == (utc(2026, 2, 28, 23), utc(2026, 3, 31, 22))
    assert march.hours == 31 * 24 - 1  # 743


def test_a_month_with_the_autumn_dst_change_is_one_hour_long():
    # America/New_York: EDT (-4) until 2026-11-01 06:00 UTC, then EST (-5).
    november = month_period("America/New_York", "2026-11")
    assert (november.start, november.end) == (utc(2026, 11, 1, 4), utc(2026, 12, 1, 5))
    assert november.hours == 30 * 24 + 1  # 721


def test_december_ends_at_the_next_years_first_local_midnight():
    december = month_period("Asia/Tokyo", "2026-12")
    assert (december.start, december.end) == (utc(2026, 11, 30, 15), utc(2026, 12, 31, 15))


def test_buckets_split_at_local_midnight_in_a_half_hour_zone():
    # Asia/Kolkata is +05:30: local midnight of 1 Nov 2026 is 2026-10-31 18:30 UTC.
    assert month_period("Asia/Kolkata", "2026-11").start == utc(2026, 10, 31, 18, 30)
    buckets = bucket_bounds("Asia/Kolkata", utc(2026, 10, 31, 18), utc(2026, 10, 31, 20))
    assert buckets == [
        (utc(2026, 10, 31, 18), utc(2026, 10, 31, 18, 30)),
        (utc(2026, 10, 31, 18, 30), utc(2026, 10, 31, 19)),
        (utc(2026, 10, 31, 19), utc(2026, 10, 31, 20)),
    ]


def test_buckets_split_at_a_price_change_inside_an_hour():
    buckets = bucket_bounds(
        "UTC", utc(2026, 11, 10, 14), utc(2026, 11, 10, 16), cuts=[utc(2026, 11, 10, 14, 30)]
    )
    assert buckets == [
        (utc(2026, 11, 10, 14), utc(2026, 11, 10, 14, 30)),
        (utc(2026, 11, 10, 14, 30), utc(2026, 11, 10, 15)),
        (utc(2026, 11, 10, 15), utc(2026, 11, 10, 16)),
    ]


def test_the_dst_night_has_23_hourly_buckets_in_berlin():
    day_start = utc(2026, 3, 28, 23)  # 29 March 00:00 CET
    day_end = utc(2026, 3, 29, 22)  # 30 March 00:00 CEST
    assert len(bucket_bounds("Europe/Berlin", day_start, day_end)) == 23


@pytest.mark.parametrize("label", ["2026-13", "2026-1", "nov", ""])
def test_a_bad_period_label_is_refused(label):
    with pytest.raises(ValueError, match="2026-11"):
        month_period("UTC", label)
