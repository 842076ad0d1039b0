"""Receivers of signals sent by lower apps (connected in ``ClustersConfig.ready``)."""

from __future__ import annotations

from django.dispatch import receiver

from tenants.signals import collect_usage

from .choices import Phase
from .models import Cluster


@receiver(collect_usage)
def running_clusters(sender, tenant_id, **kwargs) -> dict[str, int]:
    """Clusters the tenant has that are not deleted or being deleted."""
    count = (
        Cluster.objects.filter(tenant_id=tenant_id, deletion_requested_at__isnull=True)
        .exclude(phase=Phase.DELETED)
        .count()
    )
    return {"clusters": count}
