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
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
