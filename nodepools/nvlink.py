"""A node pool whose nodes share one multi-node NVLink domain (GB200 NVL72, issue #19).

The pool spec's ``placement`` is ``{}`` or ``{"same_nvlink_domain": true}``. With it:

* validation (:func:`validate_placement`): only for a GPU model that has multi-node NVLink
  domains (a catalog ``GpuSystem`` such as GB200 NVL72, or fleet hosts with a domain), and the
  pool must fit in one domain (``node_count x gpus_per_node`` <= the system's domain GPUs);
  errors are 400 naming ``placement.same_nvlink_domain``;
* capacity (:func:`check_room`): creating or growing the pool answers 409
  ``nvlink_domain_full`` at once when no domain (or, for a pool with nodes, not its own domain)
  has room, naming the largest free domain and how many nodes of the pool's shape fit there;
  the placement itself happens in the reconciler (:func:`fleet.nvlink_domains.claim_in_one_domain`);
* rendering (:func:`compute_domain`): the pool's GPU config carries a ``ComputeDomain``
  (``resource.nvidia.com/v1beta1``, NVIDIA's DRA driver for GPUs, NVIDIA/k8s-dra-driver-gpu;
  CRD vendored in ``clusters/providers/crds/``). Workloads of the pool reference
  the ResourceClaimTemplate the driver generates for it (``channel.resourceClaimTemplate``).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.utils import timezone

from catalog.models import GpuModel, GpuSystem
from fleet import nvlink_domains
from fleet.models import Host
from nvke.errors import Conflict, InvalidInput

FIELD = "placement.same_nvlink_domain"
#: where the ComputeDomain (a namespaced object) is created in the tenant's cluster
COMPUTE_DOMAIN_NAMESPACE = "default"
COMPUTE_DOMAIN_API_VERSION = "resource.nvidia.com/v1beta1"


def validate_placement(
    model: GpuModel, placement: Any, *, gpus_per_node: int, node_count: int
) -> dict[str, Any]:
    """The normalised placement spec (``{}`` or ``{"same_nvlink_domain": True}``).

    Raises InvalidInput: ``invalid_placement`` (not an object, unknown key, not a boolean),
    ``nvlink_domain_unsupported`` (the model has no multi-node NVLink domain: no catalog
    system and no host with a domain), ``nvlink_domain_too_small`` (more GPUs than one domain
    of the model's system holds).
    """
    if placement in (None, {}):
        return {}
    if not isinstance(placement, dict):
        raise InvalidInput(
            "placement must be an object", code="invalid_placement", field="placement"
        )
    unknown = sorted(str(k) for k in placement if k != "same_nvlink_domain")
    if unknown:
        raise InvalidInput(
            f"unknown placement field {unknown[0][:40]!r} (known: same_nvlink_domain)",
            code="invalid_placement",
            field=f"placement.{unknown[0][:40]}",
        )
    same = placement.get("same_nvlink_domain")
    if not isinstance(same, bool):
        raise InvalidInput(
            "same_nvlink_domain must be true or false", code="invalid_placement", field=FIELD
        )
    if not same:
        return {}
    systems = list(GpuSystem.objects.filter(gpu_model=model).order_by("-nvlink_domain_gpus"))
    if not systems and not _hosts_with_domain(model.slug):
        raise InvalidInput(
            f"{model.slug} has no multi-node NVLink domain (no rack-scale system of it in the "
            "catalog and no host with an NVLink domain)",
            code="nvlink_domain_unsupported",
            field=FIELD,
            extra={"systems_with_nvlink_domains": list(_models_with_systems())},
        )
    if systems:
        largest = systems[0]
        if node_count * gpus_per_node > largest.nvlink_domain_gpus:
            raise InvalidInput(
                f"{node_count} x {gpus_per_node} GPUs do not fit in one NVLink domain of "
                f"{largest.name} ({largest.nvlink_domain_gpus} GPUs, "
                f"{largest.domain_trays} trays of {largest.gpus_per_tray})",
                code="nvlink_domain_too_small",
                field=FIELD,
                extra={"nvlink_domain_gpus": largest.nvlink_domain_gpus},
            )
    return {"same_nvlink_domain": True}


def _hosts_with_domain(gpu_model: str) -> bool:
    return Host.objects.filter(gpu_model_id=gpu_model, nvlink_cluster_uuid__isnull=False).exists()


def _models_with_systems() -> list[str]:
    return sorted(set(GpuSystem.objects.values_list("gpu_model_id", flat=True)))


def wants_one_domain(placement: dict[str, Any] | None) -> bool:
    """Whether a pool's placement asks for one NVLink domain."""
    return bool((placement or {}).get("same_nvlink_domain"))


def check_room(
    *,
    gpu_model: str,
    region: str,
    tenant_id: uuid.UUID,
    gpus_per_node: int,
    nodes: int,
    pool_id: uuid.UUID | None = None,
    reservation=None,
) -> None:
    """409 ``nvlink_domain_full`` when no domain (for an existing pool: its own) has room for
    a pool of ``nodes`` nodes now (those the pool ``pool_id`` already holds GPUs for count as
    placed), naming the largest free domain (``extra``:
    ``largest_free_domain`` ``{cluster_uuid, clique_id, label, hosts, free_gpus,
    nodes_that_fit}``, ``pool_domain``, ``nodes_requested``). Advisory: the reconciler's
    claim decides under host locks. A pool on a live ``reservation`` may use the domain it
    reserves as a whole (and only that one); other reserved domains are fenced off."""
    if pool_id is not None:
        nodes -= nvlink_domains.held_nodes(pool_id)
    if nodes <= 0:
        return
    # a live reservation's own domain is not fenced for its pools (a SCHEDULED one: the create
    # answers reservation_not_active, the dry run "placeable from its start", not this 409)
    live = ("ACTIVE", "SCHEDULED")
    active = reservation if reservation and reservation.state_at(timezone.now()) in live else None
    try:
        nvlink_domains.check_room(
            gpu_model=gpu_model,
            region=region,
            tenant_id=tenant_id,
            gpus_per_node=gpus_per_node,
            nodes=nodes,
            group_id=pool_id,
            reservation_id=active.id if active else None,
            only=active.nvlink_domain if active else None,
        )
    except nvlink_domains.NvlinkDomainFull as exc:
        raise Conflict(
            str(exc), code=exc.code, field=FIELD, retryable=True, extra=exc.as_extra()
        ) from exc


def compute_domain(pool_name: str) -> dict[str, Any]:
    """The pool's ``ComputeDomain`` (NVIDIA DRA driver, ``resource.nvidia.com/v1beta1``):
    ``numNodes: 0`` (the CRD recommends 0 with the driver's default
    ``IMEXDaemonsWithDNSNames``; workloads track their own workers), one IMEX channel per
    claim (``allocationMode: Single``), and the ResourceClaimTemplate the driver generates,
    named ``nvke-<pool>-channel``, which the pool's pods reference."""
    name = f"nvke-{pool_name}"
    return {
        "apiVersion": COMPUTE_DOMAIN_API_VERSION,
        "kind": "ComputeDomain",
        "metadata": {
            "name": name,
            "namespace": COMPUTE_DOMAIN_NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "nvke", "nvke.io/nodepool": pool_name},
        },
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": f"{name}-channel"},
                "allocationMode": "Single",
            },
        },
    }
