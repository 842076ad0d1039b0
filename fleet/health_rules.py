"""Health rules: which signals make a GPU unhealthy, after how many occurrences, and what
auto-repair does about it — data an operator tunes, defaulting to the catalog's Xid table.

* **Defaults** (:func:`default_rules`): one rule per Xid the catalog calls *critical*
  (``catalog.XidCode.severity``, NVIDIA's immediate action mapped in ``xid.yaml``): threshold
  1 (every occurrence), condition ``Xid<code>``, ``needs_operator`` (SLA credit), and a ladder
  from the Xid's NVIDIA immediate action (:func:`default_ladder`): ``RESET_GPU`` and
  ``WORKFLOW_*`` start at a GPU reset, ``RESTART_BM``/``RESTART_VM`` at a node reboot, anything
  else critical (``CONTACT_SUPPORT``, ``CHECK_MECHANICALS`` …) at a replacement; each goes on
  to the harsher steps when it recurs within ``NVKE_HEALTH_ESCALATION_WINDOW_S`` (24 h).
  An Xid the catalog does not know is critical unless it is one of the application Xids the
  NVIDIA device plugin ignores (13, 31, 43, 45, 68, 109) — the rule ``xid-unknown`` behaviour
  of :func:`rule_for_xid`. Warnings and info Xids have no default rule: they are logged.
* **Overrides**: :class:`fleet.rule_models.HealthRule` rows (API ``/fleet/health-rules``, the
  console's Health rules page) replace the default of their key; :func:`save_rule` and
  :func:`delete_rule` version and audit every change.
* **Evaluation** (:class:`RuleEngine`), one function for the live path and the dry run: per
  GPU and rule, the events since the rule last fired on that GPU that fall within
  ``window_s`` of the newest are counted; at ``threshold_count`` the rule fires (and the count
  starts again); a firing within ``escalation_window_s`` of the previous one on that GPU
  takes the next ladder step (the last step repeats). The live path
  (:func:`fleet.health.handle_xids`) primes the engine from the stored Xid events and
  :class:`~fleet.rule_models.HealthRuleFiring` rows; :func:`dry_run` replays the stored
  events of the last N days through rules that need not be saved.

**Signals and their occurrences** (the one place they are defined; :data:`WIRED_SIGNALS`):

* ``xid``: one stored :class:`~fleet.models.XidEvent` of the rule's code is one occurrence.
* ``ecc_dbe`` / ``ecc_sbe`` (sample signals): the GPU's volatile uncorrected / corrected ECC
  count (``ecc_volatile_uncorrected`` / ``ecc_volatile_corrected`` of its samples,
  ``fleet_gpusample``: NVML ``nvmlDeviceGetTotalEccErrors`` volatile counters) rising between
  two consecutive samples of the GPU by n counts n occurrences, at the later sample's time. A
  count that falls (a reboot or driver reload resets volatile counters) is no occurrence, nor
  is the first sample of a GPU (nothing to compare with) or a sample without the value.
* ``thermal_slowdown`` / ``power_slowdown`` (sample signals): a sample whose
  ``clocks_event_reasons`` (``nvmlDeviceGetCurrentClocksEventReasons``, the
  ``nvmlClocksEventReason*`` bits of nvidia-ml-py) has one of the signal's bits set when the
  GPU's previous sample had none of them set: :data:`THERMAL_SLOWDOWN_BITS`
  (SwThermalSlowdown 0x20, HwThermalSlowdown 0x40), :data:`POWER_SLOWDOWN_BITS`
  (HwPowerBrakeSlowdown 0x80; SwPowerCap 0x4 is left out: a GPU at full load sits at its
  power cap, that is no fault, and HwSlowdown 0x8 says neither which).
* One physical GPU is one series: the samples of its MIG instances at one time count once.
  Live (:func:`fleet.health.handle_samples`, run for each report's newly stored samples) and
  the dry run read occurrences through one function (:func:`stored_occurrences`, which decides
  with :func:`sample_occurrences`) over the stored samples, so both agree; a sample the store
  already had (a resent report) is not fed twice.

* ``row_remap_pending`` / ``row_remap_failed`` / ``fallen_off_bus`` (flag signals): an
  inventory report in which the GPU's ``remapped_rows_pending`` / ``remapped_rows_failure``
  health fact (NVML ``nvmlDeviceGetRemappedRows``) / ``gpu_is_lost`` fact (the agent's NVML
  source met ``NVML_ERROR_GPU_IS_LOST`` on the GPU: fallen off the bus; it keeps listing the
  GPU under the UUID it read before) is true when the stored one (``Gpu.health_counters``,
  the previous report's) was not: one occurrence; later reports still showing it are none.
  Ingestion logs each turn-on as a host event (kind ``inventory``, ``data.signal``), the
  record the live priming and the dry run read (:func:`flag_events`). Without a rule the
  agent check (:mod:`fleet.hygiene`) still FAILS a GPU with a row remap flag
  (``check_failed``, needs the operator), and a lost GPU is *missing* as one the agent no
  longer lists (``Gpu.missing_since``, a ``gpu_missing`` interval: not placeable, never
  present and healthy); a rule on the flag is evaluated before both, so its interval (with
  its ladder step) is the one the GPU gets.
* ``nvml_init_failure`` (a report signal): a report whose ``source_error_code`` is one of
  :data:`NVML_INIT_ERROR_CODES` (NVML cannot be used on the host at all: the agent's
  node-level NVML errors, ``Uninitialized``, ``DriverNotLoaded``, ``LibRmVersionMismatch``,
  ``LibraryNotFound``) is one occurrence on each GPU of the host, at the report's receive
  time (a spooled backlog counts when it arrives). Ingestion logs one host event per such
  report (kind ``inventory``, ``data.signal`` and ``data.gpu_uuids``), read like the flag
  turn-ons. Without a rule nothing else happens: the GPUs are *unknown*, never unhealthy
  (:func:`fleet.health.apply_source_health`); a rule's firing is evidence, so its interval
  (with its ladder step; the step's scope — GPU reset, node reboot … — is the action's)
  makes the GPU unhealthy and auto-repair follows it.

Every :class:`~fleet.choices.HealthSignal` is wired: :data:`UNWIRED_SIGNALS` is empty, and
:class:`UnwiredSignal` stays the refusal for a signal added to the choices before it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .choices import LADDER_ORDER, HealthSignal, LadderStep
from .rule_models import HealthRule, HealthRuleFiring

#: Xids the NVIDIA device plugin never marks unhealthy (application errors), nvml.md §5 [DP]
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
#: the NVIDIA action recorded for an Xid the catalog does not know
UNKNOWN_XID_ACTION = "UNKNOWN_XID"
#: bounds of a rule (API and console validation)
MAX_THRESHOLD = 1000
MAX_WINDOW_S = 30 * 86400
MAX_XID = 65535
#: the dry run looks back at most this many days (stored Xid events are kept as long as the
#: host; the bound keeps one request's replay small)
MAX_DRY_RUN_DAYS = 90


#: nvmlClocksEventReason* bits (nvidia-ml-py; agent/nvke_agent/smi_xml.py CLOCK_EVENT_REASON_BITS)
THERMAL_SLOWDOWN_BITS = 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
POWER_SLOWDOWN_BITS = 0x80  # HwPowerBrakeSlowdown
#: signals counted from the GPU samples (module docstring)
SAMPLE_SIGNALS = (
    HealthSignal.ECC_DBE,
    HealthSignal.ECC_SBE,
    HealthSignal.THERMAL_SLOWDOWN,
    HealthSignal.POWER_SLOWDOWN,
)
#: signals counted from the inventory's health facts: the fact's key per signal
FLAG_SIGNALS = {
    HealthSignal.ROW_REMAP_PENDING: "remapped_rows_pending",
    HealthSignal.ROW_REMAP_FAILED: "remapped_rows_failure",
    HealthSignal.FALLEN_OFF_BUS: "gpu_is_lost",
}
#: ``source_error_code`` values of a report that make it an NVML init failure: the agent's
#: node-level NVML errors (agent/nvke_agent/sources/nvml.py ``_NODE_ERROR_NAMES``)
NVML_INIT_ERROR_CODES = frozenset(
    {
        "NVML_ERROR_UNINITIALIZED",
        "NVML_ERROR_DRIVER_NOT_LOADED",
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        "NVML_ERROR_LIBRARY_NOT_FOUND",
    }
)
#: signals counted from inventory reports, logged as host events (:func:`flag_events`)
REPORT_SIGNALS = (*FLAG_SIGNALS, HealthSignal.NVML_INIT_FAILURE)
#: signals a rule can be saved on: evaluated live and in the dry run
WIRED_SIGNALS = frozenset({HealthSignal.XID, *SAMPLE_SIGNALS, *REPORT_SIGNALS})
#: signals the agent's reports cannot evaluate yet (module docstring says why)
UNWIRED_SIGNALS = frozenset(set(HealthSignal.values) - WIRED_SIGNALS)

#: a sample as the rules read it: (ecc_volatile_uncorrected, ecc_volatile_corrected,
#: clocks_event_reasons), each None when not reported
Reading = tuple[int | None, int | None, int | None]


def sample_occurrences(prev: Reading | None, cur: Reading) -> dict[str, int]:
    """Occurrences of each sample signal at ``cur``, the GPU's sample after ``prev`` (None:
    its first); only signals that occurred (count > 0). Definitions: module docstring."""
    out: dict[str, int] = {}
    if prev is None:
        return out
    for signal, i in ((HealthSignal.ECC_DBE, 0), (HealthSignal.ECC_SBE, 1)):
        before, now = prev[i], cur[i]
        if before is not None and now is not None and now > before:
            out[signal] = now - before
    before, now = prev[2], cur[2]
    if before is not None and now is not None:
        for signal, bits in (
            (HealthSignal.THERMAL_SLOWDOWN, THERMAL_SLOWDOWN_BITS),
            (HealthSignal.POWER_SLOWDOWN, POWER_SLOWDOWN_BITS),
        ):
            if now & bits and not before & bits:
                out[signal] = 1
    return out


def flag_turned_on(prev: Mapping[str, Any] | None, cur: Mapping[str, Any]) -> list[str]:
    """The flag signals that turned on between a GPU's stored health facts ``prev`` and the
    reported ``cur`` (module docstring)."""
    prev = prev or {}
    return [s for s, f in FLAG_SIGNALS.items() if cur.get(f) is True and prev.get(f) is not True]


@dataclass(frozen=True)
class Rule:
    """A rule in effect. ``source``: ``catalog`` (a default) or ``operator`` (a stored row);
    ``version`` 0 for a default. ``nvidia_action``: the Xid's NVIDIA immediate action (what
    the unhealthy interval records and billing reads the scope of; "" for other signals)."""

    signal: str
    xid: int | None
    threshold_count: int
    window_s: int
    condition: str
    ladder: tuple[str, ...]
    escalation_window_s: int
    needs_operator: bool = True
    enabled: bool = True
    source: str = "catalog"
    version: int = 0
    nvidia_action: str = ""
    updated_by: str = ""
    updated_at: datetime | None = None

    @property
    def key(self) -> str:
        return key_of(self.signal, self.xid)

    def as_dict(self) -> dict[str, Any]:
        """The rule as the API shows it (``key`` added, ``ladder`` a list)."""
        out = asdict(self)
        out["key"], out["ladder"] = self.key, list(self.ladder)
        return out


def key_of(signal: str, xid: int | None) -> str:
    """``xid-31`` for an Xid rule, the signal with dashes otherwise (``ecc-dbe``)."""
    return f"xid-{xid}" if signal == HealthSignal.XID else signal.replace("_", "-")


def parse_key(key: str) -> tuple[str, int | None]:
    """``(signal, xid)`` of a rule key; ValueError for a key naming no rule. One spelling per
    rule (``fallen-off-bus``, ``xid-79``): ``fallen_off_bus`` or ``xid-079`` are refused naming
    the key, so a PUT can never store under a key a GET does not find."""
    if key.startswith("xid-"):
        code = key[4:]
        if not code.isascii() or not code.isdigit() or int(code) > MAX_XID:
            raise ValueError(f"an Xid rule's key is xid-<code 0..{MAX_XID}>: {key!r}")
        if code != str(int(code)):
            raise ValueError(f"no such health rule: {key!r} (the rule's key is xid-{int(code)})")
        return HealthSignal.XID, int(code)
    signal = key.replace("-", "_")
    if signal not in HealthSignal.values or signal == HealthSignal.XID:
        raise ValueError(f"no such health rule: {key!r}")
    if key != signal.replace("_", "-"):
        raise ValueError(
            f"no such health rule: {key!r} (the rule's key is {signal.replace('_', '-')})"
        )
    return signal, None


def escalation_window_s() -> int:
    """The default escalation window (s): ``NVKE_HEALTH_ESCALATION_WINDOW_S``."""
    return int(settings.NVKE_HEALTH_ESCALATION_WINDOW_S)


def default_ladder(nvidia_action: str) -> tuple[str, ...]:
    """The ladder of a critical Xid's default rule, from its NVIDIA immediate action."""
    if nvidia_action == "RESET_GPU" or nvidia_action.startswith("WORKFLOW_"):
        start = LadderStep.GPU_RESET  # the catalog: treat WORKFLOW_* as at least RESET_GPU
    elif nvidia_action in ("RESTART_BM", "RESTART_VM"):
        start = LadderStep.NODE_REBOOT
    else:  # CONTACT_SUPPORT, CHECK_MECHANICALS, an unknown Xid …: hardware attention
        start = LadderStep.REPLACE
    return LADDER_ORDER[LADDER_ORDER.index(start) :]


def _default_xid_rule(code: int, nvidia_action: str) -> Rule:
    return Rule(
        signal=HealthSignal.XID,
        xid=code,
        threshold_count=1,
        window_s=0,
        condition=f"Xid{code}",
        ladder=default_ladder(nvidia_action),
        escalation_window_s=escalation_window_s(),
        nvidia_action=nvidia_action,
    )


def default_rules() -> dict[str, Rule]:
    """The catalog's table as rules: one per critical Xid (see the module docstring)."""
    from catalog.models import XidCode

    return {
        f"xid-{code}": _default_xid_rule(code, action or "")
        for code, action in XidCode.objects.filter(severity=XidCode.Severity.CRITICAL)
        .order_by("code")
        .values_list("code", "nvidia_immediate_action")
    }


def _nvidia_actions(codes: Iterable[int]) -> dict[int, str]:
    from catalog.models import XidCode

    return dict(
        XidCode.objects.filter(code__in=list(codes)).values_list("code", "nvidia_immediate_action")
    )


def rule_from_row(row: HealthRule, nvidia_action: str = "") -> Rule:
    """A stored rule as a :class:`Rule` (``source`` ``operator``)."""
    return Rule(
        signal=row.signal,
        xid=row.xid,
        threshold_count=row.threshold_count,
        window_s=row.window_s,
        condition=row.condition,
        ladder=tuple(row.ladder),
        escalation_window_s=row.escalation_window_s,
        needs_operator=row.needs_operator,
        enabled=row.enabled,
        source="operator",
        version=row.version,
        nvidia_action=nvidia_action,
        updated_by=row.updated_by,
        updated_at=row.updated_at,
    )


def effective_rules() -> dict[str, Rule]:
    """The rules in effect, by key: the catalog defaults with the stored rows laid over them
    (a disabled row is kept, ``enabled`` False, so the console shows it)."""
    rules = default_rules()
    rows = list(HealthRule.objects.all())
    actions = _nvidia_actions(r.xid for r in rows if r.xid is not None)
    for row in rows:
        action = actions.get(row.xid, UNKNOWN_XID_ACTION) if row.xid is not None else ""
        rules[row.key] = rule_from_row(row, action)
    return dict(sorted(rules.items(), key=lambda kv: (kv[1].signal, kv[1].xid or 0)))


def rule_for_xid(rules: Mapping[str, Rule], xid: int, catalogued: bool) -> Rule | None:
    """The enabled rule deciding Xid ``xid``: its own (default or stored); for an Xid the
    catalog does not know (``catalogued`` False) and no rule names, a replace-first rule
    unless it is an application Xid. None: the Xid is only logged."""
    rule = rules.get(key_of(HealthSignal.XID, xid))
    if rule is not None:
        return rule if rule.enabled else None
    if catalogued or xid in APPLICATION_XIDS:
        return None
    return _default_xid_rule(xid, UNKNOWN_XID_ACTION)


# --- evaluation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Firing:
    """A rule fired on a GPU: at the event at ``fired_at``, ``count`` events counted, ladder
    step ``step`` (0-based), ``action`` that step."""

    rule_key: str
    rule_version: int
    gpu_uuid: str
    host_id: Any
    fired_at: datetime
    xid: int | None
    count: int
    step: int
    action: str

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["host_id"] = str(self.host_id)
        out["fired_at"] = self.fired_at.isoformat()
        return out


@dataclass
class _Track:
    times: list[datetime] = field(default_factory=list)  # events since the last firing
    last: Firing | None = None


class RuleEngine:
    """Counts events per (rule, GPU) and decides firings and ladder steps (module docstring).
    Feed events in time order; :meth:`prime` first with what is already known."""

    def __init__(self) -> None:
        self._tracks: dict[tuple[str, str], _Track] = {}

    def prime(self, rule: Rule, gpu_uuid: str, times: Iterable[datetime], last: Firing | None):
        """Events counted before (times after ``last``'s firing) and the last firing."""
        track = self._tracks.setdefault((rule.key, gpu_uuid), _Track())
        track.last = last
        track.times = sorted(t for t in times if last is None or t > last.fired_at)

    def feed(self, rule: Rule, gpu_uuid: str, host_id: Any, ts: datetime) -> Firing | None:
        """One occurrence of ``rule``'s signal on ``gpu_uuid`` at ``ts``: the firing, if the
        threshold is reached."""
        track = self._tracks.setdefault((rule.key, gpu_uuid), _Track())
        track.times.append(ts)
        if rule.window_s:
            start = ts - timedelta(seconds=rule.window_s)
            track.times = [t for t in track.times if t >= start]
        if len(track.times) < rule.threshold_count:
            return None
        step = 0
        if track.last is not None and ts - track.last.fired_at <= timedelta(
            seconds=rule.escalation_window_s
        ):
            step = min(track.last.step + 1, len(rule.ladder) - 1)
        firing = Firing(
            rule_key=rule.key,
            rule_version=rule.version,
            gpu_uuid=gpu_uuid,
            host_id=host_id,
            fired_at=ts,
            xid=rule.xid,
            count=len(track.times),
            step=step,
            action=rule.ladder[step],
        )
        track.times, track.last = [], firing
        return firing

    def counted(self, rule: Rule, gpu_uuid: str) -> int:
        """Events counted towards ``rule`` on ``gpu_uuid`` since it last fired."""
        track = self._tracks.get((rule.key, gpu_uuid))
        return len(track.times) if track else 0


def last_firing(rule: Rule, gpu_uuid: str) -> Firing | None:
    """The latest stored firing of ``rule`` on ``gpu_uuid`` (escalation counts from it), or
    None."""
    row = (
        HealthRuleFiring.objects.filter(rule_key=rule.key, gpu_uuid=gpu_uuid)
        .order_by("-fired_at")
        .first()
    )
    if row is None:
        return None
    return Firing(
        rule_key=row.rule_key,
        rule_version=row.rule_version,
        gpu_uuid=row.gpu_uuid,
        host_id=row.host_id,
        fired_at=row.fired_at,
        xid=row.xid,
        count=row.count,
        step=row.step,
        action=row.action,
    )


def prime_from_store(
    engine: RuleEngine,
    host_id: Any,
    pairs: Iterable[tuple[Rule, str]],
    before: datetime,
    exclude_ids: Iterable[int] = (),
) -> None:
    """Prime ``engine`` for each (rule, GPU) of ``pairs`` with the stored Xid events of that
    GPU before ``before`` (those of ``exclude_ids`` — the ones about to be fed — left out) and
    the rule's last stored firing on it."""
    from .models import XidEvent

    excluded = list(exclude_ids)
    for rule, gpu_uuid in pairs:
        last = last_firing(rule, gpu_uuid)
        events = XidEvent.objects.filter(
            host_id=host_id, gpu_uuid=gpu_uuid, xid=rule.xid, ts__lte=before
        ).exclude(pk__in=excluded)
        if last is not None:
            events = events.filter(ts__gt=last.fired_at)
        if rule.window_s:
            events = events.filter(ts__gte=before - timedelta(seconds=rule.window_s))
        engine.prime(rule, gpu_uuid, events.values_list("ts", flat=True), last)


def record_firings(firings: list[Firing]) -> None:
    """Store live firings (escalation reads them back)."""
    HealthRuleFiring.objects.bulk_create(
        [
            HealthRuleFiring(
                rule_key=f.rule_key,
                rule_version=f.rule_version,
                gpu_uuid=f.gpu_uuid,
                host_id=f.host_id,
                fired_at=f.fired_at,
                xid=f.xid,
                count=f.count,
                step=f.step,
                action=f.action,
            )
            for f in firings
        ]
    )


def dry_run(rules: Mapping[str, Rule], *, days: int, now: datetime | None = None) -> list[Firing]:
    """What ``rules`` would have done over the stored Xid events, GPU samples (the sample
    signals) and logged flag turn-ons / NVML init failures of the last ``days`` days
    (1 .. :data:`MAX_DRY_RUN_DAYS`): the firings, in time order, from a fresh start (no
    firing before the window counts for escalation). Changes nothing."""
    from catalog.models import XidCode

    from .models import XidEvent

    if not 1 <= days <= MAX_DRY_RUN_DAYS:
        raise ValueError(f"days must be 1..{MAX_DRY_RUN_DAYS}")
    now = now or timezone.now()
    since = now - timedelta(days=days)
    catalogued = set(XidCode.objects.values_list("code", flat=True))
    engine, firings = RuleEngine(), []
    for host_id, gpu_uuid, ts, xid in (
        XidEvent.objects.filter(ts__gte=since, ts__lte=now)
        .order_by("ts", "id")
        .values_list("host_id", "gpu_uuid", "ts", "xid")
        .iterator()
    ):
        rule = rule_for_xid(rules, xid, xid in catalogued)
        if rule is None:
            continue
        firing = engine.feed(rule, gpu_uuid, host_id, ts)
        if firing is not None:
            firings.append(firing)
    on_samples = {r.signal: r for r in rules.values() if r.enabled and r.signal in SAMPLE_SIGNALS}
    if on_samples:
        firings.extend(_dry_run_samples(engine, on_samples, since, now))
    on_flags = {r.signal: r for r in rules.values() if r.enabled and r.signal in REPORT_SIGNALS}
    for host_id, ts, data in flag_events(list(on_flags), since, now):
        rule = on_flags[data["signal"]]
        for uuid in event_gpus(data):
            firings.extend(feed_count(engine, rule, uuid, host_id, ts, 1))
    firings.sort(key=lambda f: f.fired_at)
    return firings


def flag_events(
    signals: list[str], since: datetime, until: datetime, **filters: Any
) -> Iterable[tuple[Any, datetime, dict[str, Any]]]:
    """``(host_id, ts, data)`` of the logged occurrences of ``signals`` (flag turn-ons, NVML
    init failures) in ``[since, until]``, in time order (:func:`fleet.health.handle_flags`
    logs them; :func:`event_gpus` reads their GPUs)."""
    from .choices import HostEventKind
    from .models import HostEvent

    if not signals:
        return []
    return (
        HostEvent.objects.filter(
            kind=HostEventKind.INVENTORY,
            ts__gte=since,
            ts__lte=until,
            data__signal__in=signals,
            **filters,
        )
        .order_by("ts", "id")
        .values_list("host_id", "ts", "data")
    )


def event_gpus(data: Mapping[str, Any]) -> list[str]:
    """The GPUs of a logged occurrence (:func:`flag_events`): a flag turn-on names one
    (``gpu_uuid``), an NVML init failure the host's (``gpu_uuids``)."""
    if isinstance(data.get("gpu_uuids"), list):
        return [u for u in data["gpu_uuids"] if isinstance(u, str)]
    return [data["gpu_uuid"]] if isinstance(data.get("gpu_uuid"), str) else []


#: one reading per GPU and time (its MIG instances' rows repeat it), with the previous one;
#: only rows where a sample signal may have occurred come back (a superset of
#: :func:`sample_occurrences`, which decides): the scan stays in PostgreSQL
_OCCURRENCE_SQL = """
WITH s AS (
  SELECT DISTINCT ON (host_id, gpu_uuid, ts) host_id, gpu_uuid, ts, report_seq,
         ecc_volatile_uncorrected AS u, ecc_volatile_corrected AS c, clocks_event_reasons AS r
  FROM fleet_gpusample WHERE ts >= %(since)s AND ts <= %(until)s {where}
  ORDER BY host_id, gpu_uuid, ts, report_seq
), l AS (
  SELECT s.*, LAG(u) OVER w AS pu, LAG(c) OVER w AS pc, LAG(r) OVER w AS pr
  FROM s WINDOW w AS (PARTITION BY host_id, gpu_uuid ORDER BY ts)
)
SELECT host_id, gpu_uuid, ts, report_seq, pu, pc, pr, u, c, r FROM l
WHERE u > pu OR c > pc OR ((r & %(bits)s) <> 0 AND (pr & %(bits)s) <> (r & %(bits)s))
ORDER BY ts, host_id, gpu_uuid
"""


def stored_occurrences(
    since: datetime, until: datetime, *, host_id: Any = None, gpu_uuids: Iterable[str] = ()
) -> list[tuple[Any, str, datetime, int, str, int]]:
    """``(host_id, gpu_uuid, ts, report_seq, signal, count)`` of the sample signals in the
    stored samples of ``[since, until]`` (of one host's ``gpu_uuids`` when given), in time
    order; each GPU's first sample there is its baseline. Live and dry run read this."""
    from django.db import connection

    params: dict[str, Any] = {
        "since": since,
        "until": until,
        "bits": THERMAL_SLOWDOWN_BITS | POWER_SLOWDOWN_BITS,
    }
    where = ""
    if host_id is not None:
        where = "AND host_id = %(host)s AND gpu_uuid = ANY(%(uuids)s)"
        params.update(host=host_id, uuids=list(gpu_uuids))
    out = []
    with connection.cursor() as cursor:
        cursor.execute(_OCCURRENCE_SQL.format(where=where), params)
        for host, uuid, ts, seq, pu, pc, pr, u, c, r in cursor.fetchall():
            for signal, n in sample_occurrences((pu, pc, pr), (u, c, r)).items():
                out.append((host, uuid, ts, seq, signal, n))
    return out


def _dry_run_samples(
    engine: RuleEngine, rules: Mapping[str, Rule], since: datetime, until: datetime
) -> list[Firing]:
    """The firings of the sample-signal ``rules`` (by signal) over the stored samples in
    ``[since, until]``; each GPU's first sample there is its baseline."""
    out: list[Firing] = []
    for host_id, gpu_uuid, ts, _, signal, count in stored_occurrences(since, until):
        rule = rules.get(signal)
        if rule is not None:
            out.extend(feed_count(engine, rule, gpu_uuid, host_id, ts, count))
    return out


def feed_count(
    engine: RuleEngine, rule: Rule, gpu_uuid: str, host_id: Any, ts: datetime, count: int
) -> list[Firing]:
    """Feed ``count`` occurrences at ``ts`` (an ECC count rising by ``count``)."""
    out = []
    for _ in range(count):
        firing = engine.feed(rule, gpu_uuid, host_id, ts)
        if firing is not None:
            out.append(firing)
    return out


def sample_rules(signals: Iterable[str] = SAMPLE_SIGNALS) -> dict[str, Rule]:
    """The enabled rules on ``signals`` (sample signals by default), by signal: stored rows
    only (no catalog default exists for them), so the live path's common case is one query
    that finds none."""
    return {
        row.signal: rule_from_row(row)
        for row in HealthRule.objects.filter(signal__in=list(signals), enabled=True)
    }


# --- changes (versioned, audited) ---------------------------------------------------------------


class UnwiredSignal(ValueError):
    """A rule on a signal nothing evaluates yet (:data:`UNWIRED_SIGNALS`): refused."""

    def __init__(self, signal: str) -> None:
        super().__init__(
            f"rules on {signal} cannot be saved: NVKE does not evaluate that signal yet "
            "(fleet/health_rules.py says why)"
        )
        self.signal = signal


RULE_FIELDS = (
    "threshold_count",
    "window_s",
    "condition",
    "ladder",
    "escalation_window_s",
    "needs_operator",
    "enabled",
)


def _snapshot(rule: Rule | None) -> dict[str, Any] | None:
    if rule is None:
        return None
    d = rule.as_dict()
    return {k: d[k] for k in ("key", "source", "version", *RULE_FIELDS)}


def save_rule(key: str, values: Mapping[str, Any], *, actor: str) -> Rule:
    """Create or replace the stored rule ``key`` with ``values`` (the :data:`RULE_FIELDS`;
    validated by the caller), bumping its version; audited (``health_rule.save``, before =
    the rule in effect until now, default or stored). Returns the rule now in effect."""
    from tenants import audit

    signal, xid = parse_key(key)
    if signal in UNWIRED_SIGNALS:
        raise UnwiredSignal(signal)
    now = timezone.now()
    with transaction.atomic():
        before = effective_rules().get(key)
        row = HealthRule.objects.select_for_update().filter(signal=signal, xid=xid).first()
        if row is None:  # versions go on where a deleted rule's left off
            row = HealthRule(signal=signal, xid=xid, version=_last_version(key))
        for name in RULE_FIELDS:
            setattr(row, name, list(values[name]) if name == "ladder" else values[name])
        row.version += 1
        row.updated_by, row.updated_at = actor[:100], now
        row.save()
        after = rule_from_row(row, before.nvidia_action if before else "")
        audit.record(
            actor=actor,
            action="health_rule.save",
            target_type="health_rule",
            target_id=key,
            before=_snapshot(before) or {},
            after=_snapshot(after),
        )
    return after


def _last_version(key: str) -> int:
    """The highest version rule ``key`` ever had (0: never stored), from the audit log, which
    keeps every save and delete with the rule before and after: a rule deleted and stored
    again never reuses a version its firings (``HealthRuleFiring.rule_version``) may name."""
    from tenants.models import AuditEvent

    snapshots = AuditEvent.objects.filter(target_type="health_rule", target_id=key).values_list(
        "before", "after"
    )
    return max((int((s or {}).get("version") or 0) for pair in snapshots for s in pair), default=0)


def delete_rule(key: str, *, actor: str) -> Rule | None:
    """Remove the stored rule ``key``: the catalog default (if any) applies again; audited
    (``health_rule.delete``). Returns the rule now in effect; LookupError when none is
    stored."""
    from tenants import audit

    signal, xid = parse_key(key)
    with transaction.atomic():
        row = HealthRule.objects.select_for_update().filter(signal=signal, xid=xid).first()
        if row is None:
            raise LookupError(key)
        before = rule_from_row(row)
        row.delete()
        after = effective_rules().get(key)
        audit.record(
            actor=actor,
            action="health_rule.delete",
            target_type="health_rule",
            target_id=key,
            before=_snapshot(before),
            after=_snapshot(after) or {},
        )
    return after


def with_overrides(rules: Mapping[str, Rule], overrides: Iterable[Rule]) -> dict[str, Rule]:
    """``rules`` with ``overrides`` laid over them (for a dry run of unsaved rules)."""
    out = dict(rules)
    for rule in overrides:
        current = out.get(rule.key)
        out[rule.key] = replace(rule, nvidia_action=current.nvidia_action if current else "")
    return out
