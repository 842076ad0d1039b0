"""Host hygiene: a health check before a host serves tenants, a scrub after a tenant leaves.

Checks (:class:`fleet.models.HostCheck`)
    * ``onboarding``: the ``nvidia-smi -q -x`` report a host is imported from is real NVML
      output, so it *is* the onboarding check: it is read and recorded at import, and the host
      is schedulable at once unless a GPU fails it.
    * ``agent``: once registered, the agent's inventory (NVML through ``nvke-agent``) re-verifies
      the same facts; the first inventory after registration is always recorded, later ones
      when the result changes.
    * ``dcgm_diag``: ``dcgmi diag`` results, when the agent runs on a host with DCGM.

    Rules (per GPU, from the ``health`` facts the parser / agent report; nvml.md §3): a GPU
    that needs a reset (``reset_required``, pending row remapping or page retirement — both
    applied only by a reset), whose row remapping failed (Xid 64 territory), that NVIDIA
    recommends to drain and reset, or that counted uncorrectable ECC errors since the driver
    loaded, FAILS: it is marked unhealthy (a :class:`~fleet.models.GpuHealthInterval` with
    reason ``check_failed`` and ``needs_operator``) and never handed out until an operator
    marks it healthy. Lifetime (aggregate) uncorrectable ECC errors, retired pages and a MIG
    mode change waiting for a reset are WARNINGs: recorded, the GPU stays usable. Values a GPU
    does not report (``N/A``) are not findings.

Scrub (:class:`fleet.models.GpuScrub`)
    When a tenant releases a GPU (:func:`fleet.placement.release_gpus`) it becomes PENDING and
    is handed to nobody until its scrub is DONE: MIG instances torn down (when MIG was on),
    the GPU reset, its memory cleared. The agent does it: pending scrubs ride on the
    acknowledgement of every report (``commands``) until the agent reports their results
    (``scrub_results``). A host with no registered agent is simulated infrastructure (nothing
    can run there): its scrubs complete at once and say so in ``executor``. A scrub not
    confirmed within ``NVKE_SCRUB_TIMEOUT_S`` FAILS, which marks the GPU unhealthy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import conf
from .choices import (
    CheckKind,
    CheckStatus,
    HealthReason,
    HostEventKind,
    ScrubState,
    ScrubStatus,
)
from .models import Gpu, GpuScrub, Host, HostCheck, HostEvent

#: nvmlDeviceGpuRecoveryAction_t (catalog xid.yaml, xid154_recovery_actions): 0 is "None"
RECOVERY_ACTIONS = {
    1: (CheckStatus.FAILED.value, "GPU Reset Required"),
    2: (CheckStatus.FAILED.value, "Node Reboot Required"),
    3: (CheckStatus.WARNING.value, "Drain P2P"),
    4: (CheckStatus.FAILED.value, "Drain and Reset"),
}
SIMULATED_EXECUTOR = "control plane: no agent registered (simulated infrastructure)"
SCRUB_STEPS = ("mig_teardown", "gpu_reset", "memory_clear")


# --- checks ---------------------------------------------------------------------------------------


def gpu_findings(gpu_uuid: str, health: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Findings ``[{gpu_uuid, check, status, detail}]`` for one GPU's health facts.

    ``health`` keys (all optional, ``None`` = not reported): ``reset_required``,
    ``drain_and_reset_recommended``, ``remapped_rows_pending``, ``remapped_rows_failure``,
    ``retired_pages_pending``, ``ecc_volatile_uncorrected``, ``ecc_aggregate_uncorrected``,
    ``retired_pages_sbe``, ``retired_pages_dbe``, ``remapped_rows_uncorrectable``,
    ``mig_mode``, ``mig_mode_pending``, ``gpu_recovery_action`` (NVML field 230, the action
    Xid 154 announces: 1 GPU reset, 2 node reboot and 4 drain and reset fail; 3 drain P2P warns).
    """
    h = health or {}
    out: list[dict[str, Any]] = []

    def add(check: str, status: str, detail: str) -> None:
        out.append({"gpu_uuid": gpu_uuid, "check": check, "status": status, "detail": detail})

    failed = CheckStatus.FAILED.value
    warning = CheckStatus.WARNING.value
    if h.get("reset_required") is True:
        add("reset_required", failed, "the driver reports that the GPU requires a reset")
    if h.get("drain_and_reset_recommended") is True:
        add("drain_and_reset", failed, "NVIDIA recommends draining and resetting the GPU")
    if h.get("remapped_rows_failure") is True:
        add("remapped_rows", failed, "row remapping failed (see Xid 64): hardware ticket")
    if h.get("remapped_rows_pending") is True:
        add("remapped_rows", failed, "row remapping pending: a GPU reset is needed to apply it")
    if h.get("retired_pages_pending") is True:
        add("retired_pages", failed, "page retirement pending: a GPU reset is needed to apply it")
    volatile = h.get("ecc_volatile_uncorrected")
    if isinstance(volatile, int) and volatile > 0:
        add("ecc", failed, f"{volatile} uncorrectable ECC error(s) since the driver loaded")
    aggregate = h.get("ecc_aggregate_uncorrected")
    if isinstance(aggregate, int) and aggregate > 0:
        add("ecc", warning, f"{aggregate} uncorrectable ECC error(s) over the GPU's lifetime")
    for key, what in (
        ("retired_pages_dbe", "page(s) retired for double-bit ECC errors"),
        ("retired_pages_sbe", "page(s) retired for multiple single-bit ECC errors"),
        ("remapped_rows_uncorrectable", "row(s) remapped for uncorrectable errors"),
    ):
        value = h.get(key)
        if isinstance(value, int) and value > 0:
            add(key, warning, f"{value} {what}")
    action = h.get("gpu_recovery_action")
    if isinstance(action, int) and action in RECOVERY_ACTIONS:
        status, text = RECOVERY_ACTIONS[action]
        add("recovery_action", status, f"NVIDIA recovery action: {text}")
    current, pending = h.get("mig_mode"), h.get("mig_mode_pending")
    if current and pending and current != pending:
        add("mig_mode", warning, f"MIG mode {current}, {pending} after the next GPU reset")
    return out


def overall(findings: Iterable[dict[str, Any]]) -> str:
    """FAILED if any finding failed, WARNING if any warned, else PASSED."""
    statuses = {f["status"] for f in findings}
    if CheckStatus.FAILED in statuses:
        return CheckStatus.FAILED
    if CheckStatus.WARNING in statuses:
        return CheckStatus.WARNING
    return CheckStatus.PASSED


def record_check(
    host: Host,
    *,
    kind: str,
    source: str,
    findings: list[dict[str, Any]],
    gpu_count: int,
    now: datetime,
    actor: str = "system",
) -> HostCheck:
    """Store a check, mark GPUs with FAILED findings unhealthy, log a host event."""
    from .health import open_unhealthy

    status = overall(findings)
    check = HostCheck.objects.create(
        host=host, kind=kind, status=status, source=source, checked_at=now, findings=findings
    )
    failing = sorted({f["gpu_uuid"] for f in findings if f["status"] == CheckStatus.FAILED})
    HostEvent.objects.create(
        host=host,
        ts=now,
        kind=HostEventKind.CHECK,
        actor=actor,
        message=(
            f"{kind} check {status.lower()}: {gpu_count} GPU(s) read from {source}"
            + (f"; failing: {', '.join(failing)}" if failing else "")
        ),
        data={"check_id": check.id, "status": status},
    )
    for gpu in Gpu.objects.filter(host=host, uuid__in=failing):
        details = "; ".join(
            f["detail"]
            for f in findings
            if f["gpu_uuid"] == gpu.uuid and f["status"] == CheckStatus.FAILED
        )
        open_unhealthy(
            gpu,
            reason=HealthReason.CHECK_FAILED,
            at=now,
            needs_operator=True,
            detail=f"{kind} check: {details}"[:500],
        )
    return check


def check_from_inventory(host: Host, inventory_gpus: list[dict[str, Any]], now: datetime) -> None:
    """Agent re-verification: record an ``agent`` check when it is the first or has changed."""
    findings: list[dict[str, Any]] = []
    known = set(Gpu.objects.filter(host=host).values_list("uuid", flat=True))
    for gpu in inventory_gpus:
        if gpu.get("uuid") in known:
            facts = gpu.get("health")
            facts = dict(facts) if isinstance(facts, dict) else {}
            facts.setdefault("mig_mode", gpu.get("mig_mode"))
            findings.extend(gpu_findings(gpu["uuid"], facts))
    last = HostCheck.objects.filter(host=host, kind=CheckKind.AGENT).first()
    if last is not None and last.findings == findings:
        return
    record_check(
        host,
        kind=CheckKind.AGENT,
        source="NVML via nvke-agent",
        findings=findings,
        gpu_count=len(inventory_gpus),
        now=now,
        actor="agent",
    )


def record_dcgm_diagnostics(host: Host, diagnostics: Any, now: datetime) -> HostCheck | None:
    """Record ``dcgmi diag`` results sent by the agent (``{"command", "passed", "output"}``)."""
    if not isinstance(diagnostics, dict) or not isinstance(diagnostics.get("passed"), bool):
        return None
    status = CheckStatus.PASSED if diagnostics["passed"] else CheckStatus.FAILED
    findings = [
        {
            "gpu_uuid": "",
            "check": "dcgm_diag",
            "status": status.value,
            "detail": str(diagnostics.get("output", ""))[-1000:],
        }
    ]
    check = HostCheck.objects.create(
        host=host,
        kind=CheckKind.DCGM_DIAG,
        status=status,
        source=str(diagnostics.get("command", "dcgmi diag"))[:100],
        checked_at=now,
        findings=findings,
    )
    HostEvent.objects.create(
        host=host,
        ts=now,
        kind=HostEventKind.CHECK,
        actor="agent",
        message=f"DCGM diagnostics {status.lower()}",
        data={"check_id": check.id, "status": status},
    )
    return check


# --- scrubs ---------------------------------------------------------------------------------------


def request_scrubs(gpus: Sequence[Gpu], *, now: datetime) -> list[GpuScrub]:
    """Open a scrub for each released GPU (called by ``release_gpus`` in its transaction).

    Hosts without a registered agent complete theirs at once (simulated infrastructure).
    """
    hosts = {h.pk: h for h in Host.objects.filter(pk__in={g.host_id for g in gpus})}
    scrubs = []
    for gpu in gpus:
        scrub = GpuScrub.objects.filter(gpu=gpu, status=ScrubStatus.PENDING).first()
        if scrub is None:
            scrub = GpuScrub.objects.create(
                gpu=gpu,
                host_id=gpu.host_id,
                previous_tenant_id=gpu.holder_tenant_id,
                previous_holder_id=gpu.holder_id,
                mig_teardown=gpu.mig_mode == "enabled",
                requested_at=now,
            )
        scrubs.append(scrub)
        host = hosts[gpu.host_id]
        if not host.credential_hash:
            complete_scrub(
                scrub,
                ok=True,
                executor=SIMULATED_EXECUTOR,
                steps=[
                    {"step": step, "status": "simulated", "detail": "no agent on this host"}
                    for step in _steps_for(scrub)
                ],
                now=now,
            )
        else:
            HostEvent.objects.create(
                host=host,
                ts=now,
                kind=HostEventKind.SCRUB,
                message=f"scrub of {gpu.uuid} requested (waiting for the agent)",
                data={"scrub_id": scrub.id, "gpu_uuid": gpu.uuid},
            )
    return scrubs


def _steps_for(scrub: GpuScrub) -> list[str]:
    return [s for s in SCRUB_STEPS if s != "mig_teardown" or scrub.mig_teardown]


def complete_scrub(
    scrub: GpuScrub,
    *,
    ok: bool,
    executor: str,
    steps: list[dict[str, Any]],
    now: datetime,
) -> None:
    """Finish a PENDING scrub (guarded: a second result for it changes nothing)."""
    from .health import open_unhealthy

    status = ScrubStatus.DONE if ok else ScrubStatus.FAILED
    updated = GpuScrub.objects.filter(pk=scrub.pk, status=ScrubStatus.PENDING).update(
        status=status, completed_at=now, executor=executor[:100], steps=steps
    )
    if not updated:
        return
    gpu = Gpu.objects.get(pk=scrub.gpu_id)
    # Only a GPU still waiting for this scrub changes (nobody holds a PENDING GPU).
    Gpu.objects.filter(pk=gpu.pk, scrub_state=ScrubState.PENDING, holder_id__isnull=True).update(
        scrub_state=ScrubState.CLEAN if ok else ScrubState.FAILED
    )
    HostEvent.objects.create(
        host_id=scrub.host_id,
        ts=now,
        kind=HostEventKind.SCRUB,
        actor="agent" if executor != SIMULATED_EXECUTOR else "system",
        message=f"scrub of {gpu.uuid} {'done' if ok else 'FAILED'} ({executor})",
        data={"scrub_id": scrub.pk, "gpu_uuid": gpu.uuid, "steps": steps},
    )
    if not ok:
        failed = [s.get("step") for s in steps if s.get("status") == "failed"]
        open_unhealthy(
            gpu,
            reason=HealthReason.SCRUB_FAILED,
            at=now,
            needs_operator=True,
            detail=f"scrub failed at {', '.join(map(str, failed)) or 'an unknown step'}",
        )


def pending_scrub_commands(host: Host, now: datetime) -> list[dict[str, Any]]:
    """The scrub commands to put on a report acknowledgement for ``host``'s agent."""
    scrubs = list(
        GpuScrub.objects.filter(host=host, status=ScrubStatus.PENDING).select_related("gpu")
    )
    if not scrubs:
        return []
    GpuScrub.objects.filter(pk__in=[s.pk for s in scrubs], sent_at__isnull=True).update(sent_at=now)
    return [
        {
            "type": "scrub",
            "scrub_id": s.pk,
            "gpu_uuid": s.gpu.uuid,
            "gpu_index": s.gpu.index,
            "steps": _steps_for(s),
        }
        for s in scrubs
    ]


def apply_scrub_results(host: Host, results: Any, now: datetime) -> int:
    """Apply the agent's ``scrub_results``; returns how many scrubs finished."""
    if not isinstance(results, list):
        return 0
    done = 0
    for result in results:
        if not isinstance(result, dict) or not isinstance(result.get("scrub_id"), int):
            continue
        scrub = GpuScrub.objects.filter(
            pk=result["scrub_id"], host=host, status=ScrubStatus.PENDING
        ).first()
        if scrub is None:
            continue
        steps = [s for s in result.get("steps") or [] if isinstance(s, dict)]
        complete_scrub(
            scrub,
            ok=bool(result.get("ok")),
            executor=str(result.get("executor") or "nvke-agent"),
            steps=steps,
            now=now,
        )
        done += 1
    return done


def fail_overdue_scrubs(now: datetime | None = None) -> int:
    """Scrubs pending longer than ``NVKE_SCRUB_TIMEOUT_S`` FAIL (beat task)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=conf.scrub_timeout_s())
    count = 0
    for scrub in GpuScrub.objects.filter(status=ScrubStatus.PENDING, requested_at__lt=cutoff):
        with transaction.atomic():
            complete_scrub(
                scrub,
                ok=False,
                executor="control plane: timeout",
                steps=[
                    {
                        "step": step,
                        "status": "failed",
                        "detail": f"not confirmed by the agent within {conf.scrub_timeout_s():g} s",
                    }
                    for step in _steps_for(scrub)
                ],
                now=now,
            )
        count += 1
    return count
