"""Fixtures of the clusterapi tests: the SIMULATED management cluster API (see
fake_apiserver.py: a local HTTP server, not Kubernetes) and a kubeconfig pointing at it."""

from __future__ import annotations

import pytest

from tests.clusterapi.fake_apiserver import FakeApiServer


@pytest.fixture
def fake_api():
    """A running simulated API server on 127.0.0.1 (port chosen by the OS)."""
    with FakeApiServer(gpus_per_node=2) as server:
        yield server


@pytest.fixture
def management_kubeconfig(fake_api, tmp_path):
    path = tmp_path / "management.kubeconfig"
    path.write_text(fake_api.kubeconfig())
    return str(path)


@pytest.fixture
def capi_settings(settings, management_kubeconfig):
    """Point the clusterapi provider at the simulated management cluster."""
    settings.NVKE_CLUSTERAPI_KUBECONFIG = management_kubeconfig
    settings.NVKE_CLUSTERAPI_NAMESPACE = "nvke-test"
    settings.NVKE_CLUSTERAPI_INFRASTRUCTURE = "Metal3"
    return settings


def hosts_follow_their_gpu_operator(pool_id) -> None:
    """SIMULATED INFRASTRUCTURE under the Cluster API machines: on each node's host, MIG
    Manager applies the mig-parted entry the pool's config names (as the GPU Operator on the
    workload cluster would), then the host's agent reports — in-process, through the same
    ingestion function as ``POST /api/v1/agent/reports``. The reconciler reads that report,
    never the provider, to decide that the node runs its layout (nodepools/observed.py)."""
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
