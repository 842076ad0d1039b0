"""Open and close ledger rows when nodes become ready / are released (nodepools' signals).

``node_ready(sender, node, allocations=None)``: without ``allocations`` the node holds the
whole GPUs in ``node.gpu_uuids`` (one row each, fraction 1.0: a pool owning whole GPUs pays
1.0 GPU-hour per GPU-hour, MIG or not). A sender that places MIG GPU instances of GPUs shared across
tenants passes ``allocations=[{"gpu_uuid", "mig_gpu_instance_id", "mig_profile"}]``: one row
per instance, billed by its profile's share (:mod:`billing.fractions`).
"""

from __future__ import annotations

from django.dispatch import receiver

from nodepools.signals import node_ready, node_released, price_nodepool

from .ledger import close_allocations, open_allocation


@receiver(node_ready)
def open_ledger(sender, node, allocations=None, **kwargs) -> None:
    """Open one row per GPU (or GPU instance) the node holds, from ``node.ready_at``. Idempotent.

    A defragmentation run's replacement (:func:`nodepools.defrag.replacing`) is billed from
    the moment the node it replaces is released (its rows open then, see
    :func:`close_ledger`): a move the operator makes never bills the tenant twice.
    """
    from nodepools.defrag import replacing
    from nodepools.models import Node

    moved = replacing(node.id)
    start = node.ready_at
    if moved is not None:
        released = Node.objects.filter(pk=moved).values_list("released_at", flat=True).first()
        if released is None:
            return  # opened when the moved node is released
        start = max(start, released)
    _open(node, allocations, start)


def _open(node, allocations, start) -> None:
    if allocations is None:
        allocations = [
            {"gpu_uuid": uuid, "mig_profile": node.nodepool.isolation.get("mig_profile", "")}
            for uuid in node.gpu_uuids
        ]
    for alloc in allocations:
        open_allocation(
            node=node,
            gpu_uuid=alloc["gpu_uuid"],
            start=start,
            mig_gpu_instance_id=alloc.get("mig_gpu_instance_id"),
            mig_profile=alloc.get("mig_profile", ""),
        )


@receiver(node_released)
def close_ledger(sender, node, **kwargs) -> None:
    """Close the node's open rows at ``node.released_at`` (guarded UPDATE; idempotent); when
    a defragmentation run moved the node, its READY replacement's rows open at that instant."""
    from nodepools.defrag import replaced_by
    from nodepools.models import Node

    close_allocations(node, node.released_at)
    successor = replaced_by(node.id)
    if successor is None:
        return
    new = Node.objects.filter(
        pk=successor, ready_at__isnull=False, released_at__isnull=True
    ).first()
    if new is not None:
        _open(new, None, max(new.ready_at, node.released_at))


@receiver(price_nodepool)
def price_of_nodepool(
    sender, tenant_id, gpu_model, gpus, reservation=None, isolation=None, **kwargs
):
    """The dry run's ``cost``: ``{"currency", "basis", "gpus", "gpu_hours_per_hour",
    "unit_price", "hourly", "reservation_unit_price", "reservation_hourly"}``; when the price
    sheet has no rate for the model (and profile) now, ``{"cost_error": {...}}``: the usage
    API's ``cost_error`` (:func:`billing.invoices.missing_price`'s 409 body: ``code``
    missing_price, ``gpu_model``, ``mig_profile``, ``currency``, ``at``).

    ``hourly`` = one hour of the pool's GPU-hours at the on-demand rate in force
    (:func:`billing.prices.rate_segments`), rounded like an invoice line: ``gpus`` whole GPUs,
    or for a pool sharing GPUs across tenants (a MIG profile, ``tenancy: shared``) ``gpus``
    instances x the profile's billable fraction (:func:`billing.fractions.mig_billable_fraction`:
    1g.10gb of an H100 0.142857) — what its ledger rows will bill. 0 for a pool on an active
    reservation (its usage inside the reservation is covered), whose own charge is
    ``reservation_hourly`` = its ``gpus`` x the reservation rate ``reservation_unit_price``
    (the invoice's, :func:`billing.prices.reservation_rate_segments`); both None when the price
    sheet has no reservation rate (the invoice then fails ``missing_reservation_price``).
    """
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from .models import BillingAccount
    from .money import line_amount
    from .prices import rate_segments, reservation_rate_segments

    now = timezone.now()
    account = BillingAccount.objects.filter(tenant_id=tenant_id).first()
    currency = account.currency if account else "USD"
    later = now + timedelta(seconds=1)
    from .fractions import mig_billable_fraction, pool_shares_gpus_across_tenants

    gpu_hours = Decimal(gpus)
    profile = (isolation or {}).get("mig_profile")
    # the (model, profile) its ledger rows will carry (billing.receivers._open: every row of a
    # pool whose isolation names a MIG profile names it, dedicated or shared), so the rate is
    # the invoice's: the profile's own price, else the model's
    rated_profile = profile if isinstance(profile, str) else ""
    if pool_shares_gpus_across_tenants(isolation or {}) and rated_profile:
        gpu_hours = Decimal(gpus) * mig_billable_fraction(gpu_model, profile, now)
    segments = rate_segments(
        tenant_id=tenant_id,
        currency=currency,
        pairs={(gpu_model, rated_profile)},
        start=now,
        end=later,
    )
    price = segments[0].unit_price if segments else None
    if price is None:
        from .costs import reason
        from .invoices import missing_price

        return {"cost_error": reason(missing_price(gpu_model, rated_profile, currency, now))}
    seconds = gpu_hours * 3600
    answer = {
        "currency": currency,
        "basis": "on-demand",
        "gpus": gpus,
        "gpu_hours_per_hour": gpu_hours,
        "unit_price": price,
        "hourly": line_amount(seconds, price, currency),
        "reservation_unit_price": None,
        "reservation_hourly": None,
    }
    if reservation is not None:
        answer["basis"] = "reservation"
        answer["hourly"] = Decimal(0)
        rates = reservation_rate_segments(
            tenant_id=tenant_id, currency=currency, gpu_model=gpu_model, start=now, end=later
        )
        rate = rates[0].unit_price if rates else None
        answer["reservation_unit_price"] = rate
        if rate is not None:
            answer["reservation_hourly"] = line_amount(
                Decimal(reservation.gpus) * 3600, rate, currency
            )
    return answer
