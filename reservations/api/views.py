"""Reservations of the caller's tenant (owners and admins create; operators for a tenant),
and the free-capacity calendar per GPU model and region."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models.expressions import RawSQL
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from nvke.errors import ApiError, InvalidInput
from nvke.viewsets import TenantScopedMixin
from reservations import admission, lifecycle
from reservations.models import Reservation
from tenants.models import Tenant

from .serializers import (
    CalendarQuerySerializer,
    CalendarSerializer,
    ReservationCreateSerializer,
    ReservationSerializer,
)


class ReservationViewSet(
    TenantScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """GPU capacity reservations (EKS Capacity Blocks / GKE reservations): N GPUs of a model
    in a region (zone) for ``[start, end)`` or open-ended."""

    queryset = (
        Reservation.objects.annotate(
            used_gpus_now=RawSQL(
                "SELECT count(*) FROM fleet_gpu g JOIN reservations_reservationclaim c"
                " ON c.holder_id = g.holder_id"
                " WHERE c.reservation_id = reservations_reservation.id",
                [],
            )
        )
        .prefetch_related("nodepools")
        .order_by("start", "id")
    )
    serializer_class = ReservationSerializer
    filterset_fields = ["gpu_model", "region"]

    @extend_schema(request=ReservationCreateSerializer, responses={201: ReservationSerializer})
    def create(self, request):
        """Admit a reservation: 201, or 409 ``reservation_capacity`` when the window's busiest
        instant has no room (the error says how many GPUs could be reserved)."""
        principal = request.user
        if not principal.can_admin:
            raise ApiError(
                "only a tenant's owners and admins reserve capacity",
                code="permission_denied",
                status_code=403,
            )
        form = ReservationCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = dict(form.validated_data)
        tenant_id = data.pop("tenant", None)
        if principal.is_operator:
            tenant = Tenant.objects.filter(pk=tenant_id).first() if tenant_id else None
            if tenant is None:
                raise InvalidInput(
                    "operators name the tenant the reservation is for",
                    code="tenant_required",
                    field="tenant",
                )
        else:
            if tenant_id is not None and tenant_id != principal.tenant.id:
                raise InvalidInput(
                    "a tenant reserves for itself only", code="tenant_not_allowed", field="tenant"
                )
            tenant = principal.tenant
        reservation = admission.create_reservation(actor=principal.label, tenant=tenant, **data)
        return Response(ReservationSerializer(reservation).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel a SCHEDULED or ACTIVE reservation now (owners and admins; operators for any
        tenant): 200 with it CANCELLED; 409 ``reservation_cancelled`` / ``reservation_ended``.
        Its pools do what its ``end_action`` says, at once."""
        if not request.user.can_admin:
            raise ApiError(
                "only a tenant's owners and admins cancel reservations",
                code="permission_denied",
                status_code=403,
            )
        reservation = lifecycle.cancel_reservation(
            actor=request.user.label, reservation=self.get_object()
        )
        return Response(ReservationSerializer(reservation).data)


class ReservationCalendarView(APIView):
    """Free capacity of one GPU model in one region (or zone) over a window (counts only:
    other tenants' reservations are never named)."""

    @extend_schema(
        parameters=[
            OpenApiParameter("gpu_model", str, required=True, description="catalog slug"),
            OpenApiParameter("region", str, required=True),
            OpenApiParameter("zone", str),
            OpenApiParameter("start", str, description="RFC 3339; default now"),
            OpenApiParameter(
                "end",
                str,
                description="RFC 3339; default start + 7 days; at most 92 days after start",
            ),
        ],
        responses={200: CalendarSerializer},
        operation_id="reservations_calendar",
    )
    def get(self, request):
        form = CalendarQuerySerializer(data=request.query_params)
        form.is_valid(raise_exception=True)
        q = form.validated_data
        now = timezone.now()
        start = max(q.get("start") or now, now)
        end = q.get("end") or start + timedelta(days=7)
        if end <= start:
            raise InvalidInput(
                "end must be after start (and after now)", code="invalid_window", field="end"
            )
        if end - start > timedelta(days=settings.NVKE_RESERVATION_CALENDAR_MAX_DAYS):
            raise InvalidInput(
                f"the window is at most {settings.NVKE_RESERVATION_CALENDAR_MAX_DAYS} days",
                code="window_too_long",
                field="end",
            )
        body = admission.calendar(
            gpu_model=q["gpu_model"],
            region=q["region"],
            zone=q["zone"],
            start=start,
            end=end,
            now=now,
        )
        return Response(CalendarSerializer(body).data)
