"""Event types (CloudEvents ``type``: ``dev.nvke.<value>``)."""

from django.db import models


class EventType(models.TextChoices):
    OPERATION_FINISHED = "operation.finished"
    OPERATION_FAILED = "operation.failed"
    NODE_REPAIRED = "node.repaired"
    NODE_REPLACED = "node.replaced"
    HOST_MAINTENANCE = "host.maintenance"
    COMMITMENT_BROKEN = "commitment.broken"
    NODEPOOL_DISRUPTION_REQUESTED = "nodepool.disruption.requested"
    INVOICE_FINALIZED = "invoice.finalized"
    QUOTA_80 = "quota.80"
    QUOTA_100 = "quota.100"
    RESERVATION_ENDING = "reservation.ending"
    RESERVATION_ENDED = "reservation.ended"


CLOUDEVENT_TYPE_PREFIX = "dev.nvke."
