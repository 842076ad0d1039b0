"""``nvkectl clusters list`` hides DELETED clusters as the portal does; ``--show-deleted``
lists them (issue 33 item 5)."""

from __future__ import annotations

from nvkectl.main import app, visible_clusters
from typer.testing import CliRunner

ROWS = [{"name": "train", "phase": "RUNNING"}, {"name": "old", "phase": "DELETED"}]


def test_deleted_clusters_are_hidden_unless_asked_for():
    assert [r["name"] for r in visible_clusters(ROWS, False)] == ["train"]
    assert [r["name"] for r in visible_clusters(ROWS, True)] == ["train", "old"]


def test_the_flag_is_offered():
    result = CliRunner().invoke(app, ["clusters", "list", "--help"])
    assert result.exit_code == 0
    assert "--show-deleted" in result.output
