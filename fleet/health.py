"""Host liveness from agent heartbeats."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from .choices import SCHEDULABLE_HOST_STATES, HostState
from .models import Host


def mark_silent_hosts_not_ready(now: datetime) -> int:
    """Hosts whose registered agent has not reported for the heartbeat timeout -> NOT_READY.

    Hosts that never registered an agent are left alone (an imported host is usable before
    its agent starts). Returns the number of hosts changed (a guarded UPDATE).
    """
    cutoff = now - timedelta(seconds=settings.NVKE_HOST_HEARTBEAT_TIMEOUT_S)
    return Host.objects.filter(state__in=SCHEDULABLE_HOST_STATES, last_seen_at__lt=cutoff).update(
        state=HostState.NOT_READY
    )
