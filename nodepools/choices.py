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
