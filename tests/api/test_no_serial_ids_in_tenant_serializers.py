"""No tenant route serializes a serial primary key (issue 26, item 5 leftover; the rule is in
nvke/public_ids.py). Walks every route ``test_route_isolation.ROUTES`` classes as a tenant's and
every serializer its view declares (nested ones too): no field may show an ``AutoField`` /
``BigAutoField`` — the model's own ``id``, or a foreign key's ``*_id`` to such a table. Views that
build dicts themselves (usage, utilization, CSV) are covered by the behaviour tests
(tests/billing/test_no_global_serials.py, tests/portal/test_audit_public_ids.py)."""

from __future__ import annotations

import pytest
from django.db import models
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework import serializers

from tests.api.test_route_isolation import ROUTES

TENANT_KINDS = {"tenant-list", "tenant-detail", "tenant-write", "catalog"}
SERIAL = (models.AutoField, models.BigAutoField, models.SmallAutoField)


def tenant_views():
    out = {}

    def walk(patterns):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns)
            elif isinstance(p, URLPattern) and ROUTES.get(p.name) in TENANT_KINDS:
                view = getattr(p.callback, "cls", None) or getattr(p.callback, "view_class", None)
                if view is not None:
                    out[p.name] = view

    walk(get_resolver().url_patterns)
    return out


def serializer_classes(view) -> set[type]:
    found = set()
    for name in dir(view):
        if "serializer" not in name or name.startswith("get_"):
            continue
        value = getattr(view, name, None)
        if isinstance(value, type) and issubclass(value, serializers.BaseSerializer):
            found.add(value)
    return found


def serial_fields(serializer_class, path="") -> list[str]:
    """``["Serializer.field"]`` for each field showing a serial primary key."""
    try:
        serializer = serializer_class()
    except TypeError:
        return []
    model = getattr(getattr(serializer_class, "Meta", None), "model", None)
    bad = []
    for name, field in serializer.fields.items():
        where = f"{path}{serializer_class.__name__}.{name}"
        if isinstance(field, serializers.ListSerializer):
            bad += serial_fields(type(field.child), f"{where}>")
            continue
        if isinstance(field, serializers.BaseSerializer):
            bad += serial_fields(type(field), f"{where}>")
            continue
        if model is None or field.source in ("*", None) or "." in field.source:
            continue
        try:
            model_field = model._meta.get_field(field.source.removesuffix("_id"))
        except Exception:  # a method field, a property: its own business
            continue
        # the row's own serial, or a foreign key to a table numbered by one
        target = model_field.target_field if isinstance(model_field, models.ForeignKey) else None
        if isinstance(model_field, SERIAL) or isinstance(target, SERIAL):
            bad.append(where)
    return bad


def test_the_walk_finds_the_tenant_serializers():
    views = tenant_views()
    assert {"ledger-list", "audit-event-list", "webhook-delivery-list", "operation-list"} <= set(
        views
    )
    names = {s.__name__ for v in views.values() for s in serializer_classes(v)}
    assert {"LedgerEntrySerializer", "AuditEventSerializer", "OperationSerializer"} <= names


@pytest.mark.parametrize("route", sorted(tenant_views()))
def test_no_tenant_serializer_shows_a_serial_id(route):
    view = tenant_views()[route]
    bad = [b for s in serializer_classes(view) for b in serial_fields(s)]
    assert bad == [], f"{route}: serial ids shown to tenants (use a public_id): {bad}"
