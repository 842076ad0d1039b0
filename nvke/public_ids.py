"""Public ids of rows with a serial primary key.

A ``BigAutoField`` id is one sequence for every tenant: tenant B reading its own ledger rows
``7, 9, 12`` learns that someone else allocated twice in between (issue 26). Tenant-facing
output (API, CSV, portal, webhook payloads, invoice ``details``) never shows a serial id of a
table tenants share; such a table carries a random UUID, :func:`public_id_field`, and shows
that instead (the serial stays the internal key: joins, foreign keys, ordering). Tables whose
primary key is already a UUID need nothing.
"""

from __future__ import annotations

from django.contrib.postgres.functions import RandomUUID
from django.db import models


def public_id_field() -> models.UUIDField:
    """A UUID column filled by PostgreSQL (``gen_random_uuid()``), so rows inserted by raw
    SQL or ``COPY`` get one too; Django reads it back on insert (``RETURNING``). Adding it to
    a table fills existing rows, each with its own value."""
    return models.UUIDField(db_default=RandomUUID(), unique=True, editable=False)
