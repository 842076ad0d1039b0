"""Fleet use-cases: import a host, register its agent, change host state, operator actions.

Operator actions (DESIGN §10 host states)::

    cordon       AVAILABLE/ALLOCATED/NOT_READY/FAILED -> CORDONED (held GPUs stay, no new ones)
    uncordon     CORDONED/MAINTENANCE/FAILED -> AVAILABLE or ALLOCATED (by whether GPUs are held)
    drain        -> CORDONED now, ``host_drain_requested`` sent for the nodes on it (the node
                 pools move them: :mod:`nodepools.host_moves`); once no GPU is held the host
                 enters the drain target (CORDONED by default). Its reason counts the nodes
                 moved and pending
    maintenance  a drain whose target is MAINTENANCE (at once when nothing is held)
    retire       a drain whose target is RETIRED; a retired host's agent credential and
                 bootstrap token stop working; RETIRED is final
    bootstrap token  re-issued (the old token and the agent's credential stop working)

Auto-repair lifts a cordon the agent placed for a GPU fault once the repair is verified
(:func:`lift_repaired_cordon`, through the same uncordon).

Each records a :class:`~fleet.models.HostEvent`; state changes are guarded UPDATEs
(``filter(pk=…, state__in=allowed).update(…)``) and send ``host_state_changed`` on commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from nvke_agent.smi_xml import NotAnNvidiaSmiReport, SmiReport, parse_nvidia_smi_xml

from catalog.models import GpuModel
from catalog.services import match_product_name
from nvke.errors import Conflict, InvalidInput
from tenants import audit

from . import formats, host_warnings, hygiene, nvlink_domains, topology
from .choices import SCHEDULABLE_HOST_STATES, CheckKind, GpuHealth, HostEventKind, HostState
from .models import Gpu, Host, HostEvent, region_of_zone
from .secrets import digest, new_token
from .signals import (
    commitments_broken,
    host_drain_checked,
    host_drain_requested,
    host_state_changed,
)


@dataclass(frozen=True)
class ImportedHost:
    """The created host and its one-time bootstrap token (shown once, stored hashed)."""

    host: Host
    bootstrap_token: str


def _check_region(zone: str, region: str) -> None:
    """An explicit ``region`` must be the one the zone's cloud name gives, where it has one:
    ``us-east-1c`` is AWS's us-east-1 and ``europe-west1-c`` GCP's europe-west1
    (:func:`region_of_zone`), so they take only that region (not ``europe-west1``, ``us``,
    ``us-east`` or the zone itself). A zone the naming conventions say nothing of (Azure's
    ``1``, ``rack-a``, ``dc1-rack2``) takes any region, which is then its only one
    (:func:`fleet.models.host_in_region`). InvalidInput ``zone_not_in_region`` (field
    ``region``): such a host counted in two regions, by its zone and by its region."""
    derived = region_of_zone(zone)
    if region and derived != zone and region != derived:
        raise InvalidInput(
            f"zone {zone!r} is in region {derived!r} by its name, not {region!r}",
            code="zone_not_in_region",
            field="region",
        )


def import_host(
    *,
    hostname: str,
    zone: str,
    nvidia_smi_xml: str,
    rack: str = "",
    region: str = "",
    nvidia_smi_topo: str = "",
    nvlink_cluster_uuid: str = "",
    nvlink_clique_id: str | int = "",
    actor: str = "system",
) -> ImportedHost:
    """Create a host with the GPUs present in a real ``nvidia-smi -q -x`` report.

    Each GPU's product name must match a catalog GPU model. A report whose ``attached_gpus``
    differs from the ``<gpu>`` elements present is imported with a warning on the host.
    ``region`` defaults to the zone's region (:func:`fleet.models.region_of_zone`);
    ``nvidia_smi_topo`` (the text of ``nvidia-smi topo -m``) gives the NVLink topology;
    ``nvlink_cluster_uuid`` + ``nvlink_clique_id`` the multi-node NVLink domain (else the
    report's ``<fabric>`` section when its GPUs agree, :mod:`fleet.nvlink_domains`). The
    report is recorded as the host's onboarding check (:mod:`fleet.hygiene`); the host is
    AVAILABLE at once, with any GPU that fails the check unhealthy.

    Raises InvalidInput (400: ``zone_not_in_region`` (:func:`_check_region`),
    ``invalid_nvidia_smi_xml``, ``unknown_gpu_product``,
    ``mixed_gpu_models``, ``no_gpus``, ``invalid_nvidia_smi_topo``, and the format checks of
    :func:`fleet.formats.check_smi_report`: ``too_many_gpus``, ``invalid_gpu_uuid``,
    ``duplicate_gpu_uuid``, ``value_too_long`` …) or Conflict (409:
    ``duplicate_hostname``, ``duplicate_gpu_uuid``). Nothing is written when any check fails.
    """
    _check_region(zone, region)
    report = _parse(nvidia_smi_xml)
    try:
        formats.check_smi_report(report)
    except formats.FormatError as exc:
        raise InvalidInput(str(exc), code=exc.code, field=exc.field) from exc
    model = _single_model(report)
    domain, domain_warning = _import_domain(report, nvlink_cluster_uuid, nvlink_clique_id)
    topo = _topology(nvidia_smi_topo, len(report.gpus)) if nvidia_smi_topo.strip() else {}
    islands = topology.island_of(topo)
    warnings: list[str] = []
    if report.attached_gpus is not None and report.attached_gpus != len(report.gpus):
        warnings.append(
            f"report says attached_gpus={report.attached_gpus} but contains "
            f"{len(report.gpus)} <gpu> element(s); imported the {len(report.gpus)} present"
        )
    if domain_warning:
        warnings.append(domain_warning)
    token = new_token()
    try:
        with transaction.atomic():
            if Host.objects.filter(hostname=hostname).exists():
                raise Conflict(
                    f"a host named {hostname!r} already exists",
                    code="duplicate_hostname",
                    field="hostname",
                )
            _refuse_known_uuids(report)
            now = timezone.now()
            host = Host.objects.create(
                hostname=hostname,
                region=region or region_of_zone(zone),
                zone=zone,
                rack=rack,
                state=HostState.AVAILABLE,
                state_changed_at=now,
                topology=topo,
                nvlink_cluster_uuid=domain.cluster_uuid if domain else None,
                nvlink_clique_id=domain.clique_id if domain else None,
                gpu_model=model,
                gpu_count=len(report.gpus),
                driver_version=report.driver_version or "",
                cuda_version=report.cuda_version or "",
                warnings=warnings,
                bootstrap_token_hash=digest(token),
                bootstrap_token_expires_at=timezone.now() + settings.NVKE_BOOTSTRAP_TOKEN_TTL,
            )
            Gpu.objects.bulk_create(
                [
                    Gpu(
                        uuid=g.uuid,
                        host=host,
                        index=g.index,
                        pci_bus_id=g.pci_bus_id,
                        minor_number=g.minor_number,
                        gpu_model=model,
                        product_name=g.product_name,
                        memory_total_bytes=g.memory_total_bytes,
                        mig_mode=g.mig_mode,
                        mig_devices=[_mig_device_dict(d) for d in g.mig_devices],
                        nvlink_island=islands.get(g.index) if islands else None,
                        serial=g.attributes.get("serial") or "",
                        attributes=g.attributes,
                        health_counters=g.health,
                    )
                    for g in report.gpus
                ]
            )
            HostEvent.objects.create(
                host=host,
                ts=now,
                kind=HostEventKind.IMPORTED,
                actor=actor,
                to_state=HostState.AVAILABLE,
                message=f"imported with {len(report.gpus)} x {model.slug} from nvidia-smi -q -x"
                + (f" and {topo['source']}" if topo else ""),
            )
            findings = [
                f
                for g in report.gpus
                for f in hygiene.gpu_findings(g.uuid, {**g.health, "mig_mode": g.mig_mode})
            ]
            hygiene.record_check(
                host,
                kind=CheckKind.ONBOARDING,
                source="nvidia-smi -q -x report",
                findings=findings,
                gpu_count=len(report.gpus),
                now=now,
                actor=actor,
            )
    except IntegrityError as exc:  # a concurrent import won the race for a name or UUID
        raise Conflict(
            "a host with this hostname or one of these GPU UUIDs was imported concurrently",
            code="duplicate_gpu_uuid",
            field="nvidia_smi_xml",
        ) from exc
    return ImportedHost(host=host, bootstrap_token=token)


def reissue_bootstrap_token(host: Host, *, actor: str = "system") -> str:
    """New one-time bootstrap token for ``host`` (the old one and the credential stop working).

    Raises Conflict ``host_retired`` for a retired host.
    """
    token = new_token()
    now = timezone.now()
    with transaction.atomic():
        updated = (
            Host.objects.filter(pk=host.pk)
            .exclude(state=HostState.RETIRED)
            .update(
                bootstrap_token_hash=digest(token),
                bootstrap_token_expires_at=now + settings.NVKE_BOOTSTRAP_TOKEN_TTL,
                bootstrap_token_used_at=None,
                credential_hash="",
            )
        )
        if not updated:
            raise Conflict(
                f"host {host.hostname} is retired; it gets no new agent token",
                code="host_retired",
            )
        HostEvent.objects.create(
            host=host,
            ts=now,
            kind=HostEventKind.ACTION,
            actor=actor,
            message="bootstrap token re-issued; the agent's credential was revoked",
        )
    return token


class InvalidBootstrapToken(Exception):
    """The bootstrap token is unknown, already used or expired."""


def register_agent(*, bootstrap_token: str, agent_version: str = "") -> tuple[Host, str]:
    """Exchange a one-time bootstrap token for a per-host credential.

    Returns ``(host, credential)``; the credential is shown once and stored hashed.
    Raises InvalidBootstrapToken.
    """
    now = timezone.now()
    credential = new_token()
    with transaction.atomic():
        host = (
            Host.objects.select_for_update()
            .filter(bootstrap_token_hash=digest(bootstrap_token), bootstrap_token_used_at=None)
            .exclude(bootstrap_token_hash="")
            .first()
        )
        if host is None:
            raise InvalidBootstrapToken("the bootstrap token is unknown or was already used")
        if host.bootstrap_token_expires_at and host.bootstrap_token_expires_at < now:
            raise InvalidBootstrapToken(
                "the bootstrap token has expired; ask an operator for a new one"
            )
        if host.state == HostState.RETIRED:
            raise InvalidBootstrapToken("the host is retired")
        host.bootstrap_token_used_at = now
        host.credential_hash = digest(credential)
        host.registered_at = now
        host.agent_version = agent_version[:32]
        host.save(
            update_fields=[
                "bootstrap_token_used_at",
                "credential_hash",
                "registered_at",
                "agent_version",
            ]
        )
        HostEvent.objects.create(
            host=host,
            ts=now,
            kind=HostEventKind.REGISTERED,
            actor="agent",
            message=f"agent registered (nvke-agent {agent_version or 'unknown version'})",
        )
        # a new credential ends a shared one: the copy that used the old one gets 401 now
        host_warnings.set_host_warning(host.pk, host_warnings.AGENT_IDENTITY, None)
    return host, credential


def _parse(xml: str) -> SmiReport:
    try:
        report = parse_nvidia_smi_xml(xml)
    except NotAnNvidiaSmiReport as exc:
        raise InvalidInput(
            f"not an nvidia-smi -q -x report: {exc}",
            code="invalid_nvidia_smi_xml",
            field="nvidia_smi_xml",
        ) from exc
    if not report.gpus:
        raise InvalidInput(
            "the report contains no <gpu> element", code="no_gpus", field="nvidia_smi_xml"
        )
    return report


def _import_domain(
    report: SmiReport, cluster_uuid: str, clique_id: str | int
) -> tuple[nvlink_domains.Domain | None, str]:
    """The NVLink domain an import gives the host, and a warning (the report's GPUs disagree
    or their fabric registration is not complete). Given fields win over the report; one
    without the other is a 400 naming the missing one."""
    given = (str(cluster_uuid).strip(), str(clique_id).strip())
    if any(given):
        if not all(given):
            missing = "nvlink_clique_id" if given[0] else "nvlink_cluster_uuid"
            raise InvalidInput(
                "nvlink_cluster_uuid and nvlink_clique_id are given together",
                code="incomplete_nvlink_domain",
                field=missing,
            )
        try:
            return (
                nvlink_domains.Domain(
                    nvlink_domains.parse_cluster_uuid(given[0], "nvlink_cluster_uuid"),
                    nvlink_domains.parse_clique_id(given[1], "nvlink_clique_id", text=True),
                ),
                "",
            )
        except formats.FormatError as exc:
            raise InvalidInput(str(exc), code=exc.code, field=exc.field) from exc
    fabric = [{"uuid": g.uuid, "fabric": g.fabric} for g in report.gpus]
    for i, entry in enumerate(fabric):
        try:
            nvlink_domains.check_fabric(entry["fabric"], f"nvidia_smi_xml.gpu[{i}].fabric")
        except formats.FormatError as exc:
            raise InvalidInput(str(exc), code=exc.code, field=exc.field) from exc
    reported = nvlink_domains.domain_from_gpus(fabric)
    warning = f"{nvlink_domains.WARNING_PREFIX} {reported.problem}" if reported.problem else ""
    return reported.domain, warning


def _single_model(report: SmiReport) -> GpuModel:
    models: dict[str, GpuModel] = {}
    for gpu in report.gpus:
        model = match_product_name(gpu.product_name)
        if model is None:
            raise InvalidInput(
                f"GPU product {gpu.product_name!r} (GPU {gpu.uuid}) is not in the GPU catalog",
                code="unknown_gpu_product",
                field="nvidia_smi_xml",
                extra={"product_name": gpu.product_name},
            )
        models[model.slug] = model
    if len(models) > 1:
        raise InvalidInput(
            f"a host must hold one GPU model; the report has {sorted(models)}",
            code="mixed_gpu_models",
            field="nvidia_smi_xml",
        )
    return next(iter(models.values()))


def _refuse_known_uuids(report: SmiReport) -> None:
    known = (
        Gpu.objects.filter(uuid__in=[g.uuid for g in report.gpus]).select_related("host").first()
    )
    if known is not None:
        raise Conflict(
            f"GPU {known.uuid} already belongs to host {known.host.hostname}",
            code="duplicate_gpu_uuid",
            field="nvidia_smi_xml",
            extra={"gpu_uuid": known.uuid, "host": known.host.hostname},
        )


def _topology(text: str, gpu_count: int) -> dict[str, Any]:
    try:
        topo = topology.parse_nvidia_smi_topo(text)
    except topology.InvalidTopology as exc:
        raise InvalidInput(
            f"not an nvidia-smi topo -m matrix: {exc}",
            code="invalid_nvidia_smi_topo",
            field="nvidia_smi_topo",
        ) from exc
    if topo["gpus"] != gpu_count:
        raise InvalidInput(
            f"the topology has {topo['gpus']} GPU(s), the report {gpu_count}",
            code="invalid_nvidia_smi_topo",
            field="nvidia_smi_topo",
        )
    return topo


def _mig_device_dict(device) -> dict:
    return {
        "index": device.index,
        "gpu_instance_id": device.gpu_instance_id,
        "compute_instance_id": device.compute_instance_id,
        "uuid": device.uuid,
        "multiprocessor_count": device.multiprocessor_count,
        "memory_total_bytes": device.memory_total_bytes,
    }


# --- host state ----------------------------------------------------------------------------------


def holders_on(host_id: Any) -> list[Any]:
    """Node ids holding GPUs of the host, each once (order_by(): Gpu's default ordering would
    make DISTINCT count GPUs, not nodes); on a shared host, the nodes holding GPU instances."""
    from .models import GpuInstance

    whole = set(
        Gpu.objects.filter(host_id=host_id, holder_id__isnull=False)
        .order_by()
        .values_list("holder_id", flat=True)
        .distinct()
    )
    slices = set(
        GpuInstance.objects.filter(host_id=host_id, state="ACTIVE")
        .order_by()
        .values_list("holder_id", flat=True)
        .distinct()
    )
    return sorted(whole | slices, key=str)


def change_host_state(
    host_id: Any,
    *,
    to: str,
    allowed_from: Iterable[str],
    reason: str,
    now: datetime,
    actor: str = "system",
    extra_filter: dict[str, Any] | None = None,
    updates: dict[str, Any] | None = None,
) -> bool:
    """Guarded state change (``UPDATE … WHERE state IN allowed_from``); False if it lost.

    ``actor`` is stored with the state (``Host.state_actor``, also when the state is set again:
    the current state's actor is the latest to set it). Records a host event and sends
    ``host_state_changed`` on commit.
    """
    with transaction.atomic():
        before = (
            Host.objects.filter(pk=host_id, state__in=list(allowed_from), **(extra_filter or {}))
            .values_list("state", flat=True)
            .first()
        )
        if before is None:
            return False
        updated = Host.objects.filter(pk=host_id, state=before, **(extra_filter or {})).update(
            state=to,
            state_reason=reason[:300],
            state_changed_at=now,
            state_actor=actor[:100],
            **(updates or {}),
        )
        if not updated:
            return False
        if before != to:
            HostEvent.objects.create(
                host_id=host_id,
                ts=now,
                kind=HostEventKind.STATE,
                actor=actor[:100],
                from_state=before,
                to_state=to,
                message=reason[:500],
            )
            holder_ids = holders_on(host_id)
            transaction.on_commit(
                lambda: host_state_changed.send(
                    sender=Host,
                    host_id=host_id,
                    old_state=str(before),
                    new_state=str(to),
                    reason=reason,
                    holder_ids=holder_ids,
                )
            )
        return True


def settle_host_state(host_id: Any, *, now: datetime) -> None:
    """After GPUs were claimed or released: ALLOCATED <-> AVAILABLE by whether any is held,
    and a draining host with nothing held enters its drain target (with GPUs still held, its
    reason says how many nodes are moved and how many are pending)."""
    host = Host.objects.filter(pk=host_id).values("state", "drain_target", "drain_nodes").first()
    if host is None:
        return
    pending = len(holders_on(host_id))
    if host["drain_target"] and not pending:
        _finish_drain(host_id, host["drain_target"], now=now)
    elif host["drain_target"]:
        Host.objects.filter(pk=host_id, drain_target=host["drain_target"]).update(
            state_reason=drain_progress(host["drain_target"], host["drain_nodes"], pending)
        )
    elif pending and host["state"] == HostState.AVAILABLE:
        change_host_state(
            host_id,
            to=HostState.ALLOCATED,
            allowed_from=(HostState.AVAILABLE,),
            reason="GPUs held",
            now=now,
        )
    elif not pending and host["state"] == HostState.ALLOCATED:
        change_host_state(
            host_id,
            to=HostState.AVAILABLE,
            allowed_from=(HostState.ALLOCATED,),
            reason="no GPU held",
            now=now,
        )


def drain_progress(target: str, total: int, pending: int) -> str:
    """What a drain has done and what is left, counting nodes (not GPUs)::

    draining to MAINTENANCE: 1 of 2 node(s) moved, 1 pending
    drained to MAINTENANCE: 2 of 2 node(s) moved, none pending
    """
    total = max(total, pending)
    moved = total - pending
    if not pending:
        return f"drained to {target}: {moved} of {total} node(s) moved, none pending"
    return f"draining to {target}: {moved} of {total} node(s) moved, {pending} pending"


def _finish_drain(host_id: Any, target: str, *, now: datetime) -> None:
    total = Host.objects.filter(pk=host_id).values_list("drain_nodes", flat=True).first() or 0
    updates: dict[str, Any] = {
        "drain_target": "",
        "drain_requested_at": None,
        "drain_nodes": 0,
        "drain_force": False,
    }
    if target == HostState.RETIRED:
        updates.update(credential_hash="", bootstrap_token_hash="")
    change_host_state(
        host_id,
        to=target,
        allowed_from=[s for s in HostState.values if s != HostState.RETIRED],
        reason=drain_progress(target, total, 0),
        now=now,
        updates=updates,
    )


# --- operator actions -----------------------------------------------------------------------------

CORDONABLE = (*SCHEDULABLE_HOST_STATES, HostState.NOT_READY, HostState.FAILED, HostState.CORDONED)
UNCORDONABLE = (HostState.CORDONED, HostState.MAINTENANCE, HostState.FAILED)
DRAIN_TARGETS = (HostState.CORDONED, HostState.MAINTENANCE, HostState.RETIRED)
#: the drain fields of a host that is not draining (cordon and uncordon cancel a drain)
NO_DRAIN: dict[str, Any] = {
    "drain_target": "",
    "drain_requested_at": None,
    "drain_nodes": 0,
    "drain_force": False,
}


def _action(host: Host, actor: str, message: str, now: datetime, **data: Any) -> None:
    HostEvent.objects.create(
        host=host, ts=now, kind=HostEventKind.ACTION, actor=actor[:100], message=message, data=data
    )


def _refuse(host: Host, action: str, allowed: Iterable[str]) -> Conflict:
    return Conflict(
        f"cannot {action} host {host.hostname} in state {host.state} "
        f"(allowed from {', '.join(allowed)})",
        code="invalid_host_state",
        field="state",
        extra={"state": host.state},
    )


def cordon_host(host: Host, *, actor: str, reason: str = "") -> Host:
    """Stop placing new nodes on ``host`` (nodes on it keep running). Idempotent."""
    now = timezone.now()
    with transaction.atomic():
        host = Host.objects.select_for_update(no_key=True).get(pk=host.pk)
        if host.state not in CORDONABLE:
            raise _refuse(host, "cordon", CORDONABLE)
        _action(host, actor, f"cordon{': ' + reason if reason else ''}", now)
        change_host_state(
            host.pk,
            to=HostState.CORDONED,
            allowed_from=CORDONABLE,
            reason=f"cordoned by {actor}{': ' + reason if reason else ''}",
            now=now,
            actor=actor,
            updates=NO_DRAIN,
        )
    return Host.objects.get(pk=host.pk)


def uncordon_host(host: Host, *, actor: str) -> Host:
    """Make a cordoned / maintenance / failed host schedulable again (cancels a drain)."""
    now = timezone.now()
    with transaction.atomic():
        host = Host.objects.select_for_update(no_key=True).get(pk=host.pk)
        if host.state not in UNCORDONABLE:
            raise _refuse(host, "uncordon", UNCORDONABLE)
        _uncordon(host, actor=actor, action="uncordon", reason=f"uncordoned by {actor}", now=now)
    return Host.objects.get(pk=host.pk)


def _uncordon(
    host: Host,
    *,
    actor: str,
    action: str,
    reason: str,
    now: datetime,
    allowed_from: Iterable[str] = UNCORDONABLE,
    extra_filter: dict[str, Any] | None = None,
) -> bool:
    """The uncordon itself, on a host row locked by the caller: AVAILABLE or ALLOCATED by
    whether GPUs are held, the drain fields cleared, ``action`` recorded as an ACTION event.
    False (and nothing recorded) when the guarded UPDATE lost."""
    target = HostState.ALLOCATED if holders_on(host.pk) else HostState.AVAILABLE
    with transaction.atomic():
        _action(host, actor, action, now)
        done = change_host_state(
            host.pk,
            to=target,
            allowed_from=allowed_from,
            reason=reason,
            now=now,
            actor=actor,
            extra_filter=extra_filter,
            updates=NO_DRAIN,
        )
        if not done:  # the row is locked by the caller: only a filter it did not check
            transaction.set_rollback(True)
    return done


#: who lifts a cordon after a verified repair (the REPAIR_NODES operations' ``requested_by``)
AUTO_REPAIR_ACTOR = "system:auto-repair"


def lift_repaired_cordon(host_id: Any, *, repaired: str, now: datetime) -> bool:
    """Auto-repair verified a repair on ``host_id`` (``repaired``: the GPU UUIDs whose
    unhealthy interval it closed, or what else names them): lift the host's cordon if the
    health path placed it for a GPU fault and nothing else holds the host. True when lifted.

    Lifted only when, on the locked host row, all of these hold:

    - the host is CORDONED, not draining, and its current state's actor
      (``Host.state_actor``) is :data:`fleet.health.CORDON_ACTOR` (``agent``): an operator's
      cordon — placed before the fault (the health path then leaves the host alone) or after
      it (which makes the cordon the operator's) — a drain, MAINTENANCE, FAILED and RETIRED
      stay as they are, as does a cordon of unknown actor (set before actors were stored);
    - no GPU of the host has an open unhealthy interval or is not HEALTHY (an UNKNOWN GPU has
      no interval): a second faulty GPU keeps the host cordoned until its own repair is
      verified, and that repair lifts it.

    The host goes back to ALLOCATED or AVAILABLE by whether GPUs are held (as
    :func:`uncordon_host`), with actor :data:`AUTO_REPAIR_ACTOR` and the reason and ACTION
    event ``uncordoned: repair of <repaired> verified``. Idempotent: a host already lifted is
    no longer CORDONED. Lifting is no cordon: the circuit breaker (:mod:`fleet.breaker`)
    counts nothing for it.

    A node *replaced* onto another host (the reboot did not repair it, or the fault needs
    hardware) is no verified repair of this host: its cordon stays for an operator to check
    the hardware and uncordon.
    """
    from .health import CORDON_ACTOR
    from .models import GpuHealthInterval

    with transaction.atomic():
        host = Host.objects.select_for_update(no_key=True).filter(pk=host_id).first()
        if (
            host is None
            or host.state != HostState.CORDONED
            or host.drain_target
            or host.state_actor != CORDON_ACTOR
        ):
            return False
        # Race with a new fault being ingested: opening its interval also updates the GPU row,
        # whose summary trigger (migration 0003) updates this host row in the same
        # transaction. So either that transaction holds the row and this lock waits for its
        # commit (the new interval is then seen below), or it waits for this one and its
        # cordon then finds the host schedulable and cordons it again.
        if GpuHealthInterval.objects.filter(host_id=host_id, ended_at__isnull=True).exists():
            return False
        if Gpu.objects.filter(host_id=host_id).exclude(health=GpuHealth.HEALTHY).exists():
            return False
        message = f"uncordoned: repair of {repaired} verified"
        return _uncordon(
            host,
            actor=AUTO_REPAIR_ACTOR,
            action=message,
            reason=message,
            now=now,
            allowed_from=(HostState.CORDONED,),
            extra_filter={"state_actor": CORDON_ACTOR, "drain_target": ""},
        )


def drain_host(
    host: Host, *, actor: str, target: str = HostState.CORDONED, force: bool = False
) -> Host:
    """Cordon now, ask the layers above to move the nodes off, then enter ``target``.

    ``host_drain_requested`` is sent on commit; the node pool reconcilers move each node
    (:mod:`nodepools.host_moves`). ``force`` evicts pods that block a node's drain (as an
    upgrade's ``force``); asking again on a draining host (say with ``force`` after a drain was
    reported blocked) is safe: the nodes already moved stay counted. The host's reason says
    what is done and what is pending, in nodes. The drain counts against its GPU model's
    circuit-breaker budget (:mod:`fleet.breaker`) but is never refused by it.

    A drain that would leave a pool short — no other host for its nodes, whether or not it
    draws on an ACTIVE reservation (:mod:`nodepools.commitments`) — is refused unless
    ``force`` or the host is failing (:func:`_check_commitments`: audited, the tenants told).

    Raises InvalidInput ``invalid_drain_target`` / Conflict ``invalid_host_state`` /
    Conflict ``commitment_would_break`` (``commitments``: what would break).
    """
    if target not in DRAIN_TARGETS:
        raise InvalidInput(
            f"a drain ends in one of {', '.join(DRAIN_TARGETS)}, not {target!r}",
            code="invalid_drain_target",
            field="target",
        )
    now = timezone.now()
    with transaction.atomic():
        host = Host.objects.select_for_update(no_key=True).get(pk=host.pk)
        allowed = [s for s in HostState.values if s != HostState.RETIRED]
        if host.state not in allowed:
            raise _refuse(host, "drain", allowed)
        holder_ids = holders_on(host.pk)
        broken = _check_commitments(host, holder_ids, actor=actor, force=force)
        if not host.drain_target:  # counts against the GPU model's budget, never blocked
            from .breaker import record_cordon

            record_cordon(
                target=f"host {host.hostname} (drain to {target})",
                gpu_model=host.gpu_model_id,
                pool_id=None,
                actor=actor,
                automatic=False,
                now=now,
            )
        # a repeated drain keeps counting the nodes already moved off
        moved = max(host.drain_nodes - len(holder_ids), 0) if host.drain_target else 0
        total = moved + len(holder_ids)
        _action(
            host,
            actor,
            f"drain to {target}{' (force)' if force else ''}: {len(holder_ids)} node(s) to move"
            + (f"; breaks {'; '.join(str(b) for b in broken)}" if broken else ""),
            now,
            target=target,
            force=force,
            holder_ids=[str(h) for h in holder_ids],
        )
        if not holder_ids:
            Host.objects.filter(pk=host.pk).update(drain_nodes=total)
            _finish_drain(host.pk, target, now=now)
        else:
            draining = {
                "drain_target": target,
                "drain_requested_at": host.drain_requested_at or now,
                "drain_nodes": total,
                "drain_force": force,
            }
            reason = drain_progress(target, total, len(holder_ids))
            if not change_host_state(
                host.pk,
                to=HostState.CORDONED,
                allowed_from=allowed,
                reason=reason,
                now=now,
                actor=actor,
                updates=draining,
            ):  # pragma: no cover - the row is locked above
                raise _refuse(host, "drain", allowed)
            host_id = host.pk
            transaction.on_commit(
                lambda: host_drain_requested.send(
                    sender=Host,
                    host_id=host_id,
                    holder_ids=holder_ids,
                    target_state=target,
                    force=force,
                )
            )
    return Host.objects.get(pk=host.pk)


#: a drain of a host in one of these states is an emergency: never refused for commitments
EMERGENCY_STATES = (HostState.NOT_READY, HostState.FAILED)


def _check_commitments(host: Host, holder_ids: list, *, actor: str, force: bool) -> list:
    """What the drain would break (:data:`fleet.signals.host_drain_checked`'s receivers).

    Nothing: []. Otherwise, a drain neither forced nor an emergency (the host
    :data:`EMERGENCY_STATES`) raises Conflict ``commitment_would_break`` naming each
    pool (and reservation) and what is missing; a forced or emergency drain goes ahead, audited
    (``host.drain.commitment_broken``, one event per broken commitment, in this transaction), and
    :data:`fleet.signals.commitments_broken` is sent on commit (the tenants' webhook event).
    """
    if not holder_ids:
        return []
    broken = [
        item
        for _receiver, answer in host_drain_checked.send(
            sender=Host, host_id=host.pk, holder_ids=holder_ids
        )
        for item in answer or ()
    ]
    if not broken:
        return []
    emergency = host.state in EMERGENCY_STATES
    if not (force or emergency):
        raise Conflict(
            f"draining host {host.hostname} would break "
            + "; ".join(str(b) for b in broken)
            + ". Drain with force to go ahead (the tenants are told)",
            code="commitment_would_break",
            field="force",
            extra={"commitments": [b.as_dict() for b in broken]},
        )
    why = "force" if force else "emergency"
    for b in broken:
        audit.record(
            actor=actor,
            action="host.drain.commitment_broken",
            target_type="reservation" if b.reservation_id else "nodepool",
            target_id=b.reservation_id or b.nodepool_id,
            tenant_id=b.tenant_id,
            after={"host": host.hostname, "why": why, **b.as_dict()},
        )
    host_id, hostname = host.pk, host.hostname
    transaction.on_commit(
        lambda: commitments_broken.send(
            sender=Host,
            host_id=host_id,
            hostname=hostname,
            actor=actor,
            why=why,
            commitments=broken,
        )
    )
    return broken


def set_maintenance(host: Host, *, actor: str) -> Host:
    """Drain ``host`` into MAINTENANCE (at once when nothing is held)."""
    return drain_host(host, actor=actor, target=HostState.MAINTENANCE)


def retire_host(host: Host, *, actor: str) -> Host:
    """Drain ``host`` into RETIRED (final; its agent credential stops working)."""
    return drain_host(host, actor=actor, target=HostState.RETIRED)
