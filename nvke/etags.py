"""``ETag`` on resources and ``If-Match`` on changes (412 on a lost update).

The ETag of a row is a strong validator derived from its primary key and ``updated_at``
(every spec or status write touches ``updated_at``): ``"<sha1 hex, 20 chars>"``. A change
request with ``If-Match`` whose value matches no current ETag answers 412
``precondition_failed``; ``If-Match: *`` and no header at all let the change through.
"""

from __future__ import annotations

import hashlib
from typing import Any

from rest_framework import status

from .errors import ApiError


def etag_for(obj: Any) -> str:
    stamp = getattr(obj, "updated_at", None)
    raw = f"{type(obj).__name__}:{obj.pk}:{stamp.isoformat() if stamp else ''}"
    return '"' + hashlib.sha1(raw.encode()).hexdigest()[:20] + '"'


def check_if_match(request, obj: Any) -> None:
    """Raise 412 when ``If-Match`` is present and does not name the object's current ETag."""
    header = request.headers.get("If-Match")
    if header is None:
        return
    wanted = {tag.strip().removeprefix("W/") for tag in header.split(",")}
    if "*" in wanted or etag_for(obj) in wanted:
        return
    raise ApiError(
        "the resource changed since you read it (If-Match does not match its ETag); "
        "read it again and retry",
        code="precondition_failed",
        status_code=status.HTTP_412_PRECONDITION_FAILED,
        retryable=True,
    )


class ETagMixin:
    """Adds ``ETag`` to retrieve responses and checks ``If-Match`` before destroy."""

    def retrieve(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        from rest_framework.response import Response

        obj = self.get_object()  # type: ignore[attr-defined]
        data = self.get_serializer(obj).data  # type: ignore[attr-defined]
        return Response(data, headers={"ETag": etag_for(obj)})

    def get_object(self):  # type: ignore[no-untyped-def]
        obj = super().get_object()  # type: ignore[misc]
        if self.request.method in ("PUT", "PATCH", "DELETE"):  # type: ignore[attr-defined]
            check_if_match(self.request, obj)  # type: ignore[attr-defined]
        return obj
