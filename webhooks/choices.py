"""Event types (CloudEvents ``type``: ``dev.nvke.<value>``)."""

from django.db import models


class EventType(models.TextChoices):
    OPERATION_FINISHED = "operation.finished"
    OPERATION_FAILED = "operation.failed"
    INVOICE_FINALIZED = "invoice.finalized"
    HOST_MAINTENANCE = "host.maintenance"


CLOUDEVENT_TYPE_PREFIX = "dev.nvke."
