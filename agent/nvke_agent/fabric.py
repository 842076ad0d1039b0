"""GPU fabric information (multi-node NVLink: GB200 NVL72) in the wire's shape.

NVML reports per GPU (``nvmlDeviceGetGpuFabricInfoV`` with ``nvmlGpuFabricInfo_v2``, or the
older ``nvmlDeviceGetGpuFabricInfo``; NVML API reference ``nvmlGpuFabricInfo_t`` /
``nvmlGpuFabricInfo_v2_t``): ``clusterUuid`` (``unsigned char[16]``), ``cliqueId``
(``unsigned int``), ``state`` (``NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`` 0, ``NOT_STARTED`` 1,
``IN_PROGRESS`` 2, ``COMPLETED`` 3) and ``status`` (an ``nvmlReturn_t``, "must be checked only
if state returns complete"). ``nvidia-smi -q -x`` prints the same under ``<fabric>``
(``<state>``, ``<status>``, ``<cliqueId>``, ``<clusterUuid>``; ``N/A`` on GPUs without it, as
in the RTX 4000 Ada capture ``fleet/captures/rtx-4000-sff-ada-v13.xml``).

The wire's ``inventory.gpus[].fabric`` (agent/README.md)::

    {"state": "not_supported" | "not_started" | "in_progress" | "completed",
     "status": int | None,          # nvmlReturn_t, 0 = NVML_SUCCESS; None when not complete
     "cluster_uuid": str | None,    # "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; None if all zero
     "clique_id": int | None}

The control plane derives the host's NVLink domain from these (``fleet/nvlink_domains.py``).
"""

from __future__ import annotations

import ctypes
import uuid
from typing import Any, TypedDict

#: NVML_GPU_FABRIC_STATE_* by value
STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
#: what nvidia-smi prints for each state (its text output and XML), lower-cased
_SMI_STATES = {
    "not supported": "not_supported",
    "not started": "not_started",
    "in progress": "in_progress",
    "completed": "completed",
}
_UUID_LEN = 16
_MAX_CLIQUE = 2**32 - 1


class GpuFabric(TypedDict):
    state: str
    status: int | None
    cluster_uuid: str | None
    clique_id: int | None


def format_cluster_uuid(raw: bytes | bytearray | list[int] | tuple[int, ...]) -> str | None:
    """NVML's 16 cluster UUID bytes as a canonical UUID string (None when all zero: no
    cluster). Raises ValueError when it is not 16 bytes."""
    data = bytes(raw)
    if len(data) != _UUID_LEN:
        raise ValueError(f"a fabric cluster UUID has {_UUID_LEN} bytes, not {len(data)}")
    if not any(data):
        return None
    return str(uuid.UUID(bytes=data))


def _raw_uuid(info: Any) -> bytes:
    """The 16 ``clusterUuid`` bytes of an NVML fabric info struct. A ctypes ``c_char * 16``
    field reads back cut at the first zero byte, so the bytes are taken from the struct's
    memory at the field's offset; plain objects (bytes, a list of ints) are taken as they are."""
    if isinstance(info, ctypes.Structure):
        field = type(info).clusterUuid
        return ctypes.string_at(ctypes.addressof(info) + field.offset, _UUID_LEN)
    value = info.clusterUuid
    return bytes(value)


def fabric_from_nvml(info: Any) -> GpuFabric:
    """The wire's ``fabric`` from an NVML fabric info struct (``c_nvmlGpuFabricInfoV_t`` or
    ``c_nvmlGpuFabricInfo_t``, or anything with ``state``, ``status``, ``clusterUuid``,
    ``cliqueId``). Cluster UUID and clique id are reported only once the registration is
    complete (before that NVML leaves them unset); ``status`` only then, as NVML says."""
    state = STATES.get(int(info.state))
    if state is None:
        raise ValueError(f"unknown NVML fabric state {int(info.state)}")
    if state != "completed":
        return GpuFabric(state=state, status=None, cluster_uuid=None, clique_id=None)
    clique = int(info.cliqueId)
    if not 0 <= clique <= _MAX_CLIQUE:
        raise ValueError(f"fabric clique id {clique} is out of range")
    cluster = format_cluster_uuid(_raw_uuid(info))
    return GpuFabric(
        state=state,
        status=int(info.status),
        cluster_uuid=cluster,
        clique_id=clique if cluster is not None else None,
    )


def fabric_from_smi(
    state: str | None, status: str | None, clique_id: str | None, cluster_uuid: str | None
) -> GpuFabric | None:
    """The wire's ``fabric`` from ``nvidia-smi``'s ``<fabric>`` texts (None when the GPU has
    no fabric section or prints ``N/A`` for its state). ``status`` ``Success`` is 0; any other
    text is an NVML error (reported as 999, NVML_ERROR_UNKNOWN: nvidia-smi prints its words,
    not its code). A clique id or UUID that does not parse is left out."""
    key = (state or "").strip().lower()
    if key in ("", "n/a"):
        return None
    wire_state = _SMI_STATES.get(key)
    if wire_state is None:
        return None
    if wire_state != "completed":
        return GpuFabric(state=wire_state, status=None, cluster_uuid=None, clique_id=None)
    status_text = (status or "").strip().lower()
    code = 0 if status_text == "success" else 999
    clique = None
    text = (clique_id or "").strip()
    if text.isdigit() and int(text) <= _MAX_CLIQUE:
        clique = int(text)
    cluster = None
    try:
        parsed = uuid.UUID((cluster_uuid or "").strip())
        cluster = str(parsed) if parsed.int else None
    except ValueError:
        cluster = None
    if cluster is None or clique is None:  # the two come together (or not at all)
        cluster = clique = None
    return GpuFabric(state=wire_state, status=code, cluster_uuid=cluster, clique_id=clique)
