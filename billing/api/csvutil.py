"""CSV downloads (``text/csv``, RFC 4180 via the csv module).

Cells are neutralised against formula injection (OWASP "CSV Injection"): a text cell that
starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return (a cluster name, a GPU UUID
an agent reported, a price label) gets a leading ``'`` so a spreadsheet shows it as text
instead of evaluating it. Numbers (``-12.50``, Decimals, ints) stay numbers.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.http import HttpResponse

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")


def neutralise(text: str) -> str:
    """``"=HYPERLINK(...)"`` -> ``"'=HYPERLINK(...)"``; ``"-12.50"`` and ``"gpu-1"`` unchanged."""
    if text.startswith(_FORMULA_START) and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return f"{value:f}"
    if isinstance(value, bool | int | float):
        return str(value)
    return neutralise(str(value))


def csv_response(filename: str, header: Sequence[str], rows: Iterable[Sequence[Any]]):
    """An attachment ``filename`` with ``header`` then ``rows`` (CRLF line ends)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    for row in rows:
        writer.writerow([_cell(v) for v in row])
    return HttpResponse(
        buffer.getvalue(),
        content_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
