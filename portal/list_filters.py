"""The FilterSets of the portal's lists (clusters, a cluster's node pools and operations,
members).

Choice filters are offered the values the caller's rows hold (:func:`portal.listing.choices_of`
on the already scoped queryset); sorting goes through django-filter's ``OrderingFilter``
(:class:`portal.listing.SortFilter`) on a fixed set of columns (``?sort=name``,
``?sort=-created_at``).
"""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from portal.listing import SearchFilter, SortFilter, choices_of


class _ScopedChoices(django_filters.FilterSet):
    """A FilterSet whose ``choice_fields`` take their choices from the queryset it filters."""

    choice_fields: tuple[str, ...] = ()

    def __init__(self, data=None, queryset: QuerySet | None = None, **kwargs) -> None:
        super().__init__(data, queryset=queryset, **kwargs)
        for name in self.choice_fields:
            field = self.filters[name].field
            values = choices_of(self.queryset, self.filters[name].field_name)
            field.choices = values  # django-filter puts its empty choice ("any") first
        # after the choices: the form copies its fields when first built
        self.form.auto_id = "filter_%s"  # never the ids of the page's other forms


class ClusterFilter(_ScopedChoices):
    q = SearchFilter(search_fields=("name", "region", "kubernetes_version"))
    phase = django_filters.ChoiceFilter(choices=[], empty_label="any")
    region = django_filters.ChoiceFilter(choices=[], empty_label="any")
    kubernetes_version = django_filters.ChoiceFilter(
        choices=[], empty_label="any", label="Kubernetes"
    )
    sort = SortFilter(
        fields=(
            ("name", "name"),
            ("phase", "phase"),
            ("region", "region"),
            ("created_at", "created_at"),
        ),
    )
    choice_fields = ("phase", "region", "kubernetes_version")


class MemberFilter(_ScopedChoices):
    q = SearchFilter(search_fields=("user__username", "user__email"))
    role = django_filters.ChoiceFilter(choices=[], empty_label="any")
    sort = SortFilter(
        fields=(("user__username", "username"), ("role", "role"), ("created_at", "created_at")),
    )
    choice_fields = ("role",)


class NodePoolFilter(_ScopedChoices):
    """A cluster's node pools: search name, GPU model, Kubernetes version; filter phase and
    GPU model (the values the cluster's pools hold); sort name, phase, size, creation."""

    q = SearchFilter(search_fields=("name", "gpu_model__name", "kubernetes_version"))
    phase = django_filters.ChoiceFilter(choices=[], empty_label="any")
    gpu_model = django_filters.ChoiceFilter(
        field_name="gpu_model__name", choices=[], empty_label="any", label="GPU model"
    )
    sort = SortFilter(
        fields=(
            ("name", "name"),
            ("phase", "phase"),
            ("gpu_model__name", "gpu_model"),
            ("node_count", "nodes"),
            ("created_at", "created_at"),
        ),
    )
    choice_fields = ("phase", "gpu_model")


class OperationFilter(_ScopedChoices):
    """A cluster's operations: search type, status, requester; filter type and status (the
    values its operations hold); sort type, status, creation, finish."""

    q = SearchFilter(search_fields=("type", "status", "requested_by"))
    type = django_filters.ChoiceFilter(choices=[], empty_label="any")
    status = django_filters.ChoiceFilter(choices=[], empty_label="any")
    sort = SortFilter(
        fields=(
            ("type", "type"),
            ("status", "status"),
            ("created_at", "created_at"),
            ("finished_at", "finished_at"),
        ),
    )
    choice_fields = ("type", "status")
