"""Every object the ``clusterapi`` provider renders is valid against the real schemas.

Cluster API and GPU Operator objects: the vendored CRDs' ``openAPIV3Schema``
(clusters/providers/clusterapi/crds/ and clusters/providers/crds/, sources in their READMEs)
with unknown fields as errors (tests/clusterapi/crd_schema.py says exactly what is and is not
checked). Core objects
(ConfigMaps): ``kubernetes-validate``, strict, Kubernetes 1.36. The negative cases show the
validator catches what it claims to.
"""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from tests.clusterapi import crd_schema
from tests.clusterapi.specs import NODE_IDS, pool_spec

pytestmark = pytest.mark.django_db

K8S_VERSION = "1.36.0"

#: (gpu model, GPUs per node, isolation, pool name, pinned driver)
CASES = {
    "h100-mig-single": ("h100-sxm5-80gb", 2, {"mode": "mig", "mig_profile": "1g.10gb"}, None),
    "h100nvl-mig-mixed": (
        "h100-nvl-94gb",
        1,
        {"mode": "mig", "mig_layout": {"3g.47gb": 1, "1g.24gb": 1, "1g.12gb": 1}},
        None,
    ),
    "l40s-time-slicing": ("l40s", 4, {"mode": "time-slicing", "replicas": 4}, None),
    "l40s-mps": ("l40s", 2, {"mode": "mps", "replicas": 8}, None),
    "a100-exclusive-pinned-driver": ("a100-sxm4-80gb", 8, {"mode": "exclusive"}, "580.95.05"),
    "a100-time-sliced-mig-branch-driver": (
        "a100-sxm4-80gb",
        1,
        {"mode": "time-slicing", "replicas": 2, "mig_profile": "3g.40gb"},
        "R580",
    ),
}


def rendered(case: str) -> list[dict]:
    from clusters.providers.clusterapi.render import (
        Infrastructure,
        render_cluster,
        render_gpu_operator,
        render_node_pool,
    )

    model, gpus, isolation, driver = CASES[case]
    pool = pool_spec(model, gpus, isolation, name=case[:20], driver=driver)
    infrastructure = Infrastructure.parse("Metal3")
    return [
        *render_cluster(pool.cluster, namespace="nvke", infrastructure=infrastructure),
        *render_node_pool(
            pool,
            nodes={str(n): f"host-{i}" for i, n in enumerate(NODE_IDS)},
            namespace="nvke",
            infrastructure=infrastructure,
        ),
        *render_gpu_operator(pool),
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_object_is_valid_against_its_schema(catalog, case):
    objects = rendered(case)
    kinds = sorted({o["kind"] for o in objects})
    assert {
        "Cluster",
        "KubeadmControlPlane",
        "KubeadmConfigTemplate",
        "MachineDeployment",
        "MachineHealthCheck",
        "ClusterPolicy",
        "NVIDIADriver",
        "ConfigMap",
    } <= set(kinds)
    for obj in objects:
        if crd_schema.has_crd(obj):
            assert crd_schema.errors(obj) == [], obj["kind"]
        else:
            assert obj["apiVersion"] == "v1", obj
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_cluster_api_objects_use_the_served_non_deprecated_version(catalog):
    versions = {}
    for crd in crd_schema.definitions():
        for version in crd["spec"]["versions"]:
            if version.get("storage"):
                versions[crd["spec"]["names"]["kind"]] = (
                    f"{crd['spec']['group']}/{version['name']}",
                    version.get("deprecated", False),
                )
    for obj in rendered("h100-mig-single"):
        if obj["kind"] in versions:
            assert versions[obj["kind"]] == (obj["apiVersion"], False), obj["kind"]


def _machine_deployment(catalog_case: str = "h100-mig-single") -> dict:
    return next(o for o in rendered(catalog_case) if o["kind"] == "MachineDeployment")


def test_an_unknown_field_is_an_error(catalog):
    deployment = _machine_deployment()
    deployment["spec"]["replica"] = 2  # a typo the API server would prune silently
    assert any("'replica' was unexpected" in e for e in crd_schema.errors(deployment))


def test_a_value_outside_an_enum_is_an_error(catalog):
    deployment = _machine_deployment()
    deployment["spec"]["rollout"]["strategy"]["type"] = "Recreate"
    assert any("'Recreate' is not one of" in e for e in crd_schema.errors(deployment))


def test_int_or_string_takes_both_and_nothing_else(catalog):
    deployment = _machine_deployment()
    strategy = deployment["spec"]["rollout"]["strategy"]
    strategy.update(type="RollingUpdate", rollingUpdate={"maxSurge": "25%", "maxUnavailable": 0})
    assert crd_schema.errors(deployment) == []
    strategy["rollingUpdate"]["maxSurge"] = True
    assert crd_schema.errors(deployment) != []


def test_a_missing_required_field_is_an_error(catalog):
    deployment = _machine_deployment()
    del deployment["spec"]["template"]["spec"]["bootstrap"]
    assert any("'bootstrap' is a required property" in e for e in crd_schema.errors(deployment))


def test_the_cel_rules_checked_by_hand_catch_what_they_describe(catalog):
    objects = rendered("h100-mig-single")
    template = next(o for o in objects if o["kind"] == "KubeadmConfigTemplate")
    registration = template["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]
    registration["kubeletExtraArgs"].append(copy.deepcopy(registration["kubeletExtraArgs"][0]))
    assert any("must be unique" in e for e in crd_schema.errors(template))
    driver = next(o for o in objects if o["kind"] == "NVIDIADriver")
    driver["spec"]["nodeSelector"] = {"a": "b"}
    assert any("must not use nodeSelector" in e for e in crd_schema.errors(driver))


def test_bad_metadata_is_an_error(catalog):
    deployment = _machine_deployment()
    deployment["metadata"]["name"] = "Not_A_Name"
    deployment["metadata"]["labels"]["nvke.io/x"] = "v" * 64
    problems = crd_schema.errors(deployment)
    assert any("DNS-1123" in e for e in problems)
    assert any("is not a label value" in e for e in problems)


def test_a_kind_without_a_vendored_crd_is_refused():
    with pytest.raises(crd_schema.SchemaError):
        crd_schema.validator("infrastructure.cluster.x-k8s.io/v1beta1", "Metal3Cluster")
