"""Fleet settings, named for what they mean here.

Each is the Django setting of the same name, declared (type, default, unit) in
``nvke/settings_registry.py`` and read from the environment by ``nvke/settings.py``; tests
override them with the ``settings`` fixture.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings


def _get(name: str, kind: type) -> Any:
    return kind(getattr(settings, name))


def heartbeat_timeout_s() -> float:
    """A registered host without a report for this long becomes NOT_READY (s)."""
    return _get("NVKE_HOST_HEARTBEAT_TIMEOUT_S", float)


def sample_retention_days() -> int:
    """Raw samples are kept this many days (whole daily partitions are dropped)."""
    return _get("NVKE_SAMPLE_RETENTION_DAYS", int)


def sample_max_future_s() -> float:
    """Samples stamped further than this in the future are rejected (s)."""
    return _get("NVKE_SAMPLE_MAX_FUTURE_S", float)


def rollup_1m_retention_days() -> int:
    """1-minute rollups are kept this many days."""
    return _get("NVKE_ROLLUP_1M_RETENTION_DAYS", int)


def rollup_1h_retention_days() -> int:
    """1-hour rollups are kept this many days."""
    return _get("NVKE_ROLLUP_1H_RETENTION_DAYS", int)


def max_gpu_power_w() -> float:
    """Energy deltas above this power between two readings are implausible (W).

    A deliberately loose bound (the catalog holds no board power figures): it only has to
    catch counters that jumped by hours of energy, not to model a GPU. Set it per fleet.
    """
    return _get("NVKE_MAX_GPU_POWER_W", float)


def scrub_timeout_s() -> float:
    """A scrub the agent has not confirmed after this long is marked FAILED (s)."""
    return _get("NVKE_SCRUB_TIMEOUT_S", float)


def clock_skew_warning_s() -> float:
    """The allowed agent clock skew (s): an agent whose ``sent_at`` is further than this from
    the server's receive time, ahead or behind, gets a host warning and its report's sample
    and Xid times are re-dated by the measured offset (:func:`fleet.ingest.clock_correction`)."""
    return _get("NVKE_AGENT_CLOCK_SKEW_WARNING_S", float)


def report_interval_s() -> int:
    """The report interval the server asks agents for (s)."""
    return _get("NVKE_AGENT_REPORT_INTERVAL_S", int)
