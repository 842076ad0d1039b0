"""What a tenant reads about a shared MIG pool agrees with what each node really holds (issue
33 items 3 and 6): four nodes of one ``1g.10gb`` instance each on a shared H100 host.

* the pool page lists each node's ONE instance ("GPU instances of each node: 1g.10gb"), not
  the 7 instances of a whole GPU; the delete page says "4 node(s)" and "4 GPU instance(s)
  released from GPUs other tenants share", not "4 GPU(s)" (the GPUs are not the tenant's);
* each node row shows its Kubernetes version (the kubelet's, the node's status) and its
  driver as the host's agent reports it (the simulated host's driver 570.172.08:
  clusters/providers/simhosts.py), the same values the API gives for the node and the
  console for its GPU's holder.

Hosts are SIMULATED INFRASTRUCTURE (``make_host``); nodes are driven by the real reconciler.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import drive_pool, make_cluster
from tests.nodepools.test_shared_hosts import make_pool, shared

pytestmark = pytest.mark.django_db

MODEL = "h100-sxm5-80gb"
SIMULATED_DRIVER = "570.172.08"  # what a simulated host's agent reports before any upgrade


@pytest.fixture
def shared_pool(make_host, operator, owner):
    from fleet.models import Host

    host = make_host(MODEL, gpus=1, hostname="hv-pages-1")
    # as an imported or demo host: its agent reports this driver (make_host leaves it blank)
    Host.objects.filter(pk=host.pk).update(driver_version=SIMULATED_DRIVER)
    response = operator.post(
        f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"}, format="json"
    )
    assert response.status_code == 200, response.json()
    cluster = make_cluster(owner, "c")
    pool = make_pool(owner, cluster, "mig1g", shared("1g.10gb"), nodes=4)
    drive_pool(pool)
    return host, cluster, pool


def test_the_pool_page_lists_each_nodes_one_instance_and_its_versions(
    shared_pool, alice_client, owner
):
    from nodepools.models import Node

    _, cluster, pool = shared_pool
    nodes = list(Node.objects.filter(nodepool_id=pool, phase="READY"))
    assert len(nodes) == 4
    html = alice_client.get(f"/clusters/{cluster}/nodepools/{pool}").content.decode()
    instances = re.search(r'<dd class="mono" id="node-instances">(.*?)</dd>', html, re.S).group(1)
    assert instances.count("1g.10gb") == 1
    assert "GPU instances on each GPU" not in html
    assert '<dd id="pool-size">4 node(s) \u00d7 1 GPU instance(s)</dd>' in html
    assert '<dd id="pool-isolation">MIG 1g.10gb (single) · shared' in html
    # the cluster page: the pool's row counts GPU instances on shared GPUs, not "4 GPU(s)"
    page = alice_client.get(f"/clusters/{cluster}").content.decode()
    row = page.split('<tr data-pool="mig1g">')[1].split("</tr>")[0]
    assert "MIG 1g.10gb (single) · shared" in row
    assert '<td data-col="gpus">4 GPU instance(s), 1 per node, on shared GPUs</td>' in row
    # ... and its node rows name each node's versions, as the pool page does (issue 33 item 6)
    assert (
        re.findall(r'data-col="versions"[^>]*>([^<]*)<', page)
        == [f"Kubernetes 1.36 · driver {SIMULATED_DRIVER}"] * 4
    )
    # every node row: Kubernetes 1.36 (the cluster's, as the kubelet booted) and the driver
    # the host's agent reports
    assert re.findall(r'data-col="kubernetes">([^<]*)<', html) == ["1.36"] * 4
    assert re.findall(r'data-col="driver"[^>]*>([^<]*)<', html) == [SIMULATED_DRIVER] * 4
    # the API says the same of each node
    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    assert (
        sorted((n["kubernetes_version"], n["driver_version"]) for n in body["nodes"])
        == [("1.36", SIMULATED_DRIVER)] * 4
    )
    listed = owner.get(f"/api/v1/clusters/{cluster}/nodepools").json()["results"]
    assert [(n["kubernetes_version"], n["driver_version"]) for n in listed[0]["nodes"]] == [
        ("1.36", SIMULATED_DRIVER)
    ] * 4
    # the node page too
    page = alice_client.get(
        f"/clusters/{cluster}/nodepools/{pool}/nodes/{nodes[0].id}"
    ).content.decode()
    assert 'id="node-kubernetes">1.36<' in page
    assert f'id="node-driver" title="as the host\'s agent reports it">{SIMULATED_DRIVER}<' in page


def test_the_delete_page_counts_gpu_instances_not_gpus(shared_pool, alice_client):
    _, cluster, pool = shared_pool
    html = alice_client.get(f"/clusters/{cluster}/nodepools/{pool}/delete").content.decode()
    assert '<span data-count="nodes">4</span>' in html
    assert '<span data-count="gpu_instances">4</span>' in html
    assert 'data-count="gpus"' not in html and "GPU(s) released" not in html
    assert "their GPU instances released" in html


def test_the_console_names_each_holders_versions(make_host, owner, ops_client):
    """The console's GPU rows of a dedicated host name the node holding each GPU with the
    same Kubernetes and driver versions the tenant's pages show. The pool asks for the
    branch R580; the row shows the release the host's agent reports after the install
    (the catalog's newest R580 release, 580.95.05), not what was asked."""
    host = make_host(MODEL, gpus=2, hostname="gpu-pages-2")
    cluster = make_cluster(owner, "d")
    pool = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {
            "name": "whole",
            "gpu_model": MODEL,
            "gpus_per_node": 2,
            "node_count": 1,
            "driver_version": "R580",
        },
        format="json",
    ).json()["target_id"]
    drive_pool(pool)
    html = ops_client.get(f"/console/hosts/{host.id}").content.decode()
    assert re.findall(r'data-col="kubernetes">Kubernetes ([^<]*)<', html) == ["1.36"] * 2
    assert re.findall(r'data-col="driver">driver ([^<]*)<', html) == ["580.95.05"] * 2


def test_the_console_host_list_names_the_gpu_carrying_instances(shared_pool, ops_client):
    """The shared host's one GPU carries the pool's four 1g.10gb instances: held whole by no
    node (0 of 1), in instances (1) — not a host that reads "GPUs held 0 / 1" and nothing
    else (issue 33 D5)."""
    html = ops_client.get("/console/hosts").content.decode()
    row = html.split('<tr data-host="hv-pages-1">')[1].split("</tr>")[0]
    assert re.search(r'data-col="held">([^<]*)<', row).group(1) == "0 / 1 · 1 in instances"
