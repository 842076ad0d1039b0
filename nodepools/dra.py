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
  lists is not published (the driver's health check withdraws it the same way);
* a GPU the agent reports in MIG mode is published as its MIG devices instead (the driver's
  static MIG devices, ``cmd/gpu-kubelet-plugin/mig.go``): one per MIG device the agent lists
  with a profile and placement, named ``gpu-<index>-mig-<profile>-<profile id>-<start>``
  (``gpu-0-mig-1g10gb-19-0``: the profile without dots, the GPU instance profile id that
  ``nvidia-smi mig -lgip`` prints, from the catalog, device-specific; left out where the
  catalog does not know it), with ``type`` ``mig``, the device's ``uuid``, ``parentUUID``,
  ``profile`` and the parent's attributes above; capacity ``memory`` (the bytes the agent
  reports for the MIG device) and ``memorySlice<i>`` = 1 for each memory slice its placement
  takes, as the driver announces them. A device the agent lists without a placement cannot
  be named and is not published; nor is any device of an unhealthy GPU.

``brand`` is not published: the agent does not report NVML's brand; nor are a MIG device's
``multiprocessors`` / engine counts (the driver reads them from NVML's GPU instance profile;
NVKE's catalog does not hold them for every model). Shared GPUs (time-slicing, MPS, vGPU,
MIG on shared hosts) are not DRA devices: such a pool is refused.
What a real kubelet then does with an allocated claim (the driver's ``NodePrepareResources``,
CDI devices in the container) is simulated below the kubelet, i.e. not at all: KWOK starts the
pod.
"""

from __future__ import annotations

from typing import Any

from fleet.agent_facts import GpuFacts, HostFacts, MigDevice
from nvke.errors import InvalidInput

from .choices import GpuPublishing, IsolationMode

#: the isolation modes a DRA pool may have, dedicated: whole GPUs (one device each) and MIG
#: (one device per GPU instance)
DRA_ISOLATION_MODES = (IsolationMode.EXCLUSIVE, IsolationMode.MIG)


def validate_gpu_publishing(gpu_publishing: Any, policy: dict[str, Any]) -> None:
    """InvalidInput (field ``gpu_publishing``): ``invalid_gpu_publishing`` for a value other
    than ``device-plugin`` / ``dra``; ``dra_isolation_not_supported`` for ``dra`` with an
    isolation other than ``exclusive`` or ``mig`` with tenancy ``dedicated`` (shared GPUs:
    time-slicing, MPS, vGPU and MIG on shared hosts are not published as DRA devices)."""
    if gpu_publishing not in GpuPublishing.values:
        raise InvalidInput(
            f"gpu_publishing must be one of {', '.join(GpuPublishing.values)}",
            code="invalid_gpu_publishing",
            field="gpu_publishing",
        )
    if gpu_publishing != GpuPublishing.DRA:
        return
    mode = policy.get("mode")
    tenancy = policy.get("tenancy") or "dedicated"
    if mode not in DRA_ISOLATION_MODES or tenancy != "dedicated":
        what = f"isolation mode {mode!r}" if tenancy == "dedicated" else f"tenancy {tenancy!r}"
        raise InvalidInput(
            f"a pool publishing its GPUs as DRA devices must be exclusive or MIG on dedicated "
            f"hosts ({what}: shared GPUs are not published as DRA devices)",
            code="dra_isolation_not_supported",
            field="isolation" if mode else "gpu_publishing",
            extra={
                "gpu_publishing": gpu_publishing,
                "supported_modes": [str(m) for m in DRA_ISOLATION_MODES],
                "supported_tenancy": ["dedicated"],
            },
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


def mig_device_name(index: int, profile: str, profile_id: int | None, start: int) -> str:
    """The DRA driver's canonical name of a MIG device (``MigSpecTuple.ToCanonicalName``):
    ``gpu-0-mig-1g10gb-19-0`` for ``1g.10gb`` (GPU instance profile id 19) at memory slice 0
    of GPU 0; ``+`` becomes ``-`` (RFC 1123); without a known profile id that segment is left
    out (``gpu-0-mig-1g10gb-0``)."""
    name = profile.replace(".", "").replace("+", "-").lower()
    middle = f"{name}-{profile_id}" if profile_id is not None else name
    return f"gpu-{index}-mig-{middle}-{start}"


def _mig_devices(
    gpu: GpuFacts, attributes: dict[str, dict[str, Any]], profile_ids: dict[str, int]
) -> list[dict[str, Any]]:
    parent = {k: v for k, v in attributes.items() if k not in ("type", "uuid")}
    out = []
    for device in sorted(gpu.devices, key=lambda d: (d.start, d.profile)):
        if device.profile == "?" or device.start < 0:
            continue  # no placement: the device cannot be named
        out.append(_mig_device(gpu, device, parent, profile_ids.get(device.profile)))
    return out


def _mig_device(
    gpu: GpuFacts, device: MigDevice, parent: dict[str, dict[str, Any]], profile_id: int | None
) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {"type": {"string": "mig"}}
    if device.uuid:
        attributes["uuid"] = {"string": device.uuid}
    attributes["parentUUID"] = {"string": gpu.uuid}
    attributes["profile"] = {"string": device.profile}
    attributes.update(parent)
    capacity: dict[str, dict[str, str]] = {}
    if device.memory_total_bytes:
        capacity["memory"] = {"value": quantity(device.memory_total_bytes)}
    for memory_slice in range(device.start, device.start + device.size):
        capacity[f"memorySlice{memory_slice}"] = {"value": "1"}
    return {
        "name": mig_device_name(gpu.index, device.profile, profile_id, device.start),
        "attributes": attributes,
        "capacity": capacity,
    }


def gpu_devices(
    gpus: list[GpuFacts], facts: HostFacts | None, profile_ids: dict[str, int] | None = None
) -> tuple[dict[str, Any], ...]:
    """The DRA devices of a node's ``gpus`` (those its host's agent lists, as
    :func:`nodepools.tenant_nodes.tenant_node` selects them) on the host ``facts`` describe:
    ResourceSlice ``spec.devices`` entries (see the module doc), the unhealthy left out; a GPU
    in MIG mode as its MIG devices, named with ``profile_ids`` (``{"1g.10gb": 19}``, the GPU
    model's GPU instance profile ids from the catalog)."""
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
        if gpu.mig_mode == "enabled":
            devices.extend(_mig_devices(gpu, attributes, profile_ids or {}))
            continue
        capacity = {}
        if gpu.memory_total_bytes:
            capacity["memory"] = {"value": quantity(gpu.memory_total_bytes)}
        devices.append({"name": f"gpu-{gpu.index}", "attributes": attributes, "capacity": capacity})
    return tuple(devices)
