"""A pool's GPUs as Dynamic Resource Allocation devices (``NodePool.gpu_publishing = "dra"``).

A DRA pool's nodes advertise no ``nvidia.com/gpu``: each node's GPUs are published as one
``resource.k8s.io/v1`` ResourceSlice of the NVIDIA DRA driver (``gpu.nvidia.com``,
github.com/NVIDIA/k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin/deviceinfo.go``), so the
tenant's kube-scheduler allocates ``ResourceClaim``s against them and one GPU can never be
handed out both as an extended resource and as a device. :func:`gpu_devices` derives the
devices, like :func:`nodepools.tenant_nodes.tenant_node` derives the rest of the Node, ONLY
from the host agent's latest report (:func:`fleet.agent_facts.host_facts`):

* one device per GPU of the node that the agent lists, named ``gpu-<index>`` (the driver
  names it ``gpu-<minor>``; NVKE's agent reports the index, equal to the minor on the hosts
  it knows), in index order;
* attributes (qualified by the driver's domain in CEL:
  ``device.attributes["gpu.nvidia.com"].productName``), each only where the agent reported
  it: ``type`` ``gpu``, ``uuid``, ``productName`` (NVML's name), ``architecture``
  (``Hopper``), ``cudaComputeCapability`` (version ``9.0.0``), ``driverVersion`` (version:
  ``570.172.08`` as semver ``570.172.8``, as the driver's Masterminds parse writes it),
  ``cudaDriverVersion`` (``12.8.0``) and, on a host of a multi-node NVLink domain,
  ``cliqueID`` = ``<fabric cluster UUID>.<clique id>`` (NVKE's: the driver keeps the clique on
  its ComputeDomain; the same value as GFD's ``nvidia.com/gpu.clique`` label);
* capacity ``memory``: the bytes NVML reports, as a binary-SI quantity (``81559Mi``);
* a GPU the fleet holds UNHEALTHY (Xid 79, a failed health check) or the agent no longer
  lists is not published (the driver's health check withdraws it the same way).

``brand`` is not published: the agent does not report NVML's brand. MIG devices (the driver's
``gpu-<i>-mig-…`` with ``profile``, ``parentUUID``) are not built: a DRA pool is exclusive.
What a real kubelet then does with an allocated claim (the driver's ``NodePrepareResources``,
CDI devices in the container) is simulated below the kubelet, i.e. not at all: KWOK starts the
pod.
"""

from __future__ import annotations

from typing import Any

from fleet.agent_facts import GpuFacts, HostFacts
from nvke.errors import InvalidInput

from .choices import GpuPublishing, IsolationMode

#: the isolation modes a DRA pool may have (whole GPUs, one per device)
DRA_ISOLATION_MODES = (IsolationMode.EXCLUSIVE,)


def validate_gpu_publishing(gpu_publishing: Any, policy: dict[str, Any]) -> None:
    """InvalidInput (field ``gpu_publishing``): ``invalid_gpu_publishing`` for a value other
    than ``device-plugin`` / ``dra``; ``dra_isolation_not_supported`` for ``dra`` with an
    isolation other than ``exclusive`` (MIG, sharing and vGPU devices are not published as DRA
    devices yet)."""
    if gpu_publishing not in GpuPublishing.values:
        raise InvalidInput(
            f"gpu_publishing must be one of {', '.join(GpuPublishing.values)}",
            code="invalid_gpu_publishing",
            field="gpu_publishing",
        )
    mode = policy.get("mode")
    if gpu_publishing == GpuPublishing.DRA and mode not in DRA_ISOLATION_MODES:
        raise InvalidInput(
            f"a pool publishing its GPUs as DRA devices must be exclusive (isolation mode "
            f"{mode!r}: its devices are not published as DRA devices yet)",
            code="dra_isolation_not_supported",
            field="isolation" if mode else "gpu_publishing",
            extra={"gpu_publishing": gpu_publishing, "supported_modes": ["exclusive"]},
        )


def semver(version: str) -> str | None:
    """``major.minor.patch`` of a dotted version (``570.172.08`` -> ``570.172.8``, ``9.0`` ->
    ``9.0.0``), as a DRA ``version`` attribute needs it (semver 2.0: no leading zeros); None
    when it is not numbers."""
    parts = version.strip().split(".")
    if not version.strip() or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)


def quantity(value: int) -> str:
    """A byte count as Kubernetes writes a binary-SI quantity (``85520809984`` -> ``81559Mi``)."""
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if value and value % 2**power == 0:
            return f"{value // 2**power}{suffix}"
    return str(value)


def gpu_devices(gpus: list[GpuFacts], facts: HostFacts | None) -> tuple[dict[str, Any], ...]:
    """The DRA devices of a node's ``gpus`` (those its host's agent lists, as
    :func:`nodepools.tenant_nodes.tenant_node` selects them) on the host ``facts`` describe:
    ResourceSlice ``spec.devices`` entries (see the module doc), the unhealthy left out."""
    host_versions: dict[str, dict[str, str]] = {}
    clique: dict[str, dict[str, str]] = {}
    if facts is not None:
        for name, raw in (
            ("driverVersion", facts.driver_version),
            ("cudaDriverVersion", facts.cuda_version),
        ):
            value = semver(raw or "")
            if value:
                host_versions[name] = {"version": value}
        if facts.nvlink_domain is not None:
            cluster_uuid, clique_id = facts.nvlink_domain
            clique["cliqueID"] = {"string": f"{cluster_uuid}.{clique_id}"}
    devices = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.health != "HEALTHY":
            continue
        attributes: dict[str, dict[str, Any]] = {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
        }
        if gpu.product_name:
            attributes["productName"] = {"string": gpu.product_name}
        if gpu.architecture:
            attributes["architecture"] = {"string": gpu.architecture}
        capability = semver(gpu.compute_capability)
        if capability:
            attributes["cudaComputeCapability"] = {"version": capability}
        attributes.update(host_versions)
        attributes.update(clique)
        capacity = {}
        if gpu.memory_total_bytes:
            capacity["memory"] = {"value": quantity(gpu.memory_total_bytes)}
        devices.append({"name": f"gpu-{gpu.index}", "attributes": attributes, "capacity": capacity})
    return tuple(devices)
