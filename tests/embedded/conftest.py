"""Fixtures for the embedded-runner tests (no Django settings, no database fixtures)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A fresh ``NVKE_DATA_DIR`` for one test."""
    return tmp_path / "data"
