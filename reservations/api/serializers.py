"""Reservation serializers (shapes of the /api/v1/reservations endpoints)."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers

from nvke.validation import BoundedDateTimeField, StrictUUIDField
from reservations.capacity import reservation_used
from reservations.choices import EndAction
from reservations.models import Reservation

ZONE = r"^[a-z0-9]([-a-z0-9]{0,62})?$"


class ReservationSerializer(serializers.ModelSerializer):
    tenant_id = serializers.UUIDField(read_only=True)
    gpu_model = serializers.CharField(source="gpu_model_id", read_only=True)
    state = serializers.SerializerMethodField(help_text="SCHEDULED | ACTIVE | ENDED | CANCELLED")
    used_gpus = serializers.SerializerMethodField(
        help_text="GPUs held now by nodes of pools drawing from it"
    )
    nodepool_ids = serializers.SerializerMethodField()
    nvlink_domain = serializers.SerializerMethodField(
        help_text="{cluster_uuid, clique_id, label} of the NVLink domain it reserves, or null"
    )
    announce_at = serializers.SerializerMethodField(
        help_text="when its end is announced (event reservation.ending; its pools' "
        "ReservationEnding condition): notice_lead_s before end, but never in the "
        "reservation's first half (a 2-hour reservation: 1 h in); null when open-ended"
    )

    class Meta:
        model = Reservation
        fields = [
            "id",
            "tenant_id",
            "name",
            "gpu_model",
            "region",
            "zone",
            "gpus",
            "nvlink_domain",
            "start",
            "end",
            "end_action",
            "notice_lead_s",
            "announce_at",
            "state",
            "used_gpus",
            "nodepool_ids",
            "announced_at",
            "ended_at",
            "cancelled_at",
            "created_by",
            "created_at",
        ]

    def get_state(self, obj: Reservation) -> str:
        return obj.state_at(timezone.now())

    def get_used_gpus(self, obj: Reservation) -> int:
        used = getattr(obj, "used_gpus_now", None)  # annotated by the list's queryset
        return int(used) if used is not None else reservation_used(obj)

    def get_nvlink_domain(self, obj: Reservation) -> dict | None:
        domain = obj.nvlink_domain
        if domain is None:
            return None
        c, q = domain
        return {"cluster_uuid": str(c), "clique_id": q, "label": f"{c}.{q}"}

    def get_announce_at(self, obj: Reservation) -> str | None:
        """:meth:`Reservation.announce_at` (the one rule the announcing sweep applies), written
        as the other times are."""
        when = obj.announce_at()
        return None if when is None else serializers.DateTimeField().to_representation(when)

    def get_nodepool_ids(self, obj: Reservation) -> list[str]:
        return sorted(str(p.id) for p in obj.nodepools.all())


class ReservationCreateSerializer(serializers.Serializer):
    tenant = StrictUUIDField(
        required=False, help_text="operators only: the tenant the reservation is made for"
    )
    name = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        required=False,
        help_text="a DNS label; left out: r- and the first 8 hex digits of its id",
    )
    gpu_model = serializers.CharField(max_length=64, help_text="catalog slug")
    region = serializers.RegexField(ZONE, max_length=64)
    zone = serializers.RegexField(ZONE, max_length=64, required=False, default="")
    gpus = serializers.IntegerField(
        min_value=1,
        max_value=settings.NVKE_RESERVATION_MAX_GPUS,
        required=False,
        default=None,
        help_text="GPUs to reserve; left out with nvlink_domain (every GPU of the domain)",
    )
    nvlink_domain = serializers.CharField(
        max_length=60,
        required=False,
        default="",
        help_text="<clusterUuid>.<cliqueId>: reserve every GPU of this multi-node NVLink domain",
    )
    start = BoundedDateTimeField()
    end = BoundedDateTimeField(required=False, allow_null=True, default=None)
    end_action = serializers.ChoiceField(choices=EndAction.choices, default=EndAction.KEEP)
    notice_lead_s = serializers.IntegerField(
        min_value=0,
        max_value=7 * 86400,
        required=False,
        help_text="seconds before the end when it is announced (default 86400; never in the "
        "reservation's first half: the reservation's announce_at says when)",
    )


class CalendarQuerySerializer(serializers.Serializer):
    gpu_model = serializers.CharField(max_length=64)
    region = serializers.RegexField(ZONE, max_length=64)
    zone = serializers.RegexField(ZONE, max_length=64, required=False, default="")
    start = BoundedDateTimeField(required=False)
    end = BoundedDateTimeField(required=False)


class CalendarIntervalSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    capacity = serializers.IntegerField(help_text="GPUs of the model in the region (or zone)")
    on_demand = serializers.IntegerField(help_text="GPUs held now outside reservations")
    reserved = serializers.IntegerField(help_text="GPUs reserved over this interval")
    free = serializers.IntegerField(help_text="GPUs that could still be reserved here")
    overcommitted = serializers.BooleanField()


class CalendarSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    region = serializers.CharField()
    zone = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    capacity = serializers.IntegerField()
    on_demand = serializers.IntegerField()
    intervals = CalendarIntervalSerializer(many=True)
