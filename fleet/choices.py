"""Enumerations of the fleet app (DESIGN §10)."""

from django.db import models


class HostState(models.TextChoices):
    AVAILABLE = "AVAILABLE"
    ALLOCATED = "ALLOCATED"
    CORDONED = "CORDONED"
    MAINTENANCE = "MAINTENANCE"
    NOT_READY = "NOT_READY"
    FAILED = "FAILED"
    RETIRED = "RETIRED"


#: Host states in which free GPUs may be handed to new nodes.
SCHEDULABLE_HOST_STATES = (HostState.AVAILABLE, HostState.ALLOCATED)


class GpuHealth(models.TextChoices):
    """``UNKNOWN``: the host's agent reports but cannot read the GPU (NVML/DCGM does not
    initialise): not placeable, yet no evidence of a fault — no repair, no SLA credit
    (:func:`fleet.health.apply_source_health`). Only evidence from the GPU makes it UNHEALTHY."""

    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    UNKNOWN = "UNKNOWN"


class ScrubState(models.TextChoices):
    """Whether a GPU is clean enough to be handed to a (possibly different) tenant."""

    CLEAN = "CLEAN"
    #: released by a tenant; MIG teardown + GPU reset + memory clear not confirmed yet
    PENDING = "PENDING"
    FAILED = "FAILED"


class HealthReason(models.TextChoices):
    """Why a GPU health interval was opened (:class:`fleet.models.GpuHealthInterval`)."""

    XID = "xid"
    GPU_MISSING = "gpu_missing"  # the agent's inventory no longer lists the GPU
    HOST_NOT_READY = "host_not_ready"  # no report from the host's agent for the timeout
    CHECK_FAILED = "check_failed"  # onboarding / agent health check found a fault
    SCRUB_FAILED = "scrub_failed"
    OPERATOR = "operator"
    #: a health rule on a signal other than an Xid fired (ECC counts, slowdowns:
    #: :mod:`fleet.health_rules`); the interval's ``detail`` names the rule's condition
    HEALTH_RULE = "health_rule"


class CheckKind(models.TextChoices):
    """Kinds of host hygiene checks (:class:`fleet.models.HostCheck`)."""

    #: the ``nvidia-smi -q -x`` report the host was imported from, read as a health check
    ONBOARDING = "onboarding"
    #: NVML facts from the agent's inventory re-verifying the host after it registered
    AGENT = "agent"
    #: ``dcgmi diag`` results sent by the agent (where DCGM is installed)
    DCGM_DIAG = "dcgm_diag"


class CheckStatus(models.TextChoices):
    PASSED = "PASSED"
    WARNING = "WARNING"  # something to look at; the host stays usable
    FAILED = "FAILED"


class ScrubStatus(models.TextChoices):
    PENDING = "PENDING"
    DONE = "DONE"
    FAILED = "FAILED"


class HostEventKind(models.TextChoices):
    """What a :class:`fleet.models.HostEvent` records."""

    IMPORTED = "imported"
    REGISTERED = "registered"
    STATE = "state"  # a state change (with from/to)
    ACTION = "action"  # an operator action (cordon, drain, maintenance, retire, token …)
    CHECK = "check"
    SCRUB = "scrub"
    XID = "xid"
    INVENTORY = "inventory"  # the agent's inventory disagrees with the host record
    IDENTITY = "identity"  # two agents report with one credential (evidence in ``data``)


class HostTenancy(models.TextChoices):
    """Who a host's GPUs serve (:attr:`fleet.models.Host.tenancy`).

    ``dedicated``: bare-metal nodes, whole GPUs, one tenant per host at a time (the default).
    ``shared``: a hypervisor host whose tenant nodes are VMs holding MIG GPU instances (or
    MIG-backed vGPUs) of its GPUs, several tenants per physical GPU (NVIDIA's multi-tenant
    reference architecture); only ``tenancy: shared`` MIG/vGPU pools are placed there.
    """

    DEDICATED = "dedicated"
    SHARED = "shared"


class GpuInstanceState(models.TextChoices):
    """Where a GPU instance of a shared GPU is (:class:`fleet.models.GpuInstance`).

    ``ACTIVE``: a tenant's node holds it; ``SCRUBBING``: released, the instance is being
    destroyed and its memory cleared, waiting for the host agent to confirm; ``FREE``: the
    agent confirmed the scrub, its memory slices may be placed on again (the row stays as history).
    """

    ACTIVE = "ACTIVE"
    SCRUBBING = "SCRUBBING"
    FREE = "FREE"


class HealthSignal(models.TextChoices):
    """What a health rule watches (:class:`fleet.rule_models.HealthRule`)."""

    XID = "xid"  # an Xid code (the rule names it)
    ECC_SBE = "ecc_sbe"  # corrected (single-bit) ECC errors
    ECC_DBE = "ecc_dbe"  # uncorrected (double-bit) ECC errors
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILED = "row_remap_failed"
    NVML_INIT_FAILURE = "nvml_init_failure"
    FALLEN_OFF_BUS = "fallen_off_bus"  # NVML_ERROR_GPU_IS_LOST
    THERMAL_SLOWDOWN = "thermal_slowdown"
    POWER_SLOWDOWN = "power_slowdown"


class LadderStep(models.TextChoices):
    """The steps of a health rule's action ladder, mildest first: a rule that fires again
    within its escalation window takes the next step of its ladder."""

    RESTART_WORKLOAD = "restart_workload", "restart workload"
    GPU_RESET = "gpu_reset", "GPU reset"
    NODE_REBOOT = "node_reboot", "node reboot"
    REPLACE = "replace", "replace the node"
    HARDWARE_TICKET = "hardware_ticket", "hardware ticket"


#: ladder steps, mildest first (a ladder lists some of them in this order)
LADDER_ORDER: tuple[str, ...] = tuple(LadderStep.values)
