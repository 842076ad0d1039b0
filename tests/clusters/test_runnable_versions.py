"""Every view agrees on the Kubernetes versions a cluster can be created with or upgraded to:
supported by the catalog today AND run by the cluster's provider (issue 33: a fresh-user trial
read 1.35 ``"supported": true`` in the catalog, got 202 for ``clusters create -k 1.35`` on
``make run``'s hosted provider, and waited 600 s at ``0% control-plane`` while the worker
logged a traceback a second).

Today (2026-12) the catalog supports 1.35, 1.36 and 1.37 (1.34 reached end of life on
2026-10-27; catalog/data/kubernetes_versions.yaml); ``deploy/k8s`` pins binaries of 1.36 and
1.37 only, so the ``hosted`` provider runs those two and the ``simulated`` one runs any.

Hosted clusters here never reach a control-plane manager: the API refuses before, and the
reconciler's provider check fails a cluster that gets past it before it writes anything.
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_cluster, running_h100_pool

pytestmark = pytest.mark.django_db

HOSTED_REFUSAL = (
    "Kubernetes '1.35' cannot be run by this installation's 'hosted' provider (it runs "
    "Kubernetes 1.36, 1.37); supported: 1.37, 1.36"
)


def assert_hosted_refusal(resp) -> None:
    """``resp`` is the 400 problem+json refusing 1.35 on the hosted provider, naming the field
    and the versions it runs."""
    assert resp.status_code == 400
    assert resp["Content-Type"] == "application/problem+json"
    body = resp.json()
    assert (body["code"], body["field"], body["supported_versions"], body["detail"]) == (
        "unsupported_kubernetes_version",
        "kubernetes_version",
        ["1.37", "1.36"],
        HOSTED_REFUSAL,
    )


def test_the_hosted_provider_runs_the_minors_nvke_builds():
    from clusters.hosted import binaries
    from clusters.providers import get_provider

    assert binaries.supported_targets() == ["etcd", "kwok", "v1.36", "v1.37"]
    assert get_provider("hosted").kubernetes_minors() == ("1.36", "1.37")
    assert get_provider("simulated").kubernetes_minors() is None
    assert get_provider("clusterapi").kubernetes_minors() is None


@pytest.mark.parametrize(
    ("provider", "runnable"),
    [("hosted", {"1.37", "1.36"}), ("simulated", {"1.37", "1.36", "1.35"})],
)
def test_the_catalog_says_which_supported_versions_this_installation_runs(
    owner, catalog, settings, provider, runnable
):
    settings.NVKE_DEFAULT_PROVIDER = provider
    rows = owner.get("/api/v1/catalog/kubernetes-versions").json()
    shown = {r["version"]: (r["supported"], r["runnable"]) for r in rows}
    assert shown == {
        "1.37": (True, "1.37" in runnable),
        "1.36": (True, "1.36" in runnable),
        "1.35": (True, "1.35" in runnable),
        "1.34": (False, False),
        "1.33": (False, False),
        "1.32": (False, False),
        "1.31": (False, False),
    }


def test_a_hosted_cluster_of_a_version_without_binaries_is_refused_naming_what_runs(
    owner, settings, make_host
):
    from clusters.models import Cluster

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    settings.NVKE_DEFAULT_PROVIDER = "hosted"
    resp = owner.post(
        "/api/v1/clusters", {"name": "t3", "kubernetes_version": "1.35", "region": "us-east-1"}
    )
    assert_hosted_refusal(resp)
    # an unknown version lists what runs too, not what upstream supports
    old = owner.post(
        "/api/v1/clusters", {"name": "t3", "kubernetes_version": "1.20", "region": "us-east-1"}
    ).json()
    assert (old["code"], old["supported_versions"]) == (
        "unsupported_kubernetes_version",
        ["1.37", "1.36"],
    )
    assert not Cluster.objects.exists()
    # the simulated provider runs 1.35
    settings.NVKE_DEFAULT_PROVIDER = "simulated"
    resp = owner.post(
        "/api/v1/clusters", {"name": "t3", "kubernetes_version": "1.35", "region": "us-east-1"}
    )
    assert resp.status_code == 202
    assert Cluster.objects.get().provider == "simulated"


@pytest.fixture
def hosted_134(owner, make_host):
    """A RUNNING cluster ``c1`` at 1.34 with a RUNNING pool ``h100`` (one 8-GPU node), made
    on the simulated provider. TEST SET-UP: its rows then say ``hosted`` at 1.34, as a hosted
    cluster created before 1.34's end of life reads (no manager runs here; nothing of it is
    reconciled again). Returns (cluster id, pool id)."""
    from clusters.models import Cluster
    from nodepools.models import Node, NodePool

    cluster, pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    Cluster.objects.filter(pk=cluster).update(
        provider="hosted", kubernetes_version="1.34", control_plane_version="1.34"
    )
    NodePool.objects.filter(pk=pool).update(kubernetes_version="1.34")
    Node.objects.filter(nodepool_id=pool).update(kubernetes_version="1.34")
    return cluster, pool


def test_upgrades_offer_and_take_only_versions_the_clusters_provider_runs(owner, hosted_134):
    cluster, pool = hosted_134
    body = owner.get(f"/api/v1/clusters/{cluster}").json()
    # 1.35 is the one minor up, supported, but the hosted provider cannot run it
    assert (body["provider"], body["control_plane_version"], body["available_upgrades"]) == (
        "hosted",
        "1.34",
        [],
    )
    listed = owner.get("/api/v1/clusters").json()["results"]
    assert [c["available_upgrades"] for c in listed] == [[]]
    resp = owner.patch(f"/api/v1/clusters/{cluster}", {"kubernetes_version": "1.35"})
    assert_hosted_refusal(resp)
    # node pools likewise
    resp = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{pool}/upgrade", {"kubernetes_version": "1.35"}
    )
    assert_hosted_refusal(resp)


def test_a_simulated_cluster_is_offered_every_supported_next_minor(owner, make_host):
    from clusters.models import Cluster

    cluster, _pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    # TEST SET-UP: the simulated cluster at 1.34, as one created before its end of life
    Cluster.objects.filter(pk=cluster).update(
        kubernetes_version="1.34", control_plane_version="1.34"
    )
    assert owner.get(f"/api/v1/clusters/{cluster}").json()["available_upgrades"] == ["1.35"]


def test_a_hosted_cluster_that_got_past_the_api_fails_at_once_not_retrying(tenant_a, make_host):
    """A cluster asked for 1.35 before the API refused it (the trial's ``t3``): its first
    reconcile step fails its operation, non-retryable, with a message that names what runs;
    no control plane row is written for the manager."""
    from clusters.models import Cluster, HostedControlPlane, Operation
    from clusters.operations import start_operation

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    # TEST SET-UP: the rows create_cluster wrote before this fix
    tenant_id = tenant_a.pk
    cluster = Cluster.objects.create(
        tenant_id=tenant_id,
        name="t3",
        kubernetes_version="1.35",
        region="us-east-1",
        provider="hosted",
    )
    op = start_operation(
        tenant_id=tenant_id,
        cluster_id=cluster.id,
        type="CREATE_CLUSTER",
        target_type="cluster",
        target_id=cluster.id,
        requested_by="test",
        enqueue=False,
    )
    assert drive_cluster(cluster.id) == 1
    cluster.refresh_from_db()
    message = (
        "the infrastructure provider failed: NVKE builds no Kubernetes binaries for 1.35: "
        "hosted control planes run 1.36, 1.37"
    )
    ready = next(c for c in cluster.conditions if c["type"] == "Ready")
    assert (cluster.phase, ready["reason"], ready["message"]) == (
        "ERROR",
        "ProviderError",
        message,
    )
    op = Operation.objects.get(pk=op.pk)
    assert (op.status, op.error) == (
        "FAILED",
        {"code": "unsupported_kubernetes_version", "message": message, "retryable": False},
    )
    assert not HostedControlPlane.objects.exists()


def test_the_manager_says_once_that_it_has_no_binaries_for_a_version(
    owner, make_host, tmp_path, caplog
):
    """The control-plane manager meets a row at 1.35 (say the operator removed
    ``deploy/k8s/v1.35``): its message says so, logged once, no traceback, nothing built."""
    from clusters.hosted.manager import ControlPlaneManager
    from clusters.models import Cluster, HostedControlPlane

    cluster, _pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    # TEST SET-UP: the row the hosted provider wrote for a 1.35 cluster before this fix
    row = HostedControlPlane.objects.create(
        cluster=Cluster.objects.get(pk=cluster),
        version="1.35",
        port=16999,
        pki_encrypted="",
        ca_cert="",
    )
    manager = ControlPlaneManager(tmp_path)
    with caplog.at_level("WARNING", logger="clusters.hosted.manager"):
        for _ in range(3):
            manager._ensure(HostedControlPlane.objects.select_related("cluster").get(pk=row.pk))
    row.refresh_from_db()
    assert (row.state, row.ready, row.message) == (
        "pending",
        False,
        "NVKE builds no Kubernetes binaries for 1.35 (deploy/k8s pins 1.36, 1.37): this "
        "control plane cannot be started",
    )
    warnings = [r for r in caplog.records if r.name == "clusters.hosted.manager"]
    assert [(r.levelname, r.exc_info) for r in warnings] == [("WARNING", None)]
    assert manager.build is None and manager.planes == {}
