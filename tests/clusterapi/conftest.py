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
