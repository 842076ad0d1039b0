"""Tables (rich), JSON or CSV on stdout."""

from __future__ import annotations

import csv
import enum
import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


class Format(enum.StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: Format, raw: Any = None):
    """Print ``rows`` (the ``columns`` of each) as a table or CSV, or ``raw`` (default: rows)
    as JSON, and flush stdout (so lines written to stderr next come after it)."""
    if fmt is Format.json:
        sys.stdout.write(json.dumps(rows if raw is None else raw, indent=2) + "\n")
    elif fmt is Format.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    else:
        table = Table(*[c.upper() for c in columns], box=None, pad_edge=False)
        for row in rows:
            table.add_row(*["" if row.get(c) is None else str(row.get(c)) for c in columns])
        Console(width=200).print(table)
    # the notes some commands print after the table go to stderr; with both on one pipe,
    # stdout's block buffer would otherwise be flushed mid-line after them ("0.64 USDreser…")
    sys.stdout.flush()
