"""GPU fabric information (multi-node NVLink, GB200 NVL72) as the agent reports it.

No fake NVML: the NVML side is the real ``pynvml`` (nvidia-ml-py) ctypes structures,
``c_nvmlGpuFabricInfoV_t`` (nvmlGpuFabricInfo_v2_t: version, clusterUuid[16], status,
cliqueId, state, healthMask) and ``c_nvmlGpuFabricInfo_t``, filled with values shaped like
what NVML writes on a GB200 tray (state NVML_GPU_FABRIC_STATE_COMPLETED = 3, status
NVML_SUCCESS = 0, a 16-byte cluster UUID, a clique id), and mapped by the function the
``nvml`` source calls. The ``simulated`` source reads a SIMULATED host's state file;
``nvidia-smi -q -x`` reports are read with the same parser as the ``nvidia-smi-xml`` source.
"""

from __future__ import annotations

import ctypes
import json
import uuid
from pathlib import Path

import pynvml
import pytest
from nvke_agent.fabric import fabric_from_nvml, fabric_from_smi, format_cluster_uuid
from nvke_agent.smi_xml import parse_nvidia_smi_xml
from nvke_agent.sources.simulated import SimulatedSource

# a cluster UUID whose first byte is 0: a c_char[16] field would read back as b"" (cut at
# the first NUL); the mapping must take all 16 bytes
CLUSTER = uuid.UUID("00f1e2d3-c4b5-4a69-8877-665544332211")


def v2_struct(*, state: int, status: int, clique: int, cluster: bytes) -> ctypes.Structure:
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    info.version = pynvml.nvmlGpuFabricInfo_v2
    ctypes.memmove(info.clusterUuid, cluster, 16)
    info.status, info.cliqueId, info.state, info.healthMask = status, clique, state, 0
    return info


def test_a_completed_registration_maps_to_its_cluster_and_clique():
    info = v2_struct(state=3, status=0, clique=32766, cluster=CLUSTER.bytes)
    assert fabric_from_nvml(info) == {
        "state": "completed",
        "status": 0,
        "cluster_uuid": "00f1e2d3-c4b5-4a69-8877-665544332211",
        "clique_id": 32766,
    }


def test_the_v1_struct_maps_the_same_way():
    info = pynvml.c_nvmlGpuFabricInfo_t()
    ctypes.memmove(info.clusterUuid, CLUSTER.bytes, 16)
    info.status, info.cliqueId, info.state = 0, 4294967295, 3
    assert fabric_from_nvml(info)["clique_id"] == 2**32 - 1
    assert fabric_from_nvml(info)["cluster_uuid"] == str(CLUSTER)


@pytest.mark.parametrize(
    ("state", "name"), [(0, "not_supported"), (1, "not_started"), (2, "in_progress")]
)
def test_an_unfinished_registration_reports_no_ids(state, name):
    # before completion NVML leaves the ids unset and status is not to be read
    info = v2_struct(state=state, status=999, clique=5, cluster=CLUSTER.bytes)
    assert fabric_from_nvml(info) == {
        "state": name,
        "status": None,
        "cluster_uuid": None,
        "clique_id": None,
    }


def test_a_failed_registration_keeps_its_nvml_error_and_an_all_zero_uuid_is_no_cluster():
    failed = v2_struct(state=3, status=15, clique=1, cluster=CLUSTER.bytes)  # GPU_IS_LOST
    assert fabric_from_nvml(failed)["status"] == 15
    zero = v2_struct(state=3, status=0, clique=9, cluster=bytes(16))
    assert fabric_from_nvml(zero) == {
        "state": "completed",
        "status": 0,
        "cluster_uuid": None,
        "clique_id": None,
    }
    with pytest.raises(ValueError):
        fabric_from_nvml(v2_struct(state=7, status=0, clique=1, cluster=CLUSTER.bytes))
    with pytest.raises(ValueError):
        format_cluster_uuid(b"\x01" * 15)


def test_the_simulated_source_reports_each_gpus_fabric(tmp_path: Path):
    """A SIMULATED GB200 tray: its state file says the fabric registration completed."""
    gpu = {
        "uuid": "GPU-sim-7",
        "index": 0,
        "name": "NVIDIA GB200",
        "pci_bus_id": "00000000:18:00.0",
        "memory_total_bytes": None,
        "mig_mode": "disabled",
        "instances": [],
        "health": {},
        "fabric": {"state": 3, "status": 0, "cluster_uuid_hex": CLUSTER.hex, "clique_id": 4},
    }
    other = {**gpu, "uuid": "GPU-sim-8", "index": 1}
    del other["fabric"]
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"gpus": [gpu, other], "driver_version": "580.95.05"}))
    gpus = SimulatedSource(path).inventory()["gpus"]
    assert gpus[0]["fabric"] == {
        "state": "completed",
        "status": 0,
        "cluster_uuid": str(CLUSTER),
        "clique_id": 4,
    }
    assert "fabric" not in gpus[1]  # a GPU whose source cannot tell leaves the key out


GB200_LIKE_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>580.95.05</driver_version>
  <attached_gpus>2</attached_gpus>
  <gpu id="00000008:01:00.0">
    <product_name>NVIDIA GB200</product_name>
    <uuid>GPU-0b5f7a39-52a1-4d6f-9e0c-1d2e3f405162</uuid>
    <pci><pci_bus_id>00000008:01:00.0</pci_bus_id></pci>
    <fabric>
      <state>Completed</state>
      <status>Success</status>
      <cliqueId>32766</cliqueId>
      <clusterUuid>00f1e2d3-c4b5-4a69-8877-665544332211</clusterUuid>
    </fabric>
  </gpu>
  <gpu id="00000009:01:00.0">
    <product_name>NVIDIA GB200</product_name>
    <uuid>GPU-1c6a8b4a-63b2-4e70-8f1d-2e3f40516273</uuid>
    <pci><pci_bus_id>00000009:01:00.0</pci_bus_id></pci>
    <fabric><state>In Progress</state><status>N/A</status></fabric>
  </gpu>
</nvidia_smi_log>
"""


def test_the_nvidia_smi_reader_maps_the_fabric_section():
    """The element names are those of the real captures (fleet/captures/*-v13.xml); the
    texts of a GB200's section ("Completed", "Success") are nvidia-smi's words for the NVML
    states, not a captured GB200 report (none was found): a hand-made document."""
    report = parse_nvidia_smi_xml(GB200_LIKE_XML)
    assert report.gpus[0].fabric == {
        "state": "completed",
        "status": 0,
        "cluster_uuid": str(CLUSTER),
        "clique_id": 32766,
    }
    assert report.gpus[1].fabric == {
        "state": "in_progress",
        "status": None,
        "cluster_uuid": None,
        "clique_id": None,
    }
    assert fabric_from_smi("N/A", "N/A", "N/A", "N/A") is None
    # an unparseable clique id drops both ids (they come together)
    assert fabric_from_smi("Completed", "Success", "x", str(CLUSTER))["cluster_uuid"] is None
