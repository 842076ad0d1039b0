"""``nvkectl clusters versions`` offers the Kubernetes versions a new cluster can run on this
installation: the catalog's ``runnable`` ones (issue 33: ``clusters create -k 1.35`` was taken
on the hosted provider, which builds no 1.35 binaries, and never became ready).

Against Django's live server (in this process); the catalog supports 1.35, 1.36 and 1.37 today
(catalog/data/kubernetes_versions.yaml), the hosted provider runs 1.36 and 1.37."""

from __future__ import annotations

import pytest
from nvkectl.main import app
from typer.testing import CliRunner

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("provider", "listed"),
    [("hosted", ["1.37", "1.36"]), ("simulated", ["1.37", "1.36", "1.35"])],
)
def test_it_lists_only_the_versions_this_installation_runs(
    live_server, catalog, settings, tmp_path, monkeypatch, provider, listed
):
    from tenants.services import create_api_key, create_tenant

    settings.NVKE_DEFAULT_PROVIDER = provider
    key = create_api_key(tenant=create_tenant(name="acme"), name="cli", role="viewer")[1]
    monkeypatch.setenv("NVKECTL_CONFIG", str(tmp_path / "nvkectl.yaml"))
    runner = CliRunner()
    setup = ["config", "set-context", "t", "--server", live_server.url, "--api-key", key]
    assert runner.invoke(app, setup).exit_code == 0
    result = runner.invoke(app, ["clusters", "versions", "-o", "csv"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "version,released,end_of_life"
    assert [line.split(",")[0] for line in lines[1:]] == listed
    assert "1.36,2026-04-22,2027-06-28" in lines
