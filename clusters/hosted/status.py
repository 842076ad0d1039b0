"""What the control-plane manager writes: a control plane's observed state and, for a cluster
that is up, its ``ControlPlaneReady`` / ``Ready`` conditions at the moment they change.

While a cluster is being created or upgraded the cluster reconciler owns its conditions (it
reads the observed state through the provider); once RUNNING, a control plane that goes down
(a process exits) or comes back is written here at once, not on a later poll.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from nvke.conditions import set_condition

from ..choices import Phase
from ..models import Cluster, HostedControlPlane


def record(cluster_id: uuid.UUID | str, **fields: Any) -> None:
    """Update a control plane's observed fields (``state``, ``ready``, ``message`` ...);
    ``observed_at`` is set to now. A row that is gone is left gone."""
    HostedControlPlane.objects.filter(pk=cluster_id).update(observed_at=timezone.now(), **fields)


def publish_ready(cluster_id: uuid.UUID | str, ready: bool, reason: str, message: str) -> bool:
    """Set a RUNNING (or RECONCILING/DEGRADED) cluster's ``ControlPlaneReady`` and ``Ready``
    conditions; a cluster in another phase (being created, deleted) is left to its
    reconciler. Returns whether anything changed."""
    now = timezone.now()
    with transaction.atomic():
        cluster = (
            Cluster.objects.select_for_update(no_key=True)
            .filter(
                pk=cluster_id,
                phase__in=(Phase.RUNNING, Phase.RECONCILING, Phase.DEGRADED),
                deletion_requested_at__isnull=True,
            )
            .first()
        )
        if cluster is None:
            return False
        conditions = set_condition(
            cluster.conditions, "ControlPlaneReady", ready, reason, message, now
        )
        conditions = set_condition(
            conditions,
            "Ready",
            ready,
            "Ready" if ready else "ControlPlaneNotReady",
            "cluster is running" if ready else message,
            now,
        )
        if conditions == cluster.conditions:
            return False
        cluster.conditions = conditions
        cluster.save(update_fields=["conditions", "updated_at"])
        return True
