"""Cluster API / GPU Operator status mapped back to NVKE's provider dataclasses
(clusters/providers/clusterapi/status.py), with objects written by hand in the shapes of the
v1beta2 API (status.conditions) and of v1beta1 (status.deprecated.v1beta1.conditions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clusters.providers.base import ProviderError
from clusters.providers.clusterapi import status
from tests.clusterapi.specs import NODE_IDS, node_spec, pool_spec

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def cond(type_, value, reason="R", message=""):
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-11-29T11:00:00Z",
    }


def capi_cluster(*conditions, endpoint=True, phase="Provisioned", old=()):
    obj = {
        "metadata": {"name": "c"},
        "spec": {"controlPlaneEndpoint": {"host": "10.0.0.5", "port": 6443}} if endpoint else {},
        "status": {"phase": phase, "conditions": list(conditions)},
    }
    if old:
        obj["status"]["deprecated"] = {"v1beta1": {"conditions": list(old)}}
    return obj


def kcp(version="v1.36.0", replicas=3, up_to_date=3):
    return {
        "spec": {"replicas": replicas, "version": version},
        "status": {"version": version, "upToDateReplicas": up_to_date},
    }


def test_a_cluster_with_infrastructure_and_an_available_control_plane_is_ready():
    found = status.control_plane_status(
        capi_cluster(cond("InfrastructureReady", "True"), cond("ControlPlaneAvailable", "True")),
        kcp(),
    )
    assert (found.ready, found.endpoint) == (True, "https://10.0.0.5:6443")
    assert getattr(found, "version", "1.36") == "1.36"


def test_infrastructure_not_ready_is_said_in_words():
    found = status.control_plane_status(
        capi_cluster(
            cond("InfrastructureReady", "False", "NotReady", "Metal3Cluster c is provisioning"),
            cond("ControlPlaneAvailable", "False"),
        ),
        None,
    )
    assert not found.ready
    assert found.message == (
        "waiting for the infrastructure: InfrastructureReady is False (NotReady): "
        "Metal3Cluster c is provisioning"
    )
    assert found.retry_after_s == 5.0


def test_control_plane_not_available_or_without_endpoint_is_not_ready():
    unavailable = status.control_plane_status(
        capi_cluster(
            cond("InfrastructureReady", "True"),
            cond("ControlPlaneAvailable", "False", "NotAvailable", "0 of 3 replicas"),
        ),
        kcp(up_to_date=0),
    )
    assert unavailable.message == (
        "waiting for the control plane: ControlPlaneAvailable is False (NotAvailable): "
        "0 of 3 replicas"
    )
    no_endpoint = status.control_plane_status(
        capi_cluster(
            cond("InfrastructureReady", "True"),
            cond("ControlPlaneAvailable", "True"),
            endpoint=False,
        ),
        kcp(),
    )
    assert not no_endpoint.ready


def test_v1beta1_conditions_are_read_when_v1beta2_ones_are_missing():
    found = status.control_plane_status(
        capi_cluster(
            old=(cond("InfrastructureReady", "True"), cond("ControlPlaneReady", "True")),
        ),
        kcp(),
    )
    assert found.ready


def test_no_cluster_yet_and_a_deleting_cluster_are_not_ready():
    assert status.control_plane_status(None, None).message == (
        "the Cluster API objects are being created"
    )
    deleting = capi_cluster(
        cond("InfrastructureReady", "True"), cond("ControlPlaneAvailable", "True")
    )
    deleting["metadata"]["deletionTimestamp"] = "2026-11-29T11:00:00Z"
    assert not status.control_plane_status(deleting, kcp()).ready


def test_a_failed_cluster_is_an_error_retrying_cannot_fix():
    with pytest.raises(ProviderError) as caught:
        status.control_plane_status(
            capi_cluster(cond("Available", "False", "Failed", "etcd quorum lost"), phase="Failed"),
            kcp(),
        )
    assert (caught.value.code, caught.value.retryable) == ("clusterapi_cluster_failed", False)
    assert "etcd quorum lost" in str(caught.value)


def test_the_control_plane_version_counts_once_every_replica_is_up_to_date():
    assert status.control_plane_version(kcp("v1.37.1", 3, 3)) == "1.37"
    assert status.control_plane_version(kcp("v1.36.4", 3, 1)) == ""
    assert status.control_plane_version(None) == ""


def test_new_workers_are_never_newer_than_the_control_plane():
    assert status.running_version(kcp("v1.35.2"), "v1.36.0") == "v1.35.2"
    assert status.running_version(kcp("v1.36.0"), "v1.35.9") == "v1.35.9"
    assert status.running_version(None, "v1.36.0") == "v1.36.0"


def machine(phase="Running", node="n-1", ready="True", **meta):
    obj = {
        "metadata": {"name": "md-00001", **meta},
        "spec": {"failureDomain": "us-east-1a"},
        "status": {"phase": phase, "conditions": [cond("NodeReady", ready, "NodeReady")]},
    }
    if node:
        obj["status"]["nodeRef"] = {"name": node}
    return obj


def test_a_running_machine_with_a_ready_node_is_ready():
    found = status.machine_status(NODE_IDS[0], machine(), deployment="md")
    assert (found.ready, found.message) == (True, "Machine md-00001 runs node n-1")


@pytest.mark.parametrize(
    ("obj", "message", "retry"),
    [
        (None, "waiting for a Machine of MachineDeployment md", 5.0),
        (
            machine("Provisioning", node="", ready="Unknown"),
            "Machine md-00001 is Provisioning: NodeReady is Unknown (NodeReady)",
            5.0,
        ),
        (
            machine(ready="False"),
            "Machine md-00001 is Running: NodeReady is False (NodeReady)",
            5.0,
        ),
        (machine("Failed"), "Machine md-00001 failed: Ready not reported yet", 30.0),
        (
            machine(deletionTimestamp="2026-11-29T11:00:00Z"),
            "Machine md-00001 is being deleted",
            30.0,
        ),
    ],
)
def test_machines_that_are_not_ready_say_why(obj, message, retry):
    found = status.machine_status(NODE_IDS[0], obj, deployment="md")
    assert (found.ready, found.message, found.retry_after_s) == (False, message, retry)


def test_a_machine_placement_names_its_node_and_failure_domain():
    placed = status.machine_placement(NODE_IDS[1], machine())
    assert (placed.node_id, placed.host_id, placed.hostname, placed.zone, placed.gpu_uuids) == (
        NODE_IDS[1],
        None,
        "n-1",
        "us-east-1a",
        (),
    )


# --- GPU config of a node -----------------------------------------------------------------------


def node_obj(labels, applied_at=None):
    obj = {
        "metadata": {
            "name": "n-1",
            "labels": labels,
            "creationTimestamp": "2026-11-29T11:00:00Z",
            "annotations": {},
        }
    }
    if applied_at:
        obj["metadata"]["annotations"]["nvke.io/gpu-config-applied-at"] = applied_at.isoformat()
    return obj


def single_labels(**extra):
    labels = {
        "nvidia.com/mig.config": "all-1g.10gb",
        "nvidia.com/device-plugin.config": "nvke-h100-mig",
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/gpu.count": "14",  # 7 MIG devices x 2 GPUs under "single"
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gfd.timestamp": str(int(NOW.timestamp())),
    }
    labels.update(extra)
    return labels


def test_expected_gfd_labels_follow_the_pool_config(catalog):
    assert status.expected_gpu_labels(pool_spec()) == {
        "nvidia.com/gpu.count": "14",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.replicas": "1",
    }
    mixed = pool_spec(
        "h100-nvl-94gb", 2, {"mode": "mig", "mig_layout": {"3g.47gb": 1, "1g.12gb": 2}}, name="n"
    )
    assert status.expected_gpu_labels(mixed) == {
        "nvidia.com/mig-3g.47gb.count": "2",
        "nvidia.com/mig-1g.12gb.count": "4",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.replicas": "1",
    }
    sliced = pool_spec("l40s", 4, {"mode": "time-slicing", "replicas": 4}, name="ts")
    assert status.expected_gpu_labels(sliced) == {
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/gpu.replicas": "4",
    }


@pytest.mark.django_db
def test_a_node_running_its_config_is_a_success_with_a_layout_per_gpu(catalog):
    node = node_spec(0, ("GPU-a", "GPU-b"))
    placements = [{"profile": "1g.10gb", "start": i, "size": 1} for i in range(7)]
    found = status.node_config_status(
        pool_spec(), node, node_obj(single_labels()), NOW, mig_placements=placements
    )
    assert found.state == "success"
    assert [g["gpu_uuid"] for g in found.gpu_layout] == ["GPU-a", "GPU-b"]
    assert found.gpu_layout[0]["mig_devices"] == placements
    assert found.gpu_layout[0]["sharing"] is None and found.gpu_layout[0]["vgpu_devices"] == {}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("labels", "state", "message"),
    [
        (
            single_labels(**{"nvidia.com/mig.config": "all-disabled"}),
            "pending",
            "n-1: label nvidia.com/mig.config is 'all-disabled', not 'all-1g.10gb' yet",
        ),
        (
            single_labels(**{"nvidia.com/mig.config.state": "rebooting"}),
            "pending",
            "n-1: MIG Manager reports nvidia.com/mig.config.state=rebooting",
        ),
        (
            single_labels(**{"nvidia.com/mig.config.state": "failed"}),
            "failed",
            "n-1: MIG Manager reported nvidia.com/mig.config.state=failed for 'all-1g.10gb'",
        ),
    ],
)
def test_mig_manager_states_map_to_pending_and_failed(catalog, labels, state, message):
    found = status.node_config_status(pool_spec(), node_spec(), node_obj(labels), NOW)
    assert (found.state, found.message) == (state, message)


@pytest.mark.django_db
def test_gfd_disagreeing_is_pending_until_it_relabelled_after_the_change(catalog):
    applied = NOW - timedelta(minutes=1)
    stale = single_labels(**{"nvidia.com/gpu.count": "2"})
    stale["nvidia.com/gfd.timestamp"] = str(int((applied - timedelta(minutes=5)).timestamp()))
    found = status.node_config_status(pool_spec(), node_spec(), node_obj(stale, applied), NOW)
    assert found.state == "pending"
    assert found.message == (
        "n-1: waiting for GPU Feature Discovery: nvidia.com/gpu.count='2' (expected '14')"
    )
    fresh = dict(stale, **{"nvidia.com/gfd.timestamp": str(int(NOW.timestamp()))})
    found = status.node_config_status(pool_spec(), node_spec(), node_obj(fresh, applied), NOW)
    assert (found.state, found.message) == (
        "failed",
        "n-1: GPU Feature Discovery reports nvidia.com/gpu.count='2' (expected '14')",
    )
    # without a newer GFD timestamp, ten minutes after the change is enough
    late = status.node_config_status(
        pool_spec(), node_spec(), node_obj(stale, applied), applied + timedelta(minutes=11)
    )
    assert late.state == "failed"


@pytest.mark.django_db
def test_a_node_gfd_has_not_labelled_yet_is_pending(catalog):
    labels = {
        "nvidia.com/mig.config": "all-1g.10gb",
        "nvidia.com/device-plugin.config": "nvke-h100-mig",
        "nvidia.com/mig.config.state": "success",
    }
    found = status.node_config_status(pool_spec(), node_spec(), node_obj(labels), NOW)
    assert found.state == "pending"
    assert found.message.startswith("n-1: GPU Feature Discovery has not labelled the node yet")
    missing = status.node_config_status(pool_spec(), node_spec(), None, NOW)
    assert (missing.state, missing.message) == ("pending", "the node has not joined")


def test_an_upgrading_control_plane_is_not_ready_until_every_replica_rolled():
    ready = capi_cluster(cond("InfrastructureReady", "True"), cond("ControlPlaneAvailable", "True"))
    rolling = status.control_plane_status(ready, kcp("v1.36.0", 3, 1), "v1.37.0")
    assert (rolling.ready, rolling.message) == (
        False,
        "rolling the control plane to v1.37.0: 1 of 3 machines up to date",
    )
    unseen = kcp("v1.36.0", 3, 3)
    unseen["metadata"] = {"generation": 4}
    unseen["status"]["observedGeneration"] = 3
    assert status.control_plane_status(ready, unseen, "v1.37.0").message == (
        "Cluster API has not acted on the control plane's new spec yet"
    )
    assert status.control_plane_status(ready, kcp("v1.37.0", 3, 3), "v1.37.0").ready
