"""Receivers of signals sent by lower apps (connected in ``ClustersConfig.ready``)."""

from __future__ import annotations

from django.conf import settings
from django.dispatch import receiver

from catalog.signals import runnable_kubernetes_minors
from tenants.signals import collect_usage

from . import versions
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


@receiver(runnable_kubernetes_minors)
def default_provider_minors(sender, **kwargs) -> tuple[str, ...] | None:
    """The minors the provider of new clusters (``NVKE_DEFAULT_PROVIDER``) runs, None: any."""
    return versions.provider_minors(settings.NVKE_DEFAULT_PROVIDER)
