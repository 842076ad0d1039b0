"""The ComputeDomain of a node pool kept in one NVLink domain (NVIDIA DRA driver for GPUs),
as the node pool's rendered GPU config and the clusterapi provider's workload-cluster objects
carry it.

Golden file ``golden/gb200-nvl72-compute-domain.json``: the whole rendering of a 4-GPU
GB200 pool with ``placement.same_nvlink_domain``, checked by hand against the vendored CRD
(``clusters/providers/crds/resource.nvidia.com_computedomains.yaml``, from
NVIDIA/k8s-dra-driver-gpu at commit 22407113…): ``spec.channel.resourceClaimTemplate.name``
required, ``allocationMode`` ``Single`` | ``All``, ``numNodes`` >= 0 (0 recommended with the
driver's default ``IMEXDaemonsWithDNSNames``). The object is validated against that CRD's
``v1beta1`` ``openAPIV3Schema`` with unknown fields as errors (tests/clusterapi/crd_schema.py,
the checker the clusterapi tests use), the other objects with ``kubernetes-validate``.

Regenerate after an intended change with ``NVKE_UPDATE_GOLDEN=1`` and review the diff.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import kubernetes_validate
import pytest

from tests.clusterapi import crd_schema
from tests.clusterapi.specs import cluster_spec

pytestmark = pytest.mark.django_db

GOLDEN = Path(__file__).resolve().parent / "golden" / "gb200-nvl72-compute-domain.json"
K8S_VERSION = "1.36.0"
PLACEMENT = {"same_nvlink_domain": True}


def render(placement=PLACEMENT) -> dict:
    from catalog.models import GpuModel
    from nodepools.gpu_config import render_gpu_config
    from nodepools.isolation import validate_isolation

    model = GpuModel.objects.get(slug="gb200")
    return render_gpu_config(
        gpu_model=model,
        gpus_per_node=4,
        isolation=validate_isolation(model, {"mode": "exclusive"}),
        pool_name="nvl72",
        placement=placement,
    )


def test_rendering_matches_the_golden_file(catalog):
    rendered = json.loads(json.dumps(render()))
    if os.environ.get("NVKE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(rendered, indent=2, sort_keys=True) + "\n")
    assert rendered == json.loads(GOLDEN.read_text())
    (domain,) = [m for m in rendered["manifests"] if m["kind"] == "ComputeDomain"]
    assert domain == {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {
            "name": "nvke-nvl72",
            "namespace": "default",
            "labels": {"app.kubernetes.io/managed-by": "nvke", "nvke.io/nodepool": "nvl72"},
        },
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": "nvke-nvl72-channel"},
                "allocationMode": "Single",
            },
        },
    }


def test_a_pool_without_the_placement_has_no_compute_domain(catalog):
    config = render(placement={})
    assert "compute_domain" not in config
    assert [m["kind"] for m in config["manifests"]] == ["ConfigMap", "ConfigMap"]


def test_the_compute_domain_is_valid_against_the_vendored_crd(catalog):
    config = render()
    for obj in config["manifests"]:
        if obj["kind"] == "ComputeDomain":
            assert crd_schema.errors(obj) == []
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    # the checker catches what the CRD refuses (so the assertion above can fail)
    domain = next(m for m in config["manifests"] if m["kind"] == "ComputeDomain")
    for path, value, expected in (
        (("spec", "channel", "allocationMode"), "Some", "'Some' is not one of ['All', 'Single']"),
        (("spec", "numNodes"), -1, "-1 is less than the minimum of 0"),
        (("spec", "channel", "resourceClaimTemplate"), {}, "'name' is a required property"),
        (("spec", "numnodes"), 0, "Additional properties are not allowed"),
    ):
        bad = copy.deepcopy(domain)
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        problems = crd_schema.errors(bad)
        assert any(expected in p for p in problems), (path, problems)


def test_the_clusterapi_provider_applies_it_to_the_workload_cluster(catalog):
    from clusters.providers.base import NodePoolSpec
    from clusters.providers.clusterapi.render import COMPUTE_DOMAIN, kind_of, render_gpu_operator

    pool = NodePoolSpec(
        id=cluster_spec().id,
        cluster=cluster_spec(),
        name="nvl72",
        gpu_model="gb200",
        gpus_per_node=4,
        isolation={"mode": "exclusive"},
        gpu_config=render(),
        placement=PLACEMENT,
    )
    objects = render_gpu_operator(pool)
    (domain,) = [o for o in objects if o["kind"] == "ComputeDomain"]
    assert kind_of(domain) == COMPUTE_DOMAIN  # namespaced, resource.nvidia.com/v1beta1
    assert (COMPUTE_DOMAIN.plural, COMPUTE_DOMAIN.namespaced) == ("computedomains", True)
    assert crd_schema.errors(domain) == []
    # after the pool's ConfigMaps, before the fallback driver and the ClusterPolicy
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ConfigMap", "ConfigMap", "ComputeDomain", "NVIDIADriver", "ClusterPolicy"]
