"""The ``run`` loop: collect from a source into the spool, and drain the spool to the API.

One thread does both, on two clocks:

* every ``interval_s`` it collects (``source.collect(now)`` + ``source.events()``), builds
  report bodies, gives each a seq (persisted first, :meth:`StateStore.allocate_seq`), writes
  it to the spool and enforces the spool's size cap;
* whenever the spool has batches and no backoff is pending, it sends the oldest one.
  200 -> delete; final 4xx -> spool/rejected/; 401 -> stop with :data:`EXIT_UNAUTHORIZED`,
  spool kept; transient -> wait ``Backoff.next_delay()`` (collection goes on meanwhile, so an
  API outage loses nothing: batches pile up in the spool and drain in seq order later).

Report body (wire format, field names fixed with the server)::

    {"host_id", "seq", "instance_id", "agent_version", "source", "sent_at", "agent_status",
     "driver_version", "cuda_version",
     "inventory": {"gpus": [...]} | null, "samples": [...], "events": [...],
     "source_error": str | null (the source failed this round: NVML does not initialise …),
     "source_error_code": str (only with a source_error the source can name: NVML's return
                          code, NVML_ERROR_DRIVER_NOT_LOADED …),
     "scrub_results": [...] (when some finished), "diagnostics": {...} (once, when run)}

Commands on an acknowledgement (scrubs) run on a background thread
(:class:`nvke_agent.commands.CommandRunner`); their results ride on the next report. DCGM
diagnostics (``diagnostics`` callable) run once at start, also in the background.

``inventory`` is included in the first report after start, then every ``inventory_every``-th
report, and whenever it differs from the last one sent. ``host_id``, ``sent_at`` and
``agent_status`` are stamped at send time (``sent_at`` is when the request left, so the server
can see clock skew; ``agent_status`` is ``{"spool_error", "dropped_reports",
"dropped_samples"}``, now); everything else is fixed when the report is made.
``instance_id`` names this agent process (a random id per start): a report is the same
report whoever resends it, and two agents sharing one identity (a copied state dir) send
different content under one seq, which the server flags.

A state dir that cannot be written (full disk, read-only): see :mod:`nvke_agent.storage` —
the loop keeps sending what is spooled and counts each report it cannot make as dropped.

Stopping: the ``stop`` event (SIGTERM/SIGINT) ends the loop after the request in flight;
unsent batches stay in the spool for the next start. A finite source (replay) that is
``exhausted`` or ``max_reports`` reached ends the loop once the spool is empty.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nvke_agent import __version__
from nvke_agent.client import Ack, ApiClient, Backoff, Refused, RetryLater, Unauthorized
from nvke_agent.commands import CommandRunner, simulated_scrub
from nvke_agent.sources.base import Event, Inventory, Sample, Source, SourceError, format_ts
from nvke_agent.spool import Spool
from nvke_agent.state import StateStore
from nvke_agent.storage import STORAGE_ERRNOS, StorageHealth

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_UNAUTHORIZED = 1

DEFAULT_INVENTORY_EVERY = 10
DEFAULT_MAX_SAMPLES_PER_REPORT = 10_000


class Agent:
    """Runs one source against one API (see module docstring)."""

    def __init__(
        self,
        *,
        source: Source,
        client: ApiClient,
        store: StateStore,
        spool: Spool,
        interval_s: float,
        backoff: Backoff | None = None,
        stop: threading.Event | None = None,
        max_reports: int | None = None,
        inventory_every: int = DEFAULT_INVENTORY_EVERY,
        max_samples_per_report: int = DEFAULT_MAX_SAMPLES_PER_REPORT,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        diagnostics: Callable[[], dict[str, Any] | None] | None = None,
        storage: StorageHealth | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.source = source
        self.client = client
        self.store = store
        self.spool = spool
        self.interval_s = interval_s
        self.backoff = backoff or Backoff()
        self.stop = stop or threading.Event()
        self.max_reports = max_reports
        self.inventory_every = max(1, inventory_every)
        self.max_samples_per_report = max(1, max_samples_per_report)
        self._clock = clock
        self._monotonic = monotonic
        self.storage = storage or StorageHealth()
        #: this process among the agents that ever used this state dir (see module docstring)
        self.instance_id = uuid.uuid4().hex
        self.reports_made = 0
        self.reports_dropped = 0  # not made: the state dir could not be written
        self.batches_acked = 0
        self._last_inventory_key: str | None = None
        self._driver_version: str | None = None
        self._cuda_version: str | None = None
        scrub = getattr(source, "scrub", None) or (lambda c: simulated_scrub(c, source.name))
        self.commands = CommandRunner(scrub)
        self._diagnostics: list[dict[str, Any]] = []
        if diagnostics is not None:
            threading.Thread(
                target=self._run_diagnostics, args=(diagnostics,), name="nvke-diag", daemon=True
            ).start()

    def _run_diagnostics(self, diagnostics: Callable[[], dict[str, Any] | None]) -> None:
        try:
            result = diagnostics()
        except Exception:  # diagnostics are best effort; they never stop the agent
            log.exception("diagnostics failed")
            return
        if result is not None:
            self._diagnostics.append(result)

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Loop until stopped, exhausted or ``max_reports``; returns the process exit status."""
        try:
            return self._loop()
        finally:
            self.commands.close()

    def _loop(self) -> int:
        producing = True
        next_collect = self._monotonic()
        next_send = next_collect
        if len(self.spool):
            log.info("sending %d batch(es) left from a previous run first", len(self.spool))
        while not self.stop.is_set():
            now = self._monotonic()
            if producing and now >= next_collect:
                self.produce()
                if self.storage.error and not len(self.spool):
                    # nothing spooled carries agent_status to the server: say it on its own
                    try:
                        self.send_status()
                    except Unauthorized as exc:
                        log.error(
                            "the API refused this host's credential (HTTP 401: %s); stopping",
                            exc.detail,
                            extra={"fields": {"code": exc.code}},
                        )
                        return EXIT_UNAUTHORIZED
                next_collect += self.interval_s
                if next_collect <= self._monotonic():  # fell behind: do not burst
                    next_collect = self._monotonic() + self.interval_s
                if self._done_producing():
                    producing = False
            if len(self.spool) and self._monotonic() >= next_send:
                try:
                    outcome = self.send_oldest()
                except Unauthorized as exc:
                    log.error(
                        "the API refused this host's credential (HTTP 401: %s); stopping, "
                        "%d batch(es) kept in the spool",
                        exc.detail,
                        len(self.spool),
                        extra={"fields": {"code": exc.code}},
                    )
                    return EXIT_UNAUTHORIZED
                if isinstance(outcome, RetryLater):
                    delay = self.backoff.next_delay(outcome.retry_after_s)
                    next_send = self._monotonic() + delay
                    log.warning(
                        "sending failed (%s); %d batch(es) pending, retrying in %.2f s",
                        outcome.reason,
                        len(self.spool),
                        delay,
                        extra={"fields": {"pending": len(self.spool), "retry_in_s": delay}},
                    )
                else:
                    self.backoff.reset()
                    continue  # more to send? go round again without waiting
            if not producing and not len(self.spool):
                log.info(
                    "done: %d report(s) made, %d batch(es) acknowledged",
                    self.reports_made,
                    self.batches_acked,
                )
                return EXIT_OK
            wake = min(
                next_collect if producing else math.inf,
                next_send if len(self.spool) else math.inf,
            )
            self.stop.wait(max(0.0, wake - self._monotonic()) if wake != math.inf else None)
        log.info("stopping: %d batch(es) left in the spool for the next start", len(self.spool))
        return EXIT_OK

    def _done_producing(self) -> bool:
        made = self.reports_made + self.reports_dropped
        if self.max_reports is not None and made >= self.max_reports:
            return True
        return self.source.exhausted

    # --- producing ------------------------------------------------------------------------------

    def produce(self) -> list[int]:
        """Collect once and spool the resulting report(s); returns their seqs."""
        now = self._clock()
        source_error: str | None = None
        source_error_code: str | None = None
        try:
            samples: list[Sample] = self.source.collect(now)
            events: list[Event] = self.source.events()
        except SourceError as exc:
            log.error("collection failed: %s", exc)
            samples, events = [], []
            source_error, source_error_code = str(exc), exc.code
        try:
            inventory = self.source.inventory()
        except SourceError as exc:
            log.error("inventory failed: %s", exc)
            inventory = None
            if source_error is None:
                source_error, source_error_code = str(exc), exc.code
        if inventory is not None:
            self._driver_version = inventory["driver_version"]
            self._cuda_version = inventory["cuda_version"]

        chunks = [
            samples[i : i + self.max_samples_per_report]
            for i in range(0, len(samples), self.max_samples_per_report)
        ] or [[]]
        seqs = []
        scrub_results = self.commands.take_results()
        diagnostics = self._diagnostics.pop() if self._diagnostics else None
        for position, chunk in enumerate(chunks):
            body = self._body(
                inventory=self._inventory_to_send(inventory),
                samples=chunk,
                events=events if position == 0 else [],
            )
            body["source_error"] = source_error
            if source_error_code is not None:
                body["source_error_code"] = source_error_code
            if position == 0 and scrub_results:
                body["scrub_results"] = scrub_results
            if position == 0 and diagnostics is not None:
                body["diagnostics"] = diagnostics
            try:
                seq = self.store.allocate_seq()  # persisted before the body is written
                body["seq"] = seq
                self.spool.put(seq, body)
            except OSError as exc:
                if exc.errno not in STORAGE_ERRNOS:
                    raise
                self.storage.failed(exc, "spooling a report")
                self._drop_unwritable(chunks[position:])
                return seqs
            self.storage.succeeded()
            self.reports_made += 1
            seqs.append(seq)
        self._enforce_spool_cap()
        return seqs

    def _drop_unwritable(self, chunks: list[list[Sample]]) -> None:
        """Count the reports (one per chunk) that could not be written as dropped."""
        samples = sum(len(chunk) for chunk in chunks)
        self.reports_dropped += len(chunks)
        self.store.count_dropped(len(chunks), samples)
        state = self.store.state
        log.warning(
            "state dir not writable (%s): report of %d sample(s) dropped; %d batch(es) / %d "
            "samples dropped since this host was set up; %d batch(es) still to send",
            self.storage.error,
            samples,
            state.dropped_batches,
            state.dropped_samples,
            len(self.spool),
            extra={
                "fields": {
                    "dropped_samples": samples,
                    "dropped_batches_total": state.dropped_batches,
                    "dropped_samples_total": state.dropped_samples,
                }
            },
        )

    def status(self) -> dict[str, Any]:
        """``agent_status`` of the next report sent (see module docstring)."""
        state = self.store.state
        return {
            "spool_error": self.storage.error,
            "dropped_reports": state.dropped_batches,
            "dropped_samples": state.dropped_samples,
        }

    def _inventory_to_send(self, inventory: Inventory | None) -> dict[str, Any] | None:
        if inventory is None:
            return None
        key = json.dumps(inventory, sort_keys=True)
        due = self.reports_made % self.inventory_every == 0
        if due or key != self._last_inventory_key:
            self._last_inventory_key = key
            return {"gpus": inventory["gpus"]}
        return None

    def _body(
        self,
        *,
        inventory: dict[str, Any] | None,
        samples: list[Sample],
        events: list[Event],
    ) -> dict[str, Any]:
        return {
            "host_id": self.store.state.host_id,
            "seq": None,
            "instance_id": self.instance_id,
            "agent_version": __version__,
            "source": self.source.name,
            "sent_at": None,
            "driver_version": self._driver_version,
            "cuda_version": self._cuda_version,
            "inventory": inventory,
            "samples": samples,
            "events": events,
        }

    def _enforce_spool_cap(self) -> None:
        dropped = self.spool.enforce_cap()
        if not dropped:
            return
        samples = sum(batch.samples for batch in dropped)
        self.store.count_dropped(len(dropped), samples)
        state = self.store.state
        log.error(
            "SPOOL OVER ITS CAP (%d bytes): DROPPED %d oldest batch(es) (seq %d..%d, %d "
            "samples); %d batch(es) / %d samples dropped since this host was set up",
            self.spool.max_bytes,
            len(dropped),
            dropped[0].seq,
            dropped[-1].seq,
            samples,
            state.dropped_batches,
            state.dropped_samples,
            extra={
                "fields": {
                    "dropped_batches": len(dropped),
                    "dropped_samples": samples,
                    "dropped_batches_total": state.dropped_batches,
                    "dropped_samples_total": state.dropped_samples,
                }
            },
        )

    # --- sending --------------------------------------------------------------------------------

    def send_status(self) -> Ack | Refused | RetryLater:
        """Send a status report: ``seq`` null, nothing produced, only ``agent_status``.

        Sent after each collection round while the state dir cannot be written and the spool
        is empty (nothing spooled is left to carry ``agent_status``); the server sets the
        host's ``agent spool:`` warning from it. Not spooled and not retried: the next round
        sends a fresh one. Raises :class:`Unauthorized` on 401.
        """
        credential = self.store.state.credential
        if not credential:
            raise Unauthorized(401, "this host is not registered")
        body = self._body(inventory=None, samples=[], events=[])
        body["host_id"] = self.store.state.host_id
        body["agent_status"] = self.status()
        body["sent_at"] = format_ts(self._clock())
        outcome = self.client.send_report(credential, body)
        if isinstance(outcome, Ack):
            log.info("status report acknowledged (state dir not writable, spool empty)")
        else:
            why = (
                outcome.reason
                if isinstance(outcome, RetryLater)
                else f"HTTP {outcome.status}: {outcome.detail}"
            )
            log.warning("status report not delivered: %s", why)
        return outcome

    def send_oldest(self) -> Ack | Refused | RetryLater | None:
        """Send the oldest spooled batch once; ``None`` if it turned out unreadable."""
        pending = self.spool.pending()
        if not pending:
            return None
        seq = pending[0]
        body = self.spool.load(seq)
        if body is None:
            return None
        credential = self.store.state.credential
        if not credential:
            raise Unauthorized(401, "this host is not registered")
        body["host_id"] = self.store.state.host_id
        body["agent_status"] = self.status()
        body["sent_at"] = format_ts(self._clock())
        outcome = self.client.send_report(credential, body)
        if isinstance(outcome, Ack):
            if outcome.seq is not None and outcome.seq != seq:
                log.error("API acknowledged seq %s for batch seq %d; will resend", outcome.seq, seq)
                return RetryLater(f"acknowledgement for the wrong seq {outcome.seq}")
            self.spool.ack(seq)
            self.batches_acked += 1
            if outcome.commands and self.commands.submit(outcome.commands):
                log.info("the API asked for %d command(s)", len(outcome.commands))
            log.info(
                "batch seq=%d acknowledged%s",
                seq,
                " (duplicate)" if outcome.duplicate else "",
                extra={
                    "fields": {
                        "seq": seq,
                        "duplicate": outcome.duplicate,
                        "samples_stored": outcome.samples_stored,
                        "samples_rejected": outcome.samples_rejected,
                    }
                },
            )
            if outcome.identity_conflict:
                log.error(
                    "the API had batch seq=%d with other content: another agent is using this "
                    "host's identity (a copy of %s?); the API flagged the host",
                    seq,
                    self.store.state_dir,
                    extra={"fields": {"seq": seq, "instance_id": self.instance_id}},
                )
            if outcome.samples_rejected:
                log.warning(
                    "API rejected %d sample(s) of batch seq=%d", outcome.samples_rejected, seq
                )
        elif isinstance(outcome, Refused):
            self.spool.reject(seq, status=outcome.status, detail=outcome.detail)
        return outcome
