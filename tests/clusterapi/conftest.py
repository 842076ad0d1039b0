"""Fixtures of the clusterapi tests: a real Cluster API management cluster (testbed.py: etcd,
kube-apiserver, the Cluster API controllers and CAPD's in-memory backend, which SIMULATES the
machines), started once per session, and the second kube-apiserver that plays the workload
clusters, where NVKE writes the SIMULATED machines' Nodes from their hosts' agent reports and
a KWOK keeps them Ready (testbed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clusterapi.real import NS, Apis

ROOT = Path(__file__).resolve().parents[2]
NVIDIA_CRDS = ROOT / "clusters" / "providers" / "crds"


@pytest.fixture(scope="session")
def capi_testbed(tmp_path_factory):
    """The running testbed (built by `make capi-bins` when missing: see README)."""
    import yaml
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    from tests.clusterapi.testbed import start_testbed

    bed = start_testbed(tmp_path_factory.mktemp("capi"))
    try:
        management = k8s_config.new_client_from_config(config_file=bed.management_kubeconfig)
        workload = k8s_config.new_client_from_config(config_file=bed.workload_kubeconfig)
        k8s.CoreV1Api(management).create_namespace({"metadata": {"name": NS}})
        k8s.CoreV1Api(workload).create_namespace({"metadata": {"name": "gpu-operator"}})
        ext = k8s.ApiextensionsV1Api(workload)
        for path in sorted(NVIDIA_CRDS.glob("*nvidia.com_*.yaml")):
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def capi_settings(settings, capi_testbed):
    """Point the clusterapi provider at the testbed, with CAPD's in-memory machines."""
    settings.NVKE_DEFAULT_PROVIDER = "clusterapi"
    settings.NVKE_CLUSTERAPI_KUBECONFIG = capi_testbed.management_kubeconfig
    settings.NVKE_CLUSTERAPI_WORKLOAD_KUBECONFIG = capi_testbed.workload_kubeconfig
    settings.NVKE_CLUSTERAPI_SIMULATED_NODES = True
    settings.NVKE_CLUSTERAPI_NAMESPACE = NS
    settings.NVKE_CLUSTERAPI_INFRASTRUCTURE = "Dev"
    settings.NVKE_CLUSTERAPI_CONTROL_PLANE_REPLICAS = 1
    return settings


def hosts_follow_their_gpu_operator(pool_id) -> None:
    """SIMULATED INFRASTRUCTURE under the Cluster API machines: on each node's host, MIG
    Manager applies the mig-parted entry the pool's config names (as the GPU Operator on the
    workload cluster would), then the host's agent reports — in-process, through the same
    ingestion function as ``POST /api/v1/agent/reports``. The reconciler reads that report,
    never the provider, to decide that the node runs its layout (nodepools/observed_gates.py)."""
    from clusters.providers import simhosts
    from clusters.providers.simulated import _mig_manager
    from fleet.models import Host
    from nodepools.models import NodePool
    from nodepools.specs import node_spec, nodepool_spec

    pool = NodePool.objects.select_related("cluster", "gpu_model").get(pk=pool_id)
    spec = nodepool_spec(pool)
    for node in pool.nodes.exclude(phase="DELETED").exclude(host=None):
        host = Host.objects.get(pk=node.host_id)
        node_as_spec = node_spec(node)
        simhosts.change(host, lambda state, n=node_as_spec: _mig_manager(state, spec, n))
        simhosts.report_in_process(host)


@pytest.fixture
def apis(capi_testbed):
    return Apis(capi_testbed)


@pytest.fixture
def drive(django_capture_on_commit_callbacks):
    """``drive(cluster_id, pool_id=None)``: one step of each reconciler, committing."""
    import time

    from clusters.reconcile import reconcile_cluster
    from nodepools.reconcile import reconcile_nodepool

    due: dict[str, float] = {}

    def run(key: str, reconcile, pk) -> None:
        """Like the Celery task: again only once the delay the last step asked for passed
        (deletions count their polls), and at once after a spec change."""
        if time.monotonic() < due.get(key, 0.0):
            return
        with django_capture_on_commit_callbacks(execute=True):
            delay = reconcile(pk)
        due[key] = time.monotonic() + (delay if delay is not None else 0.5)

    def step(cluster_id, pool_id=None) -> None:
        run(f"c{cluster_id}", reconcile_cluster, cluster_id)
        if pool_id is not None:
            hosts_follow_their_gpu_operator(pool_id)  # the hosts' agents report what they run
            run(f"p{pool_id}", reconcile_nodepool, pool_id)

    step.now = lambda: due.clear()  # a spec changed: the API enqueued a reconcile
    return step


@pytest.fixture
def hosts(make_host):
    """Four 2-GPU H100 hosts (SIMULATED INFRASTRUCTURE rows), driver 580.95.05 as their
    agents report it."""
    from fleet.models import Host

    made = [make_host("h100-sxm5-80gb", gpus=2, hostname=f"gpu-h100-{i}") for i in range(4)]
    Host.objects.filter(pk__in=[h.pk for h in made]).update(driver_version="580.95.05")
    return made
