"""The one writer of ``Host.warnings``: every warning belongs to a kind (its text's prefix),
and a writer only ever replaces the warnings of its own kind, in place, in one UPDATE.

Why one writer: ingestion used to read ``host.warnings`` when a report arrived (the row the
credential check loaded) and write the whole list back at the end of its transaction. A
warning another writer had cleared meanwhile — the observed-state gate's "waiting for the
agent" once the node was READY — came back with that report and stayed until the next
change of the same kind (21 minutes in a fault trial). Here no writer rewrites another kind's
warnings: the UPDATE filters the row's *current* array (PostgreSQL re-reads a row another
transaction updated before applying a READ COMMITTED UPDATE), so concurrent writers of
different kinds compose and no update is lost.

The kinds are the prefixes below (a warning's text starts with its kind's prefix, which keeps
the API's plain list of strings).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.db import connection

from .models import Host

#: the agent's clock is off the server's (fleet.ingest)
AGENT_CLOCK = "agent clock:"
#: the agent's source fails (NVML does not initialise …; fleet.ingest)
AGENT_SOURCE = "agent source:"
#: the agent reports but cannot read the host's GPUs: their health is UNKNOWN
#: (fleet.health.apply_source_health)
GPU_HEALTH_UNKNOWN = "gpu health unknown:"
#: the agent's inventory disagrees with the host record (fleet.ingest)
AGENT_INVENTORY = "agent inventory:"
#: two agents report with this host's credential (fleet.ingest)
AGENT_IDENTITY = "agent identity:"
#: the agent cannot write its spool / state (full disk, read-only; fleet.ingest)
AGENT_SPOOL = "agent spool:"
#: the reported NVLink domain is unusable (fleet.nvlink_domains)
NVLINK_DOMAIN = "nvlink domain:"
#: per node: ``observed state: node <name> `` (nodepools.observed_gates)
OBSERVED_STATE = "observed state: node "
#: released MIG GPU instances whose slices the agent has not confirmed scrubbed (fleet.shared_hosts)
SLICE_SCRUB = "slice scrub overdue: "

#: prefix -> the kind's name in metrics (``nvke_fleet_hosts_warned{kind}``)
KINDS = {
    AGENT_CLOCK: "agent_clock",
    AGENT_SOURCE: "agent_source",
    GPU_HEALTH_UNKNOWN: "gpu_health_unknown",
    AGENT_INVENTORY: "agent_inventory",
    AGENT_IDENTITY: "agent_identity",
    AGENT_SPOOL: "agent_spool",
    NVLINK_DOMAIN: "nvlink_domain",
    OBSERVED_STATE: "observed_state",
    SLICE_SCRUB: "slice_scrub",
}

MAX_LENGTH = 500


def set_host_warning(host_id: Any, prefix: str, text: str | None) -> bool:
    """Replace the host's warnings that start with ``prefix`` by ``text`` (None: remove them).
    Returns whether the row changed. See :func:`set_host_warnings`."""
    return set_host_warnings(host_id, {prefix: text})


def set_host_warnings(host_id: Any, changes: Mapping[str, str | None]) -> bool:
    """Apply ``{prefix: text or None}`` to the host's warnings in one UPDATE: the warnings
    starting with each prefix are removed, each non-empty text (cut to 500 characters) is
    appended (a kind whose warning is already that text is left alone); other warnings keep
    their order. Returns whether the row changed.

    Read first without a lock (nothing to do is the common case: the same warning again),
    then an UPDATE that edits the row's current array in place, so a concurrent writer of
    another kind is never overwritten. Safe inside or outside a transaction.
    """
    if not changes:
        return False
    current = Host.objects.filter(pk=host_id).values_list("warnings", flat=True).first()
    if current is None:
        return False
    changed = {
        prefix: text[:MAX_LENGTH] if text else None
        for prefix, text in changes.items()
        if [w for w in current if w.startswith(prefix)] != ([text[:MAX_LENGTH]] if text else [])
    }
    if not changed:
        return False
    prefixes = list(changed)
    added = [text for text in changed.values() if text]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE fleet_host SET warnings = COALESCE(("
            " SELECT jsonb_agg(w ORDER BY n) FROM jsonb_array_elements_text(warnings)"
            " WITH ORDINALITY AS t(w, n)"
            " WHERE NOT EXISTS (SELECT 1 FROM unnest(%s::text[]) AS p WHERE starts_with(w, p))"
            "), '[]'::jsonb) || %s::jsonb WHERE id = %s",
            [prefixes, json.dumps(added), host_id],
        )
        return cursor.rowcount == 1
