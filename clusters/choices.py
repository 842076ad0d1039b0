"""Enumerations of clusters and operations (DESIGN §3, §10)."""

from django.db import models


class Phase(models.TextChoices):
    """Phase of a cluster or node pool (for people and billing; decisions read conditions)."""

    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    RECONCILING = "RECONCILING"
    DEGRADED = "DEGRADED"
    ERROR = "ERROR"
    DELETING = "DELETING"
    DELETE_FAILED = "DELETE_FAILED"
    DELETED = "DELETED"


#: Phases in which a reconciler still has work to do.
TRANSITIONAL_PHASES = (Phase.PROVISIONING, Phase.RECONCILING, Phase.DELETING)
#: Phases of an object that is gone or going.
GONE_PHASES = (Phase.DELETING, Phase.DELETE_FAILED, Phase.DELETED)


class OperationType(models.TextChoices):
    CREATE_CLUSTER = "CREATE_CLUSTER"
    DELETE_CLUSTER = "DELETE_CLUSTER"
    UPGRADE_CONTROL_PLANE = "UPGRADE_CONTROL_PLANE"
    CREATE_NODE_POOL = "CREATE_NODE_POOL"
    SET_NODE_POOL_SIZE = "SET_NODE_POOL_SIZE"
    UPGRADE_NODES = "UPGRADE_NODES"
    UPDATE_ISOLATION = "UPDATE_ISOLATION"
    REPAIR_NODES = "REPAIR_NODES"
    #: nodes moved off a host an operator drains (maintenance, retirement): nodepools/host_moves
    HOST_MAINTENANCE = "HOST_MAINTENANCE"
    DELETE_NODE_POOL = "DELETE_NODE_POOL"
    UPDATE_CLUSTER = "UPDATE_CLUSTER"
    ROTATE_CREDENTIALS = "ROTATE_CREDENTIALS"


class OperationStatus(models.TextChoices):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


ACTIVE_OPERATION_STATUSES = (OperationStatus.PENDING, OperationStatus.RUNNING)


class TargetType(models.TextChoices):
    CLUSTER = "cluster"
    NODE_POOL = "nodepool"
