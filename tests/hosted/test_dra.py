"""A pool that publishes its GPUs as DRA devices (issue 31, "DRA"), against a real control
plane: NVKE writes each node's ResourceSlice (driver ``gpu.nvidia.com``, in the shape of
NVIDIA's DRA driver) and the DeviceClass into the tenant's kube-apiserver from the host agent's
report, and the cluster's own kube-scheduler allocates ResourceClaims against them.

Simulated below the kubelet: the node is KWOK's, so once the scheduler has allocated a claim
and bound the pod, nothing runs the driver's ``NodePrepareResources`` (no CDI device reaches a
container); KWOK marks the pod Running. Everything up to the binding is the real scheduler's.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from kubernetes.utils import parse_quantity

from tests.e2e.conftest import wait_for
from tests.hosted.conftest import api_client, create_cluster, kubeconfig_of
from tests.hosted.test_gpu_nodes import (
    TOLERATION,
    create_pool,
    drive,
    lease_renewals,
    node_names,
)

pytestmark = pytest.mark.timeout(420)

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = "gpu.nvidia.com"


def claim(name: str, memory: str) -> dict:
    """One GPU of class gpu.nvidia.com with at least ``memory`` (a CEL selector)."""
    selector = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{memory}")) >= 0'
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def claiming_pod(name: str, claim_name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "tolerations": [TOLERATION],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def failed_scheduling(core: k8s.CoreV1Api, pod_name: str):
    """The scheduler's first FailedScheduling event of pod ``pod_name`` (waits up to 60 s)."""

    def first():
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={pod_name},reason=FailedScheduling"
        ).items
        return events[0] if events else None

    return wait_for(first, timeout=60, what=f"FailedScheduling of {pod_name}")


def slices_of(objects, node: str) -> list[dict]:
    items = objects.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
    return [s for s in items if s["spec"].get("nodeName") == node]


def test_a_dra_pool_publishes_resource_slices_the_real_scheduler_allocates_claims_from(
    hosted, owner, make_host
):
    from clusters.providers import simhosts
    from fleet.models import Gpu, Host
    from nodepools.models import Node
    from nodepools.tasks import sync_tenant_nodes
    from nvke.queueing import clear_pending

    host = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    # the simulated machine's installed driver (its agent reports it from the state file)
    Host.objects.filter(pk=host.pk).update(driver_version="570.172.08", cuda_version="12.8")
    cluster = create_cluster(owner, "dra")
    api = api_client(kubeconfig_of(owner, cluster))
    core, coord = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)
    objects = k8s.CustomObjectsApi(api)

    pool = create_pool(owner, cluster, "dra", {"mode": "exclusive"}, gpu_publishing="dra")
    [name] = node_names(pool)
    lease_renewals(core, coord, name, 3)  # KWOK's heartbeats: NVKE's fields survive them

    # --- the Node has no nvidia.com/gpu: its GPUs are DRA devices, never both --------------
    node = core.read_node(name)
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    assert not [k for k in node.status.capacity if k.startswith("nvidia.com/")]
    assert not [k for k in node.status.allocatable if k.startswith("nvidia.com/")]
    # the GPU Operator's switch a real node would need so its device plugin stays off
    assert node.metadata.labels["nvidia.com/gpu.deploy.device-plugin"] == "false"

    # --- one ResourceSlice of 8 devices, exactly what the host's agent reported -------------
    [rslice] = slices_of(objects, name)
    spec = rslice["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, name, name)
    assert spec["pool"]["resourceSliceCount"] == 1
    gpus = {g.index: g for g in Gpu.objects.filter(host=host)}
    row = Node.objects.get(name=name)
    assert sorted(gpus[i].uuid for i in gpus) == sorted(row.gpu_uuids)
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    host.refresh_from_db()

    assert (host.driver_version, host.cuda_version) == ("570.172.08", "12.8")
    versions = {
        "driverVersion": {"version": "570.172.8"},  # semver: no leading zero
        "cudaDriverVersion": {"version": "12.8.0"},
    }
    for device in spec["devices"]:
        reported = gpus[int(device["name"].removeprefix("gpu-"))]
        assert device["attributes"] == {
            "type": {"string": "gpu"},
            "uuid": {"string": reported.uuid},
            "productName": {"string": reported.product_name},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            **versions,
        }
        assert parse_quantity(device["capacity"]["memory"]["value"]) == reported.memory_total_bytes
    assert reported.product_name == "NVIDIA H100 80GB HBM3"
    assert reported.memory_total_bytes == 81559 * 2**20
    [device_class] = [
        c
        for c in objects.list_cluster_custom_object(GROUP, VERSION, "deviceclasses")["items"]
        if c["metadata"]["name"] == DRIVER
    ]
    assert device_class["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{DRIVER}" && '
                               f'device.attributes["{DRIVER}"].type == "gpu"'}}
    ]  # fmt: skip

    # --- a claim for one GPU with >= 80G: allocated by the real scheduler, the pod bound -----
    # (80G, not 80Gi: an "80GB" H100 reports 81559 MiB = 79.6 GiB, as NVML does on the real
    # card, so a claim for >= 80Gi is never met by one)
    objects.create_namespaced_custom_object(
        GROUP, VERSION, "default", "resourceclaims", claim("one-80g", "80G")
    )
    core.create_namespaced_pod("default", claiming_pod("fits", "one-80g"))
    wait_for(
        lambda: core.read_namespaced_pod("fits", "default").status.phase == "Running",
        timeout=60,
        what="the pod with the 80G claim Running",
    )
    assert core.read_namespaced_pod("fits", "default").spec.node_name == name
    allocated = objects.get_namespaced_custom_object(
        GROUP, VERSION, "default", "resourceclaims", "one-80g"
    )["status"]["allocation"]
    [result] = allocated["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (DRIVER, name, "gpu")
    assert result["device"] in {f"gpu-{i}" for i in range(8)}
    [term] = allocated["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchFields"][0]["values"] == [name]

    # --- never both: a pod asking this node for nvidia.com/gpu stays Pending beside the claim
    plugin_pod = claiming_pod("plugin", "unused")
    del plugin_pod["spec"]["resourceClaims"]
    plugin_pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": name}
    plugin_pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    core.create_namespaced_pod("default", plugin_pod)

    event = failed_scheduling(core, "plugin")
    assert event.message.startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu")
    assert core.read_namespaced_pod("plugin", "default").status.phase == "Pending"
    core.delete_namespaced_pod("plugin", "default", grace_period_seconds=0)

    # --- >= 200Gi, and >= 80Gi: no device has it; each claim stays unallocated, its pod
    # Pending, and the scheduler says so
    for claim_name, memory, pod_name in (
        ("one-200gi", "200Gi", "too-big"),
        ("one-80gi", "80Gi", "not-80gi"),
    ):
        objects.create_namespaced_custom_object(
            GROUP, VERSION, "default", "resourceclaims", claim(claim_name, memory)
        )
        core.create_namespaced_pod("default", claiming_pod(pod_name, claim_name))
    for claim_name, pod_name in (("one-200gi", "too-big"), ("one-80gi", "not-80gi")):
        event = failed_scheduling(core, pod_name)
        assert event.source.component == "default-scheduler"
        assert event.message.startswith("0/1 nodes are available: 1 cannot allocate all claims")
        assert core.read_namespaced_pod(pod_name, "default").status.phase == "Pending"
        unallocated = objects.get_namespaced_custom_object(
            GROUP, VERSION, "default", "resourceclaims", claim_name
        )
        assert not (unallocated.get("status") or {}).get("allocation")
        core.delete_namespaced_pod(pod_name, "default", grace_period_seconds=0)

    # --- Xid 79 on one GPU: the host's agent reports it, its device leaves the slice --------
    lost = gpus[3].uuid
    simhosts.change(
        Host.objects.get(pk=host.pk),
        lambda s: simhosts.add_xid(s, lost, 79, message="GPU has fallen off the bus"),
    )
    clear_pending(sync_tenant_nodes.name, str(cluster.id))
    assert simhosts.report_in_process(Host.objects.get(pk=host.pk), events_after=0)
    sync_tenant_nodes(str(cluster.id))  # as the worker runs it for the health receiver
    [after] = slices_of(objects, name)
    assert [d["name"] for d in after["spec"]["devices"]] == [f"gpu-{i}" for i in range(8) if i != 3]
    assert lost not in {d["attributes"]["uuid"]["string"] for d in after["spec"]["devices"]}
    assert after["spec"]["pool"]["generation"] == spec["pool"]["generation"] + 1
    node = core.read_node(name)
    assert "nvidia.com/gpu" not in node.status.allocatable
    sync_tenant_nodes(str(cluster.id))  # nothing changed: the slice is left as it is
    [again] = slices_of(objects, name)
    assert again["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]

    # --- the pool deleted: its node's slice goes with the Node -------------------------------
    assert owner.delete(f"/api/v1/clusters/{cluster.id}/nodepools/{pool}").status_code == 202
    core.delete_namespaced_pod("fits", "default", grace_period_seconds=0)
    drive(pool, lambda p: p.phase == "DELETED", timeout=120, what="dra DELETED")
    wait_for(lambda: not slices_of(objects, name), timeout=30, what="the slice deleted")


def test_a_claim_for_two_gpus_of_one_nvlink_clique_lands_on_the_node_in_that_clique(
    hosted, owner, tenant_a
):
    """Two SIMULATED GB200 trays in two cliques of one fabric; a DRA pool of two 4-GPU nodes.
    A claim for two GPUs that must share a ``cliqueID`` (``matchAttribute``) and be in the
    second clique is allocated on the tray of that clique; one naming a clique no host is in
    stays unallocated."""
    import uuid

    from clusters.providers import simhosts
    from nodepools.models import Node
    from tenants.models import Quota

    fabric = uuid.UUID("5b6f3c2a-9d41-4e8b-a7c2-0f1e2d3c4b5a")
    Quota.objects.update_or_create(
        tenant=tenant_a, defaults={"max_clusters": 5, "max_nodes": 20, "max_gpus": {"gb200": 40}}
    )
    trays = {
        clique: simhosts.create_simulated_host(
            hostname=f"nvl-tray-{clique}",
            zone="us-east-1a",
            gpu_model="gb200",
            gpus=4,
            nvlink_domain=(fabric, clique),
        )
        for clique in (1, 2)
    }
    cluster = create_cluster(owner, "cliques")
    api = api_client(kubeconfig_of(owner, cluster))
    core, objects = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    pool = create_pool(
        owner,
        cluster,
        "nvl",
        {"mode": "exclusive"},
        nodes=2,
        gpu_model="gb200",
        gpus_per_node=4,
        gpu_publishing="dra",
    )
    on_tray = {n.host_id: n.name for n in Node.objects.filter(nodepool_id=pool, phase="READY")}
    second = on_tray[trays[2].pk]
    for clique, host in trays.items():
        [rslice] = slices_of(objects, on_tray[host.pk])
        assert {d["attributes"]["cliqueID"]["string"] for d in rslice["spec"]["devices"]} == {
            f"{fabric}.{clique}"
        }
        assert len(rslice["spec"]["devices"]) == 4

    def pair(name: str, clique: str) -> dict:
        body = claim(name, "1")
        request = body["spec"]["devices"]["requests"][0]["exactly"]
        request["count"] = 2
        request["selectors"] = [
            {"cel": {"expression": f'device.attributes["{DRIVER}"].cliqueID == "{clique}"'}}
        ]
        body["spec"]["devices"]["constraints"] = [
            {"requests": ["gpu"], "matchAttribute": f"{DRIVER}/cliqueID"}
        ]
        return body

    objects.create_namespaced_custom_object(
        GROUP, VERSION, "default", "resourceclaims", pair("pair", f"{fabric}.2")
    )
    core.create_namespaced_pod("default", claiming_pod("pair", "pair"))
    wait_for(
        lambda: core.read_namespaced_pod("pair", "default").status.phase == "Running",
        timeout=60,
        what="the pod with the clique claim Running",
    )
    assert core.read_namespaced_pod("pair", "default").spec.node_name == second
    results = objects.get_namespaced_custom_object(
        GROUP, VERSION, "default", "resourceclaims", "pair"
    )["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and {r["pool"] for r in results} == {second}

    objects.create_namespaced_custom_object(
        GROUP, VERSION, "default", "resourceclaims", pair("nowhere", f"{fabric}.3")
    )
    core.create_namespaced_pod("default", claiming_pod("nowhere", "nowhere"))

    event = failed_scheduling(core, "nowhere")  # the clique-3 claim's pod
    assert event.source.component == "default-scheduler"
    assert event.message.startswith("0/2 nodes are available: 2 cannot allocate all claims")
    assert core.read_namespaced_pod("nowhere", "default").status.phase == "Pending"


def mig_claim(name: str, profile: str, count: int) -> dict:
    """``count`` MIG devices of class mig.nvidia.com with MIG profile ``profile``."""
    body = claim(name, "1")
    request = body["spec"]["devices"]["requests"][0]["exactly"]
    request["deviceClassName"] = "mig.nvidia.com"
    request["count"] = count
    request["selectors"] = [
        {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}
    ]
    return body


def test_a_mig_dra_pool_publishes_each_gpu_instance_and_the_scheduler_hands_each_out_once(
    hosted, owner, make_host
):
    """A DRA pool of one H100 in MIG mode with two ``3g.40gb`` GPU instances: the slice holds
    the two MIG devices the host's agent reports, named as NVIDIA's DRA driver names them
    (GPU instance profile id 9 on H100, placements {0,4}:4 — catalog); a claim for both is
    allocated by the real scheduler, a third for the same profile and one for a ``7g.80gb``
    stay Pending with the scheduler's reason."""
    from fleet.models import Gpu
    from nodepools.models import Node

    host = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = create_cluster(owner, "migdra")
    api = api_client(kubeconfig_of(owner, cluster))
    core, coord = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)
    objects = k8s.CustomObjectsApi(api)
    pool = create_pool(
        owner,
        cluster,
        "mig",
        {"mode": "mig", "mig_layout": {"3g.40gb": 2}},
        gpus_per_node=1,
        gpu_publishing="dra",
    )
    [name] = node_names(pool)
    lease_renewals(core, coord, name, 3)

    node = core.read_node(name)
    assert not [k for k in node.status.allocatable if k.startswith("nvidia.com/")]
    [gpu_uuid] = Node.objects.get(name=name).gpu_uuids
    reported = Gpu.objects.get(uuid=gpu_uuid, host=host)
    assert reported.mig_mode == "enabled"
    by_start = {d["placement_start"]: d for d in reported.mig_devices}
    assert sorted(by_start) == [0, 4] and {d["profile"] for d in by_start.values()} == {"3g.40gb"}

    [rslice] = slices_of(objects, name)
    devices = {d["name"]: d for d in rslice["spec"]["devices"]}
    i = reported.index
    assert sorted(devices) == [f"gpu-{i}-mig-3g40gb-9-0", f"gpu-{i}-mig-3g40gb-9-4"]
    for start in (0, 4):
        device = devices[f"gpu-{i}-mig-3g40gb-9-{start}"]
        attributes = device["attributes"]
        assert attributes["type"] == {"string": "mig"}
        assert attributes["uuid"] == {"string": by_start[start]["uuid"]}
        assert attributes["parentUUID"] == {"string": gpu_uuid}
        assert attributes["profile"] == {"string": "3g.40gb"}
        assert attributes["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
        capacity = device["capacity"]
        assert parse_quantity(capacity["memory"]["value"]) == by_start[start]["memory_total_bytes"]
        assert sorted(k for k in capacity if k.startswith("memorySlice")) == [
            f"memorySlice{s}" for s in range(start, start + 4)
        ]
    classes = {
        c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"]
        for c in objects.list_cluster_custom_object(GROUP, VERSION, "deviceclasses")["items"]
    }
    assert classes["mig.nvidia.com"] == (
        f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig"'
    )

    objects.create_namespaced_custom_object(
        GROUP, VERSION, "default", "resourceclaims", mig_claim("two-3g", "3g.40gb", 2)
    )
    core.create_namespaced_pod("default", claiming_pod("two-3g", "two-3g"))
    wait_for(
        lambda: core.read_namespaced_pod("two-3g", "default").status.phase == "Running",
        timeout=60,
        what="the pod with two 3g.40gb devices Running",
    )
    results = objects.get_namespaced_custom_object(
        GROUP, VERSION, "default", "resourceclaims", "two-3g"
    )["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == sorted(devices)
    assert {r["pool"] for r in results} == {name}

    # both instances are handed out: a third 3g.40gb, and a 7g.80gb the GPU does not run
    for claim_name, profile in (("third-3g", "3g.40gb"), ("one-7g", "7g.80gb")):
        objects.create_namespaced_custom_object(
            GROUP, VERSION, "default", "resourceclaims", mig_claim(claim_name, profile, 1)
        )
        core.create_namespaced_pod("default", claiming_pod(claim_name, claim_name))
    for claim_name in ("third-3g", "one-7g"):
        event = failed_scheduling(core, claim_name)
        assert event.source.component == "default-scheduler"
        assert event.message.startswith("0/1 nodes are available: 1 cannot allocate all claims")
        assert core.read_namespaced_pod(claim_name, "default").status.phase == "Pending"
