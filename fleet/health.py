"""GPU and host health: unhealthy intervals, Xid events, missed heartbeats.

* :func:`open_unhealthy` / :func:`close_unhealthy` keep :class:`fleet.models.GpuHealthInterval`
  (one open interval per GPU at most, never overlapping) and ``Gpu.health`` in step, and send
  :data:`fleet.signals.gpu_health_changed` once the change commits.
* :func:`handle_xid` / :func:`handle_xids` run Xids through the health rules in effect
  (:mod:`fleet.health_rules`: the catalog's table as defaults — every critical Xid, threshold 1
  — with the operator's overrides): a rule that fires marks the GPU unhealthy (with the rule's
  ``needs_operator``) and records its ladder step (``GpuHealthInterval.rule_action``:
  what auto-repair does); a firing whose Xid action is host-scoped (:mod:`catalog.xid_actions`,
  the one Xid-action table: ``RESTART_BM``, ``CHECK_MECHANICALS``) or whose step is a hardware
  ticket also cordons the host. Xids no rule decides, or below a rule's threshold, are
  recorded only. An Xid the catalog does not know is decided as critical unless it is one of
  the application-error Xids NVIDIA's device plugin ignores (13, 31, 43, 45, 68, 109: nvml.md
  §5, [DP]).
* :func:`handle_samples` runs a report's stored samples through the rules on sample signals
  (ECC counts, thermal/power slowdowns; occurrences defined in :mod:`fleet.health_rules`): a
  firing opens a ``health_rule`` interval with the rule's condition and ladder step, as an Xid
  rule's does.
* :func:`handle_flags` / :func:`handle_nvml_init_failure` do the same for the signals of
  inventory reports: a health fact turning on (row remap pending/failed, GPU lost) and a
  report saying NVML cannot be initialised (one occurrence on each of the host's GPUs).
* :func:`mark_silent_hosts_not_ready`: a registered host without a report for
  ``NVKE_HOST_HEARTBEAT_TIMEOUT_S`` becomes NOT_READY and its GPUs get an interval with reason
  ``host_not_ready``; the next report brings it back (:func:`host_reported`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Max, Min
from django.utils import timezone

from catalog.services import get_xid_code
from catalog.xid_actions import action_scope

from . import conf, health_rules
from .choices import (
    SCHEDULABLE_HOST_STATES,
    GpuHealth,
    HealthReason,
    HealthSignal,
    HostEventKind,
    HostState,
    LadderStep,
)
from .models import Gpu, GpuHealthInterval, Host, HostEvent, XidEvent
from .signals import gpu_health_changed

#: Xids the NVIDIA device plugin never marks unhealthy (application errors), nvml.md §5 [DP]
APPLICATION_XIDS = health_rules.APPLICATION_XIDS
#: the actor of the host cordon a GPU fault places (``Host.state_actor``): the only cordon
#: auto-repair lifts once the repair is verified (:func:`fleet.services.lift_repaired_cordon`)
CORDON_ACTOR = "agent"


def _notify(gpu: Gpu, *, healthy: bool, interval: GpuHealthInterval | None, at: datetime) -> None:
    kwargs: dict[str, Any] = {
        "gpu_uuid": gpu.uuid,
        "host_id": gpu.host_id,
        "holder_id": gpu.holder_id,
        "tenant_id": gpu.holder_tenant_id,
        "healthy": healthy,
        "reason": interval.reason if interval else "",
        "xid": interval.xid if interval else None,
        "action": interval.action if interval else "",
        "rule_action": interval.rule_action if interval else "",
        "needs_operator": bool(interval and interval.needs_operator),
        "at": at,
    }
    transaction.on_commit(lambda: gpu_health_changed.send(sender=Gpu, **kwargs))


def open_unhealthy(
    gpu: Gpu,
    *,
    reason: str,
    at: datetime,
    needs_operator: bool,
    detail: str = "",
    xid: int | None = None,
    action: str = "",
    rule_action: str = "",
) -> GpuHealthInterval:
    """Mark ``gpu`` unhealthy from ``at`` (idempotent for the same cause).

    With an interval already open: a cause that needs the operator replaces one that does not
    (the open interval ends at ``at`` and the new one starts there); otherwise the open one
    stays and this cause is only logged as a host event.
    """
    with transaction.atomic():
        current = (
            GpuHealthInterval.objects.select_for_update()
            .filter(gpu=gpu, ended_at__isnull=True)
            .first()
        )
        if current is not None:
            at = max(at, current.started_at)
            same = current.reason == reason and current.xid == xid
            if same or not (needs_operator and not current.needs_operator):
                if not same:
                    HostEvent.objects.create(
                        host_id=gpu.host_id,
                        ts=at,
                        kind=HostEventKind.STATE,
                        message=f"{gpu.uuid} already unhealthy ({current.reason}); also {reason}"
                        + (f" (Xid {xid})" if xid is not None else ""),
                        data={"gpu_uuid": gpu.uuid, "reason": reason, "xid": xid},
                    )
                return current
            current.ended_at = at
            current.ended_by = f"superseded by {reason}"
            current.save(update_fields=["ended_at", "ended_by"])
        interval = GpuHealthInterval.objects.create(
            gpu=gpu,
            gpu_uuid=gpu.uuid,
            host_id=gpu.host_id,
            started_at=at,
            reason=reason,
            xid=xid,
            action=action[:100],
            rule_action=rule_action,
            needs_operator=needs_operator,
            detail=detail[:500],
            holder_id=gpu.holder_id,
            tenant_id=gpu.holder_tenant_id,
        )
        text = detail or reason
        Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.UNHEALTHY, health_reason=text[:300])
        gpu.health, gpu.health_reason = GpuHealth.UNHEALTHY, text[:300]
        _notify(gpu, healthy=False, interval=interval, at=at)
        return interval


def close_unhealthy(
    gpu: Gpu, *, at: datetime, ended_by: str, reasons: set[str] | None = None
) -> GpuHealthInterval | None:
    """End the open interval of ``gpu`` (only if its reason is in ``reasons``, when given)."""
    with transaction.atomic():
        current = (
            GpuHealthInterval.objects.select_for_update()
            .filter(gpu=gpu, ended_at__isnull=True)
            .first()
        )
        if current is None or (reasons is not None and current.reason not in reasons):
            return None
        current.ended_at = max(at, current.started_at)
        current.ended_by = ended_by[:100]
        current.save(update_fields=["ended_at", "ended_by"])
        Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.HEALTHY, health_reason="")
        gpu.health, gpu.health_reason = GpuHealth.HEALTHY, ""
        _notify(gpu, healthy=True, interval=current, at=current.ended_at)
        return current


@dataclass(frozen=True)
class _XidClass:
    """What the catalog says of one Xid code, and the rule that decides it (None: logged)."""

    action: str
    what: str
    operator_action: str
    rule: health_rules.Rule | None


def _classify(xid: int, rules: dict[str, health_rules.Rule]) -> _XidClass:
    code = get_xid_code(xid)
    rule = health_rules.rule_for_xid(rules, xid, code is not None)
    if code is None:
        return _XidClass(
            rule.nvidia_action if rule else "RESTART_APP",
            f"Xid {xid} (not in the catalog)",
            "",
            rule,
        )
    return _XidClass(
        code.nvidia_immediate_action or "",
        f"Xid {xid} {code.mnemonic or ''}".strip(),
        code.operator_action or "",
        rule,
    )


def handle_xid(host: Host, event: XidEvent, now: datetime) -> str:
    """Apply one stored Xid event; returns what was done (``unhealthy``, ``cordoned``,
    ``logged``, ``restart_workload``). A GPU UUID that is not one of the host's GPUs is
    logged only."""
    return handle_xids(host, [event], now)[0]


def handle_xids(host: Host, events: list[XidEvent], now: datetime) -> list[str]:
    """Apply a report's stored Xid events (in time order) through the health rules in effect
    (:mod:`fleet.health_rules`); returns, per event in the order given, what was done:
    ``unhealthy`` / ``cordoned`` (a rule fired with a step that takes the GPU out of service),
    ``restart_workload`` (a rule fired with that step: the GPU stays healthy), ``logged``
    (no rule, or below its threshold).

    A rule counts the GPU's stored events (the engine is primed from the store, these events
    left out, then fed these in time order); each firing is recorded
    (:class:`~fleet.rule_models.HealthRuleFiring`) and gives its ladder step. One host event
    row per Xid (one bulk insert), one :func:`open_unhealthy` per GPU (its first firing; the
    GPU's later firings of other codes are logged "already unhealthy … also …", once per
    code), and the host cordoned once, for the first firing whose Xid action is host-scoped
    (:mod:`catalog.xid_actions`) or whose step is a hardware ticket. A report carries at most
    ``MAX_EVENTS`` events (fleet.ingest); one by one, 1,000 of them took ~30 s.
    """
    rules = health_rules.effective_rules()
    classes: dict[int, _XidClass] = {}
    order = sorted(range(len(events)), key=lambda i: events[i].ts)
    for i in order:
        if events[i].xid not in classes:
            classes[events[i].xid] = _classify(events[i].xid, rules)
    engine = health_rules.RuleEngine()
    pairs = {
        (classes[e.xid].rule.key, e.gpu_uuid): (classes[e.xid].rule, e.gpu_uuid)
        for e in events
        if classes[e.xid].rule is not None
    }
    if pairs:
        health_rules.prime_from_store(
            engine,
            host.pk,
            pairs.values(),
            before=max(e.ts for e in events),
            exclude_ids=[e.pk for e in events if e.pk is not None],
        )
    outcomes = ["logged"] * len(events)
    logged: list[HostEvent] = []
    fired: dict[int, health_rules.Firing] = {}
    first: dict[str, int] = {}  # GPU UUID -> index of its first event taking it out of service
    critical: dict[str, list[int]] = {}  # GPU UUID -> those events, in time order
    later: dict[str, dict[int, int]] = {}  # GPU UUID -> {other Xid code: index of first}
    cordon: int | None = None
    for i in order:
        event = events[i]
        kind = classes[event.xid]
        firing = (
            engine.feed(kind.rule, event.gpu_uuid, host.pk, event.ts)
            if kind.rule is not None
            else None
        )
        if firing is not None:
            fired[i] = firing
            what = f"rule {firing.rule_key} fired ({firing.count}x): {firing.action}"
        elif kind.rule is not None:
            what = (
                f"rule {kind.rule.key}: {engine.counted(kind.rule, event.gpu_uuid)} of "
                f"{kind.rule.threshold_count}"
            )
        else:
            what = kind.action or "no action"
        logged.append(
            HostEvent(
                host=host,
                ts=event.ts,
                kind=HostEventKind.XID,
                actor="agent",
                message=(
                    f"{kind.what} on {event.gpu_uuid}: {what}"
                    + (
                        f" (LATE: dated before a sample already received; credit from "
                        f"{event.credit_from.isoformat()})"
                        if event.late and event.credit_from
                        else ""
                    )
                )[:500],
                data={
                    "xid": event.xid,
                    "gpu_uuid": event.gpu_uuid,
                    "action": kind.action,
                    **({"rule": firing.rule_key, "step": firing.action} if firing else {}),
                    **({"late": True} if event.late else {}),
                },
            )
        )
        if firing is None:
            continue
        if firing.action == LadderStep.RESTART_WORKLOAD:
            outcomes[i] = LadderStep.RESTART_WORKLOAD
            continue
        critical.setdefault(event.gpu_uuid, []).append(i)
        if event.gpu_uuid not in first:
            first[event.gpu_uuid] = i
        elif event.xid != events[first[event.gpu_uuid]].xid:
            later.setdefault(event.gpu_uuid, {}).setdefault(event.xid, i)
    HostEvent.objects.bulk_create(logged)
    health_rules.record_firings([fired[i] for i in sorted(fired, key=lambda i: events[i].ts)])
    gpus = {g.uuid: g for g in Gpu.objects.filter(host=host, uuid__in=list(first))}
    also: list[HostEvent] = []

    def takes_host(j: int) -> bool:
        step = fired[j].action
        return action_scope(classes[events[j].xid].action) == "host" or (
            step == LadderStep.HARDWARE_TICKET
        )

    for uuid, i in first.items():
        gpu = gpus.get(uuid)
        if gpu is None:
            continue
        event, kind, firing = events[i], classes[events[i].xid], fired[i]
        rule = kind.rule
        assert rule is not None  # a firing has a rule
        interval = open_unhealthy(
            gpu,
            reason=HealthReason.XID,
            # a late Xid (fleet.ingest) credits from the newest sample before it, not its date
            at=min(event.credit_from or event.ts, now),
            needs_operator=rule.needs_operator,
            xid=event.xid,
            action=kind.action,
            rule_action=firing.action,
            detail=f"{rule.condition}: {kind.what}: {kind.operator_action or kind.action}"[:500],
        )
        outcomes[i] = "unhealthy"
        for xid, j in later.get(uuid, {}).items():
            if interval.reason == HealthReason.XID and interval.xid == xid:
                continue
            also.append(
                HostEvent(
                    host_id=host.pk,
                    ts=max(min(events[j].ts, now), interval.started_at),
                    kind=HostEventKind.STATE,
                    message=f"{uuid} already unhealthy ({interval.reason}); also "
                    f"{HealthReason.XID} (Xid {xid})",
                    data={"gpu_uuid": uuid, "reason": HealthReason.XID, "xid": xid},
                )
            )
        for j in critical[uuid]:
            outcomes[j] = "unhealthy"
            if takes_host(j) and (cordon is None or events[j].ts < events[cordon].ts):
                cordon = j
    if also:
        HostEvent.objects.bulk_create(also)
    if cordon is not None:
        event, kind = events[cordon], classes[events[cordon].xid]
        _cordon_for_fault(host, f"{kind.what} on {event.gpu_uuid}: {kind.action}", now)
        for j, outcome in enumerate(outcomes):
            if outcome == "unhealthy" and takes_host(j):
                outcomes[j] = "cordoned"
    return outcomes


def handle_samples(host: Host, seq: int, gpu_uuids: Iterable[str], now: datetime) -> list[Any]:
    """Run the samples report ``seq`` stored for ``gpu_uuids`` through the enabled rules on
    sample signals (ECC counts, slowdowns; occurrences as :mod:`fleet.health_rules` defines
    them); returns the firings.

    Called after the report's samples are stored. Per GPU, its stored samples of the look-back
    (the largest rule window, or :data:`~fleet.health_rules.MAX_WINDOW_S` for a rule without
    one, plus one day for a baseline) are read in time order; occurrences at the samples this
    report stored (``report_seq`` = ``seq``: a sample resent under a new seq keeps its first
    seq) are fed to the engine, the earlier ones prime it (with the rule's last firing on the
    GPU), so live and dry run count alike. A firing is recorded, its GPU opens an interval
    (reason ``health_rule``, the rule's condition, ``needs_operator`` and ladder step, which
    auto-repair follows) unless the step is ``restart_workload``, and a ``hardware_ticket``
    step cordons the host, as for an Xid rule (:func:`handle_xids`)."""
    from .models import GpuSample

    rules = health_rules.sample_rules()
    uuids = sorted(set(gpu_uuids))
    if not rules or not uuids:
        return []
    spans = {
        uuid: (first, last)
        for uuid, first, last in GpuSample.objects.filter(
            host_id=host.pk, gpu_uuid__in=uuids, report_seq=seq
        )
        .values("gpu_uuid")
        .annotate(first=Min("ts"), last=Max("ts"))
        .values_list("gpu_uuid", "first", "last")
    }
    if not spans:
        return []
    new = {uuid: first for uuid, (first, _) in spans.items()}
    lookback = max(r.window_s or health_rules.MAX_WINDOW_S for r in rules.values())
    since = min(new.values()) - timedelta(seconds=lookback) - timedelta(days=1)
    until = max(last for _, last in spans.values())
    occurrences = health_rules.stored_occurrences(
        since, until, host_id=host.pk, gpu_uuids=list(new)
    )
    engine = health_rules.RuleEngine()
    fired: list[health_rules.Firing] = []
    for uuid in sorted(new):
        mine = [o for o in occurrences if o[1] == uuid]
        for signal, rule in rules.items():
            start = new[uuid] - timedelta(seconds=rule.window_s or health_rules.MAX_WINDOW_S)
            times = [
                ts
                for _, _, ts, report_seq, s, n in mine
                if s == signal and report_seq != seq and ts >= start
                for _ in range(n)
            ]
            engine.prime(rule, uuid, times, health_rules.last_firing(rule, uuid))
        for _, _, ts, report_seq, signal, count in mine:
            if report_seq == seq and signal in rules:
                rule = rules[signal]
                fired.extend(health_rules.feed_count(engine, rule, uuid, host.pk, ts, count))
    if fired:
        _apply_rule_firings(host, fired, rules, now)
    return fired


def handle_flags(host: Host, turned_on: list[tuple[str, str]], now: datetime) -> list[Any]:
    """An inventory report turned flags on (``(gpu_uuid, signal)``: row remap pending /
    failed, GPU lost, :func:`fleet.health_rules.flag_turned_on`), or said NVML cannot be
    initialised (``signal`` ``nvml_init_failure``, one pair per GPU of the host:
    :func:`handle_nvml_init_failure`): log each occurrence (the host event the dry run and
    later priming read: one per flag turn-on, one per report for the host's GPUs), then run
    them through the enabled rules on them, as :func:`handle_samples` does. Returns the
    firings."""
    if not turned_on:
        return []
    init = HealthSignal.NVML_INIT_FAILURE
    logged = [
        HostEvent(
            host=host,
            ts=now,
            kind=HostEventKind.INVENTORY,
            actor="agent",
            message=f"{uuid}: {health_rules.FLAG_SIGNALS[signal]} turned on",
            data={"gpu_uuid": uuid, "signal": signal},
        )
        for uuid, signal in turned_on
        if signal != init
    ]
    failed = [uuid for uuid, signal in turned_on if signal == init]
    if failed:
        logged.append(
            HostEvent(
                host=host,
                ts=now,
                kind=HostEventKind.INVENTORY,
                actor="agent",
                message=f"NVML init failure: one occurrence on each of {len(failed)} GPU(s)",
                data={"gpu_uuids": failed, "signal": init},
            )
        )
    HostEvent.objects.bulk_create(logged)
    rules = health_rules.sample_rules(health_rules.REPORT_SIGNALS)
    engine = health_rules.RuleEngine()
    fired: list[health_rules.Firing] = []
    for uuid, signal in turned_on:
        rule = rules.get(signal)
        if rule is None:
            continue
        last = health_rules.last_firing(rule, uuid)
        start = now - timedelta(seconds=rule.window_s or health_rules.MAX_WINDOW_S)
        if last is not None:
            start = max(start, last.fired_at)
        before = [
            ts
            for _, ts, data in health_rules.flag_events([signal], start, now, host_id=host.pk)
            if uuid in health_rules.event_gpus(data)
        ][:-1]  # the occurrence just logged is fed, not primed
        engine.prime(rule, uuid, before, last)
        fired.extend(health_rules.feed_count(engine, rule, uuid, host.pk, now, 1))
    if fired:
        _apply_rule_firings(host, fired, rules, now)
    return fired


def handle_nvml_init_failure(host: Host, gpu_uuids: Iterable[str], now: datetime) -> list[Any]:
    """A report says NVML cannot be initialised on ``host`` (``source_error_code`` in
    :data:`fleet.health_rules.NVML_INIT_ERROR_CODES`): one ``nvml_init_failure`` occurrence
    on each of its GPUs (:func:`handle_flags`). Runs before :func:`apply_source_health`, so
    the GPUs a rule fired on are UNHEALTHY (evidence, with the rule's step) and only the
    others become UNKNOWN; with no rule on the signal nothing but the log line happens."""
    signal = HealthSignal.NVML_INIT_FAILURE
    return handle_flags(host, [(uuid, signal) for uuid in sorted(gpu_uuids)], now)


def _apply_rule_firings(
    host: Host,
    fired: list[health_rules.Firing],
    rules: dict[str, health_rules.Rule],
    now: datetime,
) -> None:
    """Record sample/flag/report-signal firings, log each, open their GPUs' intervals, cordon for a
    hardware ticket (see :func:`handle_samples`)."""
    fired.sort(key=lambda f: f.fired_at)
    health_rules.record_firings(fired)
    by_key = {r.key: r for r in rules.values()}
    HostEvent.objects.bulk_create(
        [
            HostEvent(
                host=host,
                ts=f.fired_at,
                kind=HostEventKind.STATE,
                actor="agent",
                message=f"rule {f.rule_key} fired ({f.count}x) on {f.gpu_uuid}: {f.action}"[:500],
                data={"gpu_uuid": f.gpu_uuid, "rule": f.rule_key, "step": f.action},
            )
            for f in fired
        ]
    )
    gpus = {g.uuid: g for g in Gpu.objects.filter(host=host, uuid__in={f.gpu_uuid for f in fired})}
    cordon: health_rules.Firing | None = None
    for f in fired:
        gpu = gpus.get(f.gpu_uuid)
        if gpu is None or f.action == LadderStep.RESTART_WORKLOAD:
            continue
        rule = by_key[f.rule_key]
        open_unhealthy(
            gpu,
            reason=HealthReason.HEALTH_RULE,
            at=min(f.fired_at, now),
            needs_operator=rule.needs_operator,
            rule_action=f.action,
            detail=f"{rule.condition}: rule {f.rule_key} fired ({f.count}x)",
        )
        if f.action == LadderStep.HARDWARE_TICKET and cordon is None:
            cordon = f
    if cordon is not None:
        _cordon_for_fault(
            host, f"rule {cordon.rule_key} on {cordon.gpu_uuid}: {cordon.action}", now
        )


def _cordon_for_fault(host: Host, reason: str, now: datetime) -> None:
    """Cordon ``host`` for a GPU fault (a schedulable or NOT_READY host; any other state is
    left alone), as :data:`CORDON_ACTOR`: the cordon a verified repair lifts."""
    from .services import change_host_state

    change_host_state(
        host.pk,
        to=HostState.CORDONED,
        allowed_from=(*SCHEDULABLE_HOST_STATES, HostState.NOT_READY),
        reason=reason,
        actor=CORDON_ACTOR,
        now=now,
    )


def mark_silent_hosts_not_ready(now: datetime) -> int:
    """Hosts whose registered agent has not reported for the heartbeat timeout -> NOT_READY.

    Hosts that never registered an agent (no per-host credential) are left alone: an imported
    host is usable before its agent starts, and a SIMULATED host's in-process reports set
    ``last_seen_at`` only when the provider acts on it (it has no agent to fall silent). Each
    host changes with a guarded UPDATE (a report arriving meanwhile wins); its GPUs get a
    ``host_not_ready`` interval. Returns the number of hosts changed.
    """
    from .services import change_host_state

    cutoff = now - timedelta(seconds=conf.heartbeat_timeout_s())
    changed = 0
    for host_id in (
        Host.objects.filter(state__in=SCHEDULABLE_HOST_STATES, last_seen_at__lt=cutoff)
        .exclude(credential_hash="")
        .values_list("pk", flat=True)
    ):
        with transaction.atomic():
            if not change_host_state(
                host_id,
                to=HostState.NOT_READY,
                allowed_from=SCHEDULABLE_HOST_STATES,
                reason=f"no agent report for {conf.heartbeat_timeout_s():g} s",
                now=now,
                extra_filter={"last_seen_at__lt": cutoff},
            ):
                continue
            for gpu in Gpu.objects.filter(host_id=host_id):
                open_unhealthy(
                    gpu,
                    reason=HealthReason.HOST_NOT_READY,
                    at=now,
                    needs_operator=False,
                    detail="the host's agent stopped reporting",
                )
            changed += 1
    return changed


def host_reported(host: Host, now: datetime) -> None:
    """A report arrived: a NOT_READY host is ready again, its ``host_not_ready`` intervals end."""
    from .services import change_host_state, holders_on

    if host.state != HostState.NOT_READY:
        return
    target = HostState.ALLOCATED if holders_on(host.pk) else HostState.AVAILABLE
    if change_host_state(
        host.pk,
        to=target,
        allowed_from=(HostState.NOT_READY,),
        reason="the agent reports again",
        now=now,
        actor="agent",
    ):
        for gpu in Gpu.objects.filter(host=host, health=GpuHealth.UNHEALTHY):
            close_unhealthy(
                gpu, at=now, ended_by="agent reports again", reasons={HealthReason.HOST_NOT_READY}
            )


def apply_source_health(host: Host, source_error: str, now: datetime) -> int:
    """A report arrived: ``source_error`` non-empty says the agent runs but cannot read its
    GPUs (NVML/DCGM does not initialise). Unknown is not unhealthy: the host's HEALTHY GPUs
    become ``UNKNOWN`` — not placeable (:mod:`fleet.placeable` wants HEALTHY), yet no
    unhealthy interval (no SLA credit), no ``gpu_health_changed`` (no auto-repair: EKS
    replaced healthy nodes when its agent lost DCGM, aws/containers-roadmap#2555) — and the
    host gets a ``gpu health unknown:`` warning for the operator. A GPU already UNHEALTHY
    stays so (evidence from the GPU wins). A report that reads the GPUs again (no error)
    brings UNKNOWN GPUs back to HEALTHY and clears the warning. Returns the GPUs changed.

    A host that stops reporting altogether is another case: NOT_READY after the heartbeat
    timeout (:func:`mark_silent_hosts_not_ready`), repaired after its timeout."""
    from . import host_warnings

    if source_error:
        changed = Gpu.objects.filter(host=host, health=GpuHealth.HEALTHY).update(
            health=GpuHealth.UNKNOWN,
            health_reason=f"the agent cannot read the GPU: {source_error}"[:300],
        )
        unknown = Gpu.objects.filter(host=host, health=GpuHealth.UNKNOWN).count()
        warning = (
            f"{host_warnings.GPU_HEALTH_UNKNOWN} {unknown} GPU(s) not placeable: the agent "
            f"reports but cannot read them ({source_error}); no repair and no SLA credit "
            "until it reads them again"
            if unknown
            else None
        )
    elif not any(w.startswith(host_warnings.GPU_HEALTH_UNKNOWN) for w in host.warnings or []):
        # the common case, no statement at all: GPUs are UNKNOWN only while the host carries
        # the warning (set in the same transaction as them, by this function alone)
        return 0
    else:
        changed = Gpu.objects.filter(host=host, health=GpuHealth.UNKNOWN).update(
            health=GpuHealth.HEALTHY, health_reason=""
        )
        warning = None
    if changed:
        HostEvent.objects.create(
            host=host,
            ts=now,
            kind=HostEventKind.STATE,
            actor="agent",
            message=(
                f"{changed} GPU(s) health UNKNOWN: the agent cannot read them ({source_error})"
                if source_error
                else f"{changed} GPU(s) read by the agent again: HEALTHY"
            )[:500],
            data={"health": GpuHealth.UNKNOWN if source_error else GpuHealth.HEALTHY},
        )
    host_warnings.set_host_warning(host.pk, host_warnings.GPU_HEALTH_UNKNOWN, warning)
    return changed


def mark_healthy(
    host: Host, gpu_uuids: list[str] | None, *, actor: str, now: datetime | None = None
) -> list[str]:
    """Operator (API ``POST …/mark-healthy`` or the console): the GPUs (all of the host's when
    None) are repaired; their open unhealthy intervals end at ``now`` — the end of any SLA
    credit they gave (billing reads these intervals). Records a host event and an audit event
    (``host.mark_healthy``, the intervals ended with their start); returns the GPUs closed."""
    from tenants import audit

    now = now or timezone.now()
    gpus = Gpu.objects.filter(host=host, health=GpuHealth.UNHEALTHY)
    if gpu_uuids is not None:
        gpus = gpus.filter(uuid__in=gpu_uuids)
    closed = []
    ended: list[dict[str, Any]] = []
    with transaction.atomic():
        for gpu in gpus:
            interval = close_unhealthy(gpu, at=now, ended_by=actor)
            if interval is not None:
                closed.append(gpu.uuid)
                ended.append(
                    {
                        "gpu_uuid": gpu.uuid,
                        "reason": interval.reason,
                        "xid": interval.xid,
                        "started_at": interval.started_at.isoformat(),
                        "ended_at": interval.ended_at.isoformat(),
                    }
                )
            else:  # unhealthy without an interval (older data): just fix the flag
                Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.HEALTHY, health_reason="")
                closed.append(gpu.uuid)
            # A GPU whose scrub failed and that an operator declares repaired is clean again.
            Gpu.objects.filter(pk=gpu.pk, scrub_state="FAILED").update(scrub_state="CLEAN")
        if closed:
            HostEvent.objects.create(
                host=host,
                ts=now,
                kind=HostEventKind.ACTION,
                actor=actor,
                message=f"marked healthy: {', '.join(sorted(closed))}",
                data={"gpu_uuids": sorted(closed)},
            )
            audit.record(
                actor=actor,
                action="host.mark_healthy",
                target_type="host",
                target_id=host.pk,
                before={"unhealthy": sorted(closed)},
                after={"healthy": sorted(closed), "intervals_ended": ended},
            )
    return sorted(closed)


def unhealthy_seconds(
    gpu_uuid: str, start: datetime, end: datetime, *, needs_operator: bool | None = None
) -> float:
    """Seconds of ``[start, end)`` during which ``gpu_uuid`` was unhealthy (open = until end)."""
    total = 0.0
    intervals = GpuHealthInterval.objects.filter(gpu_uuid=gpu_uuid, started_at__lt=end).exclude(
        ended_at__lte=start
    )
    if needs_operator is not None:
        intervals = intervals.filter(needs_operator=needs_operator)
    for interval in intervals:
        lo = max(interval.started_at, start)
        hi = min(interval.ended_at or end, end)
        total += max(0.0, (hi - lo).total_seconds())
    return total
