"""Enumerations of node pools and nodes (DESIGN §10)."""

from django.db import models


class NodePhase(models.TextChoices):
    PROVISIONING = "PROVISIONING"
    READY = "READY"
    NOT_READY = "NOT_READY"
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"
    REPAIRING = "REPAIRING"
    DELETING = "DELETING"
    DELETED = "DELETED"


class IsolationMode(models.TextChoices):
    EXCLUSIVE = "exclusive"
    MIG = "mig"
    VGPU = "vgpu"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


class GpuPublishing(models.TextChoices):
    """How a pool's GPUs appear to the tenant's scheduler (``NodePool.gpu_publishing``): as
    the NVIDIA device plugin's extended resources (``nvidia.com/gpu``, the default) or as
    Dynamic Resource Allocation devices in ``ResourceSlice``s of the NVIDIA DRA driver
    (``gpu.nvidia.com``), never both (:mod:`nodepools.dra`)."""

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"


#: the one definition of a live node: every phase but DELETING and DELETED (a node that is
#: being released or is gone holds no place in its pool's count). ``Node.objects.live()``
#: (:mod:`nodepools.querysets`) filters by it.
LIVE_NODE_PHASES = tuple(
    p for p in NodePhase.values if p not in (NodePhase.DELETING, NodePhase.DELETED)
)
