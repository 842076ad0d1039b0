"""Host import from real nvidia-smi -q -x captures, through the operator API."""

from __future__ import annotations

import pytest

from tests.conftest import capture

pytestmark = pytest.mark.django_db

A100_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"


def post_host(client, hostname, zone, xml):
    return client.post(
        "/api/v1/fleet/hosts",
        {"hostname": hostname, "zone": zone, "nvidia_smi_xml": xml},
        format="json",
    )


def test_it_imports_the_a100_capture_with_its_mig_devices_and_a_warning(operator, catalog):
    resp = post_host(operator, "gpu-a100-01", "us-east-1a", capture("a100-sxm4-v12.xml"))
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["gpu_model"] == "a100-sxm4-80gb"
    assert body["gpu_count"] == 1
    assert body["driver_version"] == "535.54.03"
    assert len(body["bootstrap_token"]) >= 40
    (gpu,) = body["gpus"]
    assert gpu["uuid"] == A100_UUID
    assert gpu["pci_bus_id"] == "00000000:01:00.0"
    assert gpu["memory_total_bytes"] == 81920 * 2**20
    assert gpu["mig_mode"] == "enabled"
    assert [d["gpu_instance_id"] for d in gpu["mig_devices"]] == [3, 4, 5, 6]
    assert {d["memory_total_bytes"] for d in gpu["mig_devices"]} == {19968 * 2**20}
    # the capture says attached_gpus=4 but holds one <gpu>: imported with a warning
    assert body["warnings"] == [
        "report says attached_gpus=4 but contains 1 <gpu> element(s); imported the 1 present"
    ]


@pytest.mark.parametrize(
    ("name", "model", "uuid", "memory_mib"),
    [
        ("a10g.xml", "a10g", "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94", 23028),
        ("tesla-t4.xml", "t4", "GPU-d37e67a5-91dd-3774-a5cb-99096249601a", 15360),
    ],
)
def test_it_imports_non_mig_captures(operator, catalog, name, model, uuid, memory_mib):
    body = post_host(operator, "h1", "us-east-1a", capture(name)).json()
    assert body["gpu_model"] == model
    assert body["warnings"] == []
    assert body["gpus"][0]["uuid"] == uuid
    assert body["gpus"][0]["mig_mode"] is None
    assert body["gpus"][0]["memory_total_bytes"] == memory_mib * 2**20


def test_it_refuses_a_gpu_outside_the_catalog_naming_the_product(operator, catalog):
    from fleet.models import Host

    resp = post_host(operator, "ws-01", "us-east-1a", capture("rtx-4000-sff-ada-v13.xml"))
    assert resp.status_code == 400
    assert resp["Content-Type"] == "application/problem+json"
    body = resp.json()
    assert body["code"] == "unknown_gpu_product"
    assert body["field"] == "nvidia_smi_xml"
    assert "NVIDIA RTX 4000 SFF Ada Generation" in body["detail"]
    assert not Host.objects.exists()


def test_a_gpu_uuid_belongs_to_one_host_only(operator, catalog):
    from fleet.models import Gpu

    assert post_host(operator, "h1", "us-east-1a", capture("a10g.xml")).status_code == 201
    resp = post_host(operator, "h2", "us-east-1a", capture("a10g.xml"))
    assert resp.status_code == 409
    assert resp.json()["code"] == "duplicate_gpu_uuid"
    assert list(Gpu.objects.values_list("host__hostname", flat=True)) == ["h1"]


@pytest.mark.parametrize(
    "xml",
    [
        "<html><body>not a report</body></html>",
        "this is not xml at all",
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]>'
        "<nvidia_smi_log>&lol2;</nvidia_smi_log>",
        '<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        "<nvidia_smi_log>&x;</nvidia_smi_log>",
    ],
)
def test_it_refuses_xml_that_is_not_a_safe_nvidia_smi_report(operator, catalog, xml):
    resp = post_host(operator, "h1", "us-east-1a", xml)
    assert resp.status_code == 400
    assert resp.json()["code"] == "invalid_nvidia_smi_xml"


def test_multipart_upload_imports_the_same_host(operator, catalog):
    from django.core.files.uploadedfile import SimpleUploadedFile

    resp = operator.post(
        "/api/v1/fleet/hosts",
        {
            "hostname": "gpu-t4-09",
            "zone": "us-west-2a",
            "nvidia_smi_xml": SimpleUploadedFile("t4.xml", capture("tesla-t4.xml").encode()),
        },
        format="multipart",
    )
    assert resp.status_code == 201, resp.content
    assert resp.json()["gpus"][0]["uuid"] == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"


def test_tenants_cannot_import_or_list_hosts(owner, catalog):
    assert post_host(owner, "h1", "us-east-1a", capture("a10g.xml")).status_code == 403
    assert owner.get("/api/v1/fleet/hosts").status_code == 403


def test_bootstrap_token_is_single_use(operator, anonymous, catalog):
    token = post_host(operator, "h1", "us-east-1a", capture("a10g.xml")).json()["bootstrap_token"]
    first = anonymous.post("/api/v1/agent/register", {"bootstrap_token": token}, format="json")
    assert first.status_code == 201
    assert len(first.json()["credential"]) >= 40
    again = anonymous.post("/api/v1/agent/register", {"bootstrap_token": token}, format="json")
    assert again.status_code == 401
    assert again.json()["code"] == "invalid_bootstrap_token"


def test_agent_tokens_never_start_with_a_dash():
    """A token starting with '-' broke `nvke-agent run --bootstrap-token TOKEN` (argparse read it
    as an option): found by the scale-out test, 1 agent in 20."""
    from fleet.secrets import new_token

    tokens = [new_token() for _ in range(3000)]  # ~47 would start with '-' by chance
    assert not [t for t in tokens if t.startswith("-")]
    assert len(set(tokens)) == 3000
