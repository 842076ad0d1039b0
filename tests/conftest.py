"""Shared fixtures: real PostgreSQL (pytest-django test DB), real Redis, the loaded catalog,
API clients for tenant A's owner and viewer, tenant B (the outsider) and an operator.

Hosts made by :func:`make_host` are SIMULATED INFRASTRUCTURE: rows shaped like an imported
host (UUIDs ``GPU-sim-…``), for tests that need more GPUs than the real captures hold.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

# Servers and workers the tests start (gunicorn, celery) inherit this: the suite runs on the
# development SECRET_KEY (nvke/secrets_check.py refuses that outside development).
os.environ.setdefault("NVKE_ALLOW_INSECURE_DEFAULTS", "1")
# Links in mail are built from it (nvke/public_url.py): Django's test client's host.
os.environ.setdefault("NVKE_PUBLIC_URL", "http://testserver")
# Tests create clusters on the `simulated` provider (no Kubernetes) unless they ask for
# `hosted` (tests/hosted, the make-run tour); processes they start inherit it.
os.environ.setdefault("NVKE_DEFAULT_PROVIDER", "simulated")

import pytest

CAPTURES = Path(__file__).resolve().parent.parent / "fleet" / "captures"


def pytest_configure(config):
    """Simulated infrastructure answers at once in tests (the e2e worker sets its own)."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.NVKE_SIMULATED_CONTROL_PLANE_DELAY_S = 0
        settings.NVKE_SIMULATED_NODE_DELAY_S = 0
        settings.NVKE_DEFAULT_PROVIDER = os.environ["NVKE_DEFAULT_PROVIDER"]
        # the SIMULATED hosts' hardware state of this run (clusters/providers/simhosts.py)
        settings.NVKE_SIMULATED_HOSTS_DIR = tempfile.mkdtemp(prefix="nvke-simulated-hosts-")
        # settings may be read before this module set the variable above
        settings.NVKE_PUBLIC_URL = os.environ["NVKE_PUBLIC_URL"]
    except ImproperlyConfigured:  # run without Django (agent tests with -p no:django)
        pass


@pytest.fixture
def catalog(db):
    """The vendored catalog, loaded into the test database (idempotent, fast when loaded)."""
    from catalog.loader import load_catalog
    from catalog.models import GpuModel

    if not GpuModel.objects.filter(slug="a100-sxm4-80gb").exists():
        load_catalog()


@pytest.fixture
def tenant_a(db):
    from tenants.models import Tenant

    return Tenant.objects.create(name="tenant-a")


@pytest.fixture
def tenant_b(db):
    from tenants.models import Tenant

    return Tenant.objects.create(name="tenant-b")


def _client(key: str):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def _key(tenant, role):
    from tenants.services import create_api_key

    return create_api_key(tenant=tenant, name=f"{role}-key", role=role)[1]


@pytest.fixture
def owner(tenant_a):
    return _client(_key(tenant_a, "owner"))


@pytest.fixture
def viewer(tenant_a):
    return _client(_key(tenant_a, "viewer"))


@pytest.fixture
def outsider(tenant_b):
    return _client(_key(tenant_b, "owner"))


@pytest.fixture
def operator(db):
    return _client(_key(None, "admin"))


@pytest.fixture
def anonymous():
    from rest_framework.test import APIClient

    return APIClient()


def capture(name: str) -> str:
    """Text of a real nvidia-smi -q -x capture in fleet/captures/."""
    return (CAPTURES / name).read_text()


@pytest.fixture
def import_capture(catalog):
    """Import a host from a real capture: ``import_capture("a10g.xml", "h1", "us-east-1a")``."""
    from fleet.services import import_host

    def _import(name: str, hostname: str, zone: str):
        return import_host(hostname=hostname, zone=zone, nvidia_smi_xml=capture(name))

    return _import


@pytest.fixture
def make_host(catalog):
    """Create a SIMULATED host: ``make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")``."""
    from catalog.models import GpuModel
    from fleet.models import Gpu, Host

    counter = {"n": 0}

    def _make(model: str, gpus: int = 8, zone: str = "us-east-1a", hostname: str | None = None):
        counter["n"] += 1
        gpu_model = GpuModel.objects.get(slug=model)
        host = Host.objects.create(
            hostname=hostname or f"sim-{model}-{counter['n']}",
            zone=zone,
            gpu_model=gpu_model,
            gpu_count=gpus,
        )
        Gpu.objects.bulk_create(
            [
                Gpu(
                    uuid=f"GPU-sim-{uuid.uuid4()}",
                    host=host,
                    index=i,
                    pci_bus_id=f"00000000:{i + 1:02X}:00.0",
                    gpu_model=gpu_model,
                    product_name=(gpu_model.product_names or [gpu_model.name])[0],
                    memory_total_bytes=(gpu_model.memory_mib or 0) * 2**20 or None,
                )
                for i in range(gpus)
            ]
        )
        return host

    return _make
