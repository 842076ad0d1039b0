"""``nvkectl clusters list`` and ``nodepools list`` offer ``--show-deleted`` (issue 33 item
5); the API hides DELETED rows by default (tests/api/test_deleted_hidden.py) and the flag asks
it for them (tests/e2e/test_nvkectl.py runs it against a live server)."""

from __future__ import annotations

import pytest
from nvkectl.main import app
from typer.testing import CliRunner


@pytest.mark.parametrize("command", [["clusters", "list"], ["nodepools", "list"]])
def test_the_flag_is_offered(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "--show-deleted" in result.output
