"""A client generated from the live schema with openapi-python-client drives the main job over
real HTTP with a real worker: create -> wait for the operation -> kubeconfig -> a typed 409 ->
delete. The generator runs as an integrator would run it (its CLI, the config in docs/)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import requests
import yaml

from tests.conftest import capture
from tests.e2e.conftest import BIN, ROOT, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def generated_client(live_server, tmp_path):
    """Generate ``nvke_client`` from ``/api/v1/schema/`` into tmp_path and import it."""
    schema = requests.get(f"{live_server.url}/api/v1/schema/", timeout=30)
    assert schema.status_code == 200
    (tmp_path / "openapi.yaml").write_text(schema.text)
    out = tmp_path / "gen"
    out.mkdir()
    result = subprocess.run(
        [
            str(BIN / "openapi-python-client"),
            "generate",
            "--path",
            str(tmp_path / "openapi.yaml"),
            "--config",
            str(ROOT / "docs" / "openapi-python-client.yaml"),
            "--meta",
            "none",
        ],
        cwd=out,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stdout, result.stdout  # no endpoint or model was dropped
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("nvke_client")
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m.startswith("nvke_client")]:
            del sys.modules[name]


def test_a_generated_client_creates_waits_downloads_kubeconfig_and_deletes(
    live_server, worker, catalog, generated_client
):
    from fleet.services import import_host
    from tenants.services import create_api_key, create_tenant

    from_api = importlib.import_module
    clusters_create = from_api("nvke_client.api.clusters.clusters_create")
    clusters_retrieve = from_api("nvke_client.api.clusters.clusters_retrieve")
    clusters_kubeconfig = from_api("nvke_client.api.clusters.clusters_kubeconfig_retrieve")
    clusters_destroy = from_api("nvke_client.api.clusters.clusters_destroy")
    operations_retrieve = from_api("nvke_client.api.operations.operations_retrieve")
    models = from_api("nvke_client.models")

    import_host(hostname="gpu-a10g-01", zone="us-east-1b", nvidia_smi_xml=capture("a10g.xml"))
    key = create_api_key(tenant=create_tenant(name="acme"), name="gen", role="owner")[1]
    client = generated_client.AuthenticatedClient(base_url=live_server.url, token=key)
    body = models.ClusterCreateRequest(name="gen", kubernetes_version="1.36", region="us-east-1")

    created = clusters_create.sync_detailed(client=client, body=body)
    assert created.status_code == 202
    op = created.parsed
    assert isinstance(op, models.Operation)
    assert created.headers["Location"] == f"{live_server.url}/api/v1/operations/{op.id}"
    assert created.headers["Retry-After"] == "2"
    assert op.type_ == "CREATE_CLUSTER"

    def operation_status(op_id):
        return operations_retrieve.sync(client=client, id=op_id).status.value

    wait_for(lambda: operation_status(op.id) == "DONE", what="CREATE_CLUSTER DONE")
    cluster = clusters_retrieve.sync(client=client, id=op.target_id)
    assert cluster.phase.value == "RUNNING"
    assert cluster.name == "gen"

    kubeconfig = yaml.safe_load(clusters_kubeconfig.sync(client=client, id=op.target_id))
    assert kubeconfig["kind"] == "Config"
    assert kubeconfig["clusters"][0]["cluster"]["server"] == cluster.endpoint

    again = clusters_create.sync_detailed(client=client, body=body)
    assert again.status_code == 409
    problem = again.parsed
    assert isinstance(problem, models.Problem)
    assert problem.code == "duplicate_cluster_name"
    assert problem.status == 409
    assert problem.retryable is False
    assert problem.detail == "a cluster named 'gen' already exists"

    deleted = clusters_destroy.sync_detailed(client=client, id=op.target_id)
    assert deleted.status_code == 202
    assert deleted.parsed.type_ == "DELETE_CLUSTER"
    wait_for(lambda: operation_status(deleted.parsed.id) == "DONE", what="DELETE_CLUSTER DONE")
    assert clusters_retrieve.sync(client=client, id=op.target_id).phase.value == "DELETED"
