"""A host's NVLink domain from the operator (host import) and from its agent (per-GPU fabric
info in the report), through the API: one place stores it (the host), GPUs that disagree
leave the host without one and say why, malformed ids are 400s naming the field.

The GB200 trays here are SIMULATED (tests.conftest.make_host: database rows, no hardware).
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.models import Host
from fleet.services import reissue_bootstrap_token
from tests.conftest import capture

pytestmark = pytest.mark.django_db

UUID_A = "5b6f3c2a-9d41-4e8b-a7c2-0f1e2d3c4b5a"
UUID_B = "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"


def fabric(cluster=UUID_A, clique=32766, state="completed", status=0):
    return {"state": state, "status": status, "cluster_uuid": cluster, "clique_id": clique}


@pytest.fixture
def tray_agent(make_host, anonymous):
    """A SIMULATED GB200 tray (4 GPUs) with a registered agent credential."""
    host = make_host("gb200", gpus=4, hostname="nvl72-tray01")
    token = reissue_bootstrap_token(host)
    reg = anonymous.post("/api/v1/agent/register", {"bootstrap_token": token}, format="json")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {reg.json()['credential']}")
    uuids = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    return client, host, uuids


def send(client, host, seq, uuids, fabrics):
    inventory = {
        "gpus": [
            {"uuid": u, "index": i, "fabric": f}
            for i, (u, f) in enumerate(zip(uuids, fabrics, strict=True))
        ]
    }
    body = {"host_id": str(host.id), "seq": seq, "samples": [], "inventory": inventory}
    return client.post("/api/v1/agent/reports", body, format="json")


def test_the_agents_fabric_info_sets_the_hosts_domain_and_disagreement_clears_it(
    tray_agent, operator
):
    client, host, uuids = tray_agent
    assert send(client, host, 1, uuids, [fabric()] * 4).status_code == 200
    body = operator.get(f"/api/v1/fleet/hosts/{host.id}").json()
    assert body["nvlink_domain"] == {
        "cluster_uuid": UUID_A,
        "clique_id": 32766,
        "label": f"{UUID_A}.32766",
    }
    # GPU 3 now says another clique: the host is in no domain, with a warning naming it
    mixed = [fabric()] * 3 + [fabric(clique=7)]
    assert send(client, host, 2, uuids, mixed).status_code == 200
    body = operator.get(f"/api/v1/fleet/hosts/{host.id}").json()
    assert body["nvlink_domain"] is None
    (warning,) = [w for w in body["warnings"] if w.startswith("nvlink domain:")]
    assert warning == (
        f"nvlink domain: GPUs disagree on the domain: {uuids[3]} in {UUID_A}.7, "
        f"{uuids[2]} in {UUID_A}.32766; the host is in no NVLink domain"
    )
    # agreement again: the domain is back, the warning gone
    assert send(client, host, 3, uuids, [fabric(clique=7)] * 4).status_code == 200
    host.refresh_from_db()
    assert (str(host.nvlink_cluster_uuid), host.nvlink_clique_id) == (UUID_A, 7)
    assert not [w for w in host.warnings if w.startswith("nvlink domain:")]


@pytest.mark.parametrize(
    ("bad", "field", "code"),
    [
        (
            fabric(cluster="not-a-uuid"),
            "inventory.gpus[0].fabric.cluster_uuid",
            "invalid_cluster_uuid",
        ),
        (fabric(clique=-1), "inventory.gpus[0].fabric.clique_id", "invalid_clique_id"),
        (fabric(clique=2**32), "inventory.gpus[0].fabric.clique_id", "invalid_clique_id"),
        (fabric(state="ready"), "inventory.gpus[0].fabric.state", "invalid_value"),
    ],
)
def test_a_malformed_fabric_report_is_a_400_and_changes_nothing(tray_agent, bad, field, code):
    client, host, uuids = tray_agent
    resp = send(client, host, 1, uuids, [bad] + [fabric()] * 3)
    assert resp.status_code == 400, resp.content
    assert (resp.json()["field"], resp.json()["code"]) == (field, code)
    host.refresh_from_db()
    assert host.nvlink_cluster_uuid is None and host.inventory_count == 0


def import_host(operator, **fields):
    body = {"hostname": "h1", "zone": "us-east-1a", "nvidia_smi_xml": capture("a10g.xml")}
    body.update(fields)
    return operator.post("/api/v1/fleet/hosts", body, format="json")


def test_an_operator_sets_the_domain_at_import(operator, catalog):
    resp = import_host(operator, nvlink_cluster_uuid=UUID_B, nvlink_clique_id="12")
    assert resp.status_code == 201, resp.content
    assert resp.json()["nvlink_domain"]["label"] == f"{UUID_B}.12"
    host = Host.objects.get(hostname="h1")
    assert (str(host.nvlink_cluster_uuid), host.nvlink_clique_id) == (UUID_B, 12)


@pytest.mark.parametrize(
    ("fields", "field", "code"),
    [
        (
            {"nvlink_cluster_uuid": "GPU-5b6f3c2a", "nvlink_clique_id": "1"},
            "nvlink_cluster_uuid",
            "invalid_cluster_uuid",
        ),
        (
            {
                "nvlink_cluster_uuid": "00000000-0000-0000-0000-000000000000",
                "nvlink_clique_id": "1",
            },
            "nvlink_cluster_uuid",
            "invalid_cluster_uuid",
        ),
        (
            {"nvlink_cluster_uuid": UUID_A, "nvlink_clique_id": "-3"},
            "nvlink_clique_id",
            "invalid_clique_id",
        ),
        (
            {"nvlink_cluster_uuid": UUID_A, "nvlink_clique_id": "4294967296"},
            "nvlink_clique_id",
            "invalid_clique_id",
        ),
        (
            {"nvlink_cluster_uuid": UUID_A, "nvlink_clique_id": "1e3"},
            "nvlink_clique_id",
            "invalid_clique_id",
        ),
        ({"nvlink_cluster_uuid": UUID_A}, "nvlink_clique_id", "incomplete_nvlink_domain"),
        ({"nvlink_clique_id": "5"}, "nvlink_cluster_uuid", "incomplete_nvlink_domain"),
    ],
)
def test_a_malformed_domain_at_import_is_a_400_naming_the_field(
    operator, catalog, fields, field, code
):
    resp = import_host(operator, **fields)
    assert resp.status_code == 400, resp.content
    assert (resp.json()["field"], resp.json()["code"]) == (field, code)
    assert not Host.objects.filter(hostname="h1").exists()


def test_real_captures_without_a_fabric_give_no_domain(operator, catalog):
    # a10g.xml has no <fabric>; the RTX 4000 Ada capture prints N/A throughout (see
    # fleet/captures), the A100 one only state/status N/A
    from nvke_agent.smi_xml import parse_nvidia_smi_xml

    for name in ("a10g.xml", "a100-sxm4-v12.xml", "rtx-4000-sff-ada-v13.xml"):
        report = parse_nvidia_smi_xml(capture(name))
        assert [g.fabric for g in report.gpus] == [None] * len(report.gpus), name
    resp = import_host(operator)
    assert resp.status_code == 201 and resp.json()["nvlink_domain"] is None
