"""The GPU add-ons of a cluster's node pools in the tenant's cluster (issue 31, "Add-ons
applied, not only rendered").

What a pool's isolation renders for the GPU Operator (:mod:`nodepools.gpu_config`: mig-parted,
device-plugin and vGPU ConfigMaps, a pinned NVIDIADriver) and, for a pool kept in one NVLink
domain, its ComputeDomain (:mod:`nodepools.nvlink`) are applied to the cluster's API by its
provider with the ClusterPolicy and the upstream CRDs
(:meth:`clusters.providers.base.Provider.sync_addons`; ``hosted``:
:mod:`clusters.hosted.addons`, from the same render as the ``clusterapi`` provider's).

:func:`sync_cluster_addons` is the one caller: it hands the provider every pool of the cluster
that is not being deleted, so a pool whose deletion was requested loses its objects (and its
entries in the shared ConfigMaps) at its first deletion step, and again at every step until it
is ``DELETED``. The node pool reconciler calls it after every step on a running cluster, right
after the Nodes are written, and records the outcome on the pool it stepped with
:func:`record` (condition ``AddonsApplied``): ``False`` with the API's refusal when an object
rendered for the pool (or one it shares, such as the ClusterPolicy) was refused.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import transaction

from clusters.choices import Phase
from clusters.providers import get_provider
from nvke.conditions import save_conditions

from .models import NodePool
from .specs import nodepool_spec

CONDITION = "AddonsApplied"


def sync_cluster_addons(cluster_id: uuid.UUID | str, cluster=None) -> dict[uuid.UUID, str] | None:
    """Apply the add-ons of every live pool of the cluster through its provider; returns the
    API's refusals by pool id, or None where the provider applies none this way. ``cluster``:
    the Cluster row when the caller holds it (the node pool reconciler does: no query for a
    provider that applies none). Raises :class:`clusters.providers.base.ProviderError` when
    the API does not answer."""
    from clusters.models import Cluster
    from clusters.specs import cluster_spec

    if cluster is None:
        cluster = Cluster.objects.get(pk=cluster_id)
    provider = get_provider(cluster.provider)
    if not provider.applies_addons:
        return None
    pools = (
        NodePool.objects.filter(cluster_id=cluster_id, deletion_requested_at__isnull=True)
        .exclude(phase__in=(Phase.DELETED, Phase.DELETE_FAILED))
        .select_related("cluster", "gpu_model", "reservation")
        .order_by("name")
    )
    return provider.sync_addons(cluster_spec(cluster), [nodepool_spec(p) for p in pools])


def record(pool_id: uuid.UUID, refusal: str | None, now: datetime) -> None:
    """The pool's ``AddonsApplied`` condition: True, or False with the API's ``refusal``.
    Written on the row freshly locked (the reconcile step released it before calling the
    API); a pool another worker holds now is left to that worker's step."""
    with transaction.atomic():
        pool = (
            NodePool.objects.select_for_update(skip_locked=True)
            .filter(pk=pool_id, deletion_requested_at__isnull=True)
            .first()
        )
        if pool is None:
            return
        if refusal:
            condition = (CONDITION, False, "RefusedByClusterApi", refusal)
        else:
            condition = (
                CONDITION,
                True,
                "Applied",
                "the pool's GPU Operator objects are applied to the cluster's API",
            )
        save_conditions(pool, now, condition)
