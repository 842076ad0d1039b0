"""``nvkectl usage`` prints its table on stdout, then notes on stderr: with both on one pipe
the table must be written out first (issue 33 M1: "0.64 USDreservation blk: …" when stdout's
block buffer was flushed after the notes)."""

from __future__ import annotations

import io
import sys

import pytest
from nvkectl.output import Format, emit


@pytest.mark.parametrize("fmt", list(Format))
def test_emit_writes_the_table_out_before_returning(monkeypatch, fmt):
    raw = io.BytesIO()
    # a block-buffered stdout as on a pipe: nothing reaches ``raw`` until a flush
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8"))
    emit([{"pool": "rsv", "cost": "0.64 USD"}], ["pool", "cost"], fmt)
    written = raw.getvalue().decode()
    assert "0.64 USD" in written
    assert written.endswith("\n")
