"""COPY rows of a Django model into its table, with every column the model has today.

Benchmarks load tens of thousands of rows with PostgreSQL COPY. A hand-written column list
rots: a new NOT NULL column (``fleet_host.drain_force``) made the placement benchmark's COPY
fail with NotNullViolation. Here the column list is the model's concrete fields, and a field
a row does not name takes the model's default (``auto_now``/``auto_now_add`` fields: now), so
a column added later needs no change to the benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from django.db import connection, models


def copy_rows(model: type[models.Model], rows: Iterable[Mapping[str, Any]]) -> int:
    """COPY ``rows`` into ``model``'s table; returns the number of rows written.

    Each row maps field names (``gpu_model`` or its column ``gpu_model_id``) to Python values;
    fields a row leaves out take the field's default. Values go through the field's
    ``get_db_prep_save`` (a JSONField's dict becomes JSONB). Raises ``ValueError`` naming the
    field when a row leaves out a NOT NULL field that has no default, and
    ``KeyError`` naming any key that is not a field of the model.
    """
    # an AutoField's column is left to its sequence
    fields = [f for f in model._meta.concrete_fields if not f.db_returning]
    names = {f.name: f for f in fields} | {f.attname: f for f in fields}
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    now = datetime.now(UTC)
    written = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg 3
        with raw.copy(f"COPY {model._meta.db_table} ({columns}) FROM STDIN") as copy_:
            for row in rows:
                unknown = [k for k in row if k not in names]
                if unknown:
                    raise KeyError(f"{model.__name__} has no field {unknown[0]!r}")
                given = {names[k].attname: v for k, v in row.items()}
                values = []
                for f in fields:
                    if f.attname in given:
                        value = given[f.attname]
                    elif getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                        value = now
                    else:  # the default, "" for a text field, None for a nullable one
                        value = f.get_default()
                        if value is None and not f.null:
                            raise ValueError(f"{model.__name__}.{f.name} has no default: give it")
                    values.append(f.get_db_prep_save(value, connection))
                copy_.write_row(values)
                written += 1
    return written
