"""What the views say of a pool's driver (issue 33: a fresh-user trial read "GPU Operator
default" on a pool whose node ran 570.172.08 — the host's driver — while the catalog says the
GPU Operator chart's default is 595.91.07). A pool without a pin runs its host's driver,
shown per node; the portal, the API's help, the forms and nvkectl say that.

Fleet by hand: SIMULATED 8-GPU H100 hosts gpu-a and gpu-b reporting 570.172.08; ``ex4``
(4 GPUs, no pin) lands on gpu-a; ``pinned`` (4 GPUs, R580) on the empty gpu-b (the driver is
the host's: not beside ex4), where its boot installs 580.95.05.
"""

from __future__ import annotations

import re

import pytest

from nodepools.host_drivers import DRIVER_PIN_HELP, DRIVER_UPGRADE_HELP
from tests.helpers import drive_pool, make_cluster

pytestmark = pytest.mark.django_db

MODEL = "h100-sxm5-80gb"


def test_the_pool_page_says_pinned_or_not_and_each_node_shows_its_hosts_driver(
    make_host, owner, alice_client
):
    from fleet.models import Host

    for name in ("gpu-a", "gpu-b"):
        host = make_host(MODEL, gpus=8, hostname=name)
        Host.objects.filter(pk=host.pk).update(driver_version="570.172.08")
    cluster = make_cluster(owner, "c1")
    pools = {}
    for name, driver in (("ex4", ""), ("pinned", "R580")):
        op = owner.post(
            f"/api/v1/clusters/{cluster}/nodepools",
            {
                "name": name,
                "gpu_model": MODEL,
                "gpus_per_node": 4,
                "node_count": 1,
                "driver_version": driver,
            },
            format="json",
        ).json()
        drive_pool(op["target_id"])
        pools[name] = op["target_id"]

    def page(name: str) -> tuple[str, list[str], list[str]]:
        html = alice_client.get(f"/clusters/{cluster}/nodepools/{pools[name]}").content.decode()
        said = re.search(r'<dd id="pool-driver">(.*?)</dd>', html, re.S).group(1)
        hosts = re.findall(r"<td>(gpu-[ab]) · ", html)
        drivers = re.findall(r'data-col="driver"[^>]*>([^<]*)<', html)
        return said, hosts, drivers

    assert page("ex4") == (
        'not pinned <span class="muted">(each node runs its host\'s driver: its row below)</span>',
        ["gpu-a"],
        ["570.172.08"],
    )
    assert page("pinned") == (
        'R580 <span class="muted">(pinned; the release each node runs: its row below)</span>',
        ["gpu-b"],
        ["580.95.05"],
    )
    assert (
        "GPU Operator default"
        not in alice_client.get(f"/clusters/{cluster}/nodepools/{pools['ex4']}").content.decode()
    )


def test_the_forms_and_the_api_schema_say_what_no_pin_means(
    make_host, owner, alice_client, anonymous
):
    make_host(MODEL, gpus=8, hostname="gpu-a")  # the region has GPU hosts
    cluster = make_cluster(owner, "c1")
    form = alice_client.get(f"/clusters/{cluster}/nodepools/new").content.decode()
    assert DRIVER_PIN_HELP in form.replace("&#x27;", "'")
    schema = anonymous.get(
        "/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json"
    ).json()["components"]["schemas"]
    described = {
        name: schema[name]["properties"]["driver_version"].get("description")
        for name in ("NodePoolCreateRequest", "NodePool", "UpgradeRequest", "Node")
    }
    assert described == {
        "NodePoolCreateRequest": DRIVER_PIN_HELP,
        "NodePool": DRIVER_PIN_HELP,
        "UpgradeRequest": DRIVER_UPGRADE_HELP,
        "Node": "the NVIDIA driver the node's host runs, as its agent last reported it (one for "
        "every node of the host; the pool's pin, if any, is installed there); null before the "
        "node has a host",
    }
    assert DRIVER_PIN_HELP.startswith(
        "driver branch (R580) or release (580.95.05) to pin; blank: no pin, each node runs "
        "the driver its host already has"
    )


def test_nvkectl_names_the_pin_or_says_not_pinned():
    from nvkectl.main import POOL_COLUMNS
    from nvkectl.pools import pool_row

    assert "driver" in POOL_COLUMNS
    assert pool_row({"name": "ex4", "driver_version": ""})["driver"] == "not pinned"
    assert pool_row({"name": "p", "driver_version": "R580"})["driver"] == "R580"
