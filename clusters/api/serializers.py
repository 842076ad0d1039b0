"""Cluster and operation serializers."""

from __future__ import annotations

from rest_framework import serializers

from clusters.models import Cluster, Operation
from nvke.lean_lists import LeanListSerializer

DNS_LABEL = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"


class OperationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Operation
        list_serializer_class = LeanListSerializer
        fields = [
            "id",
            "type",
            "target_type",
            "target_id",
            "cluster_id",
            "status",
            "progress",
            "error",
            "requested_by",
            "created_at",
            "started_at",
            "finished_at",
        ]


class ClusterSerializer(serializers.ModelSerializer):
    available_upgrades = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        list_serializer_class = LeanListSerializer
        fields = [
            "id",
            "name",
            "kubernetes_version",
            "control_plane_version",
            "available_upgrades",
            "maintenance_policy",
            "region",
            "provider",
            "phase",
            "conditions",
            "generation",
            "observed_generation",
            "endpoint",
            "created_at",
            "updated_at",
            "deletion_requested_at",
            "deleted_at",
        ]

    #: the columns get_available_upgrades reads (a list page passes ``.values()`` rows)
    UPGRADE_COLUMNS = ("phase", "control_plane_version", "kubernetes_version", "provider")

    def get_available_upgrades(self, cluster: Cluster) -> list[str]:
        """Versions the control plane can be upgraded to now (one minor at a time), of those
        the cluster's provider runs (:func:`clusters.versions.require_supported` refuses the
        others).

        ``cluster`` is a Cluster or a ``.values()`` row with :attr:`UPGRADE_COLUMNS`. The
        supported versions are read once per response (kept in the serializer context, which
        a list's child serializers share): a page of 50 clusters runs one catalog query, not
        50."""
        from catalog.services import supported_kubernetes_versions
        from clusters.versions import available_upgrades

        row = cluster if isinstance(cluster, dict) else None
        phase = row["phase"] if row is not None else cluster.phase
        if phase != "RUNNING":
            return []
        if row is not None:
            current = row["control_plane_version"] or row["kubernetes_version"]
            provider = row["provider"]
        else:
            current = cluster.control_plane_version or cluster.kubernetes_version
            provider = cluster.provider
        # per (version, provider), per page
        offers = self.context.setdefault("_available_upgrades", {})
        if (current, provider) not in offers:
            supported = self.context.get("_supported_kubernetes_versions")
            if supported is None:
                supported = supported_kubernetes_versions()
                self.context["_supported_kubernetes_versions"] = supported
            offers[current, provider] = available_upgrades(
                current, supported=supported, provider=provider
            )
        return list(offers[current, provider])


class ClusterUpdateSerializer(serializers.Serializer):
    kubernetes_version = serializers.RegexField(
        r"^[0-9]+\.[0-9]+(\.[0-9]+)?$",
        max_length=16,
        required=False,
        error_messages={"invalid": "kubernetes_version must look like 1.34 or 1.34.2"},
    )
    maintenance_policy = serializers.JSONField(required=False)


class ClusterCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(
        DNS_LABEL,
        max_length=40,
        error_messages={
            "invalid": "name must be a DNS-1123 label: lower-case letters, digits and '-', "
            "starting with a letter"
        },
    )
    kubernetes_version = serializers.RegexField(
        r"^[0-9]+\.[0-9]+(\.[0-9]+)?$",
        max_length=16,
        error_messages={"invalid": "kubernetes_version must look like 1.34 or 1.34.2"},
    )
    region = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,62}[a-z0-9])?$",
        max_length=64,
        error_messages={"invalid": "region must be lower-case letters, digits and '-'"},
    )
