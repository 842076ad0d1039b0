"""202 Accepted with the Operation: body, ``Location`` (the operation's URL) and ``Retry-After``.

Every mutating endpoint answers through :func:`accepted` so a client can poll the operation the
way RFC 9110 §15.3.3 describes, without knowing NVKE's URL layout.
"""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse
from rest_framework import status
from rest_framework.response import Response


def operation_url(request, operation_id) -> str:
    """Absolute URL of ``/api/v1/operations/{id}`` on the host the caller used."""
    return request.build_absolute_uri(reverse("clusters:operation-detail", args=[operation_id]))


def accepted(request, operation) -> Response:
    """202 with the serialized Operation, ``Location`` and ``Retry-After`` (seconds)."""
    from clusters.api.serializers import OperationSerializer

    return Response(
        OperationSerializer(operation).data,
        status=status.HTTP_202_ACCEPTED,
        headers={
            "Location": operation_url(request, operation.id),
            "Retry-After": str(settings.NVKE_OPERATION_RETRY_AFTER_S),
        },
    )
