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


class Disruption(models.TextChoices):
    """Why a node is being taken out of service (``Node.disruption``; "" when it is not): the
    callers of :data:`nodepools.disruption.POLICIES`, a host drain's and a defragmentation
    run's moves both ``move``."""

    ISOLATION_CHANGE = "isolation-change"
    UPGRADE = "upgrade"
    REPAIR = "repair"
    MOVE = "move"
    SCALE_DOWN = "scale-down"
    DELETION = "deletion"


class DisruptionStep(models.TextChoices):
    """How far a node's disruption got (``Node.disruption_step``), by disruption:

    - ``isolation-change``: ``draining`` → ``validating`` (reconfigured, CORDONED);
    - ``upgrade``: ``draining`` → ``verifying`` (installed), ``drain-blocked`` (paused on
      pods that cannot be evicted), ``rolling-back`` (verification failed);
    - ``repair``: ``requested`` → ``rebooting``, or ``replacing`` (released, on the DELETED row
      until a READY node takes its place);
    - ``move``: ``replacing`` (a replacement is placed first) → ``draining`` →
      ``drain-blocked`` | ``moved`` (released, kept on the DELETED row for the count);
    - ``scale-down``, ``deletion``: ``draining`` (the node is released once drained).
    """

    DRAINING = "draining"
    DRAIN_BLOCKED = "drain-blocked"
    VALIDATING = "validating"
    VERIFYING = "verifying"
    ROLLING_BACK = "rolling-back"
    REQUESTED = "requested"
    REBOOTING = "rebooting"
    REPLACING = "replacing"
    MOVED = "moved"
