"""A lean read path for list pages: the same JSON as DRF's ``ModelSerializer``, without its
per-row, per-field machinery (issue 15: lists at framework speed).

DRF serializes a page of 50 rows of 12-23 fields by calling, for every field of every row,
``field.get_attribute`` (a generic attribute walk with callable checks and error handling) and
``field.to_representation`` (for a datetime: a timezone lookup through ``asgiref.Local``, then
``astimezone`` and ``isoformat``); that was 60-70 % of a list request's CPU time. Here a
serializer class is read once into a *plan* (one step per readable field: how to get the
value, how to convert it) and each row is built with plain attribute reads and the cheapest
conversion that gives **the same value DRF gives**:

* a model field read as itself (``source`` is one attribute that is a concrete model field or
  its ``attname``): ``getattr``; otherwise the field's own ``get_attribute`` (dotted sources,
  defaults, ``SkipField``);
* ``UUIDField`` (hex_verbose) -> ``str``; ``CharField`` -> ``str``; ``IntegerField`` -> ``int``;
  ``ChoiceField`` -> the choice whose string is ``str(value)`` (DRF's lookup);
  ``JSONField`` (not binary) and ``ReadOnlyField`` -> the value; ``ListField`` of ``CharField``
  -> a list of ``str``; ``DateTimeField`` (ISO 8601, no field timezone) of an aware datetime ->
  ``astimezone(current timezone).isoformat()`` with ``+00:00`` written ``Z``, as DRF writes it;
* ``SerializerMethodField`` -> the method of the serializer serializing the page (its
  ``context`` is the page's); anything else -> the field's own ``to_representation``.

``None`` stays ``None`` without conversion, as in DRF. Use it by naming
:class:`LeanListSerializer` as ``Meta.list_serializer_class``: single objects still go through
DRF, the OpenAPI schema is the serializer's (the list class is not part of it), and
``tests/api/test_lean_lists.py`` compares the bytes of every list with DRF's own output.

Limits: fields other than method fields are the plan's *prototype* instances (built once per
class), so a field whose ``to_representation`` reads ``context`` or ``parent`` (hyperlinked
fields) must not be on a lean-listed serializer; :func:`plan_for` refuses the related-field
classes that do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone
from rest_framework import fields as f
from rest_framework import relations, serializers
from rest_framework.settings import api_settings

_PLANS: dict[type, list[tuple[str, str, Any, Any]]] = {}
_SKIP = object()


def _iso(tz):
    def convert(value):
        if isinstance(value, str) or getattr(value, "tzinfo", None) is None:
            return _SKIP  # naive or text: DRF's own path (make_aware / as is)
        try:
            text = value.astimezone(tz).isoformat()
        except OverflowError:
            return _SKIP  # DRF's own error
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    return convert


def _converter(field: f.Field) -> tuple[str, Any]:
    """``(kind, payload)`` for one prototype field; kinds: id, str, int, choice, list_str, iso,
    call (the field's own ``to_representation``)."""
    kind = type(field)
    if kind in (f.JSONField,) and not field.binary:
        return "id", None
    if kind is f.ReadOnlyField:
        return "id", None
    if kind is f.UUIDField and field.uuid_format == "hex_verbose":
        return "str", None
    if kind is f.CharField:
        return "str", None
    if kind is f.IntegerField:
        return "int", None
    if kind is f.ChoiceField:
        return "choice", field.choice_strings_to_values
    if (
        kind is f.ListField
        and type(field.child) is f.CharField  # exact class: subclasses may differ
    ):
        return "list_str", None
    if (
        kind is f.DateTimeField
        and getattr(field, "format", api_settings.DATETIME_FORMAT) is not None
        and str(getattr(field, "format", api_settings.DATETIME_FORMAT)).lower() == f.ISO_8601
        and not hasattr(field, "timezone")
    ):
        return "iso", field
    return "call", field


def plan_for(serializer_class: type[serializers.Serializer]) -> list[tuple[str, str, Any, Any]]:
    """The plan of a serializer class, built once: ``[(name, getter kind, getter, (conv kind,
    payload))]``; getter kinds ``attr`` ((model attribute name, field)), ``field`` (the
    prototype field's ``get_attribute``) and ``method`` (a method name of the serializer).

    Raises ``TypeError`` for a related field (it reads the request from ``context``)."""
    plan = _PLANS.get(serializer_class)
    if plan is not None:
        return plan
    proto = serializer_class()
    meta = getattr(serializer_class, "Meta", None)
    model = getattr(meta, "model", None)
    attrs: set[str] = set()
    if model is not None:
        for mf in model._meta.concrete_fields:
            attrs.update({mf.name, mf.attname})
            if mf.is_relation:
                attrs.discard(mf.name)  # the related object: a query or a cached row, not data
    plan = []
    for field in proto._readable_fields:
        if isinstance(field, (relations.RelatedField, relations.ManyRelatedField)):
            raise TypeError(f"{serializer_class.__name__}.{field.field_name}: a related field")
        if isinstance(field, f.SerializerMethodField):
            plan.append((field.field_name, "method", field.method_name, ("id", None)))
            continue
        attrs_ok = len(field.source_attrs) == 1 and field.source_attrs[0] in attrs
        getter = ("attr", (field.source_attrs[0], field)) if attrs_ok else ("field", field)
        plan.append((field.field_name, *getter, _converter(field)))
    _PLANS[serializer_class] = plan
    return plan


def row_builder(serializer: serializers.Serializer) -> Callable[[Any], dict]:
    """A function ``row -> dict`` equal to ``serializer.to_representation(row)``; a row is a
    model instance or a ``.values()`` dict (a dotted source ``host.hostname`` is then the key
    ``host__hostname``). The steps are compiled once per (class, current timezone); method
    fields are bound to ``serializer``, so they see its ``context``."""
    tz = timezone.get_current_timezone() if settings.USE_TZ else None
    key = (type(serializer), tz)
    compiled = _STEPS.get(key)
    if compiled is None:
        compiled = _STEPS[key] = _compile(type(serializer), tz)
    steps, methods = compiled
    if methods:
        steps = [
            (name, getattr(serializer, getter) if is_method else getter, conv, field)
            for name, getter, conv, field, is_method in methods
        ]

    def build(row: Any) -> dict:
        out = {}
        for name, getter, conv, field in steps:
            try:
                value = getter(row)
            except f.SkipField:
                continue
            if value is None or conv is None:
                out[name] = value
                continue
            got = conv(value)
            out[name] = field.to_representation(value) if got is _SKIP else got
        return out

    return build


_STEPS: dict[tuple[type, Any], tuple[list, list]] = {}


def _compile(serializer_class: type, tz: Any) -> tuple[list, list]:
    """``(steps, steps with method names)``: the second is empty when no field is a method."""
    iso = _iso(tz) if settings.USE_TZ else None
    steps: list[tuple[str, Any, Callable[[Any], Any] | None, Any, bool]] = []
    for name, gkind, gpayload, (ckind, cpayload) in plan_for(serializer_class):
        if gkind == "method":
            getter: Any = gpayload  # bound per page in row_builder
        elif gkind == "attr":
            getter = _attr(gpayload[0], gpayload[1])
        else:
            getter = _field_getter(gpayload)
        conv: Callable[[Any], Any] | None
        if ckind == "id":
            conv = None
        elif ckind == "str":
            conv = str
        elif ckind == "int":
            conv = int
        elif ckind == "list_str":
            conv = _list_str
        elif ckind == "choice":
            conv = _choice(cpayload)
        elif ckind == "iso" and iso is not None:
            conv = iso
        else:
            conv = cpayload.to_representation
        steps.append((name, getter, conv, cpayload, gkind == "method"))
    if any(step[4] for step in steps):
        return [], steps
    return [step[:4] for step in steps], []


def _attr(name: str, field: f.Field) -> Callable[[Any], Any]:
    def get(row: Any) -> Any:
        if type(row) is dict:
            return row[name] if name in row else field.get_attribute(row)
        return getattr(row, name)

    return get


def _field_getter(field: f.Field) -> Callable[[Any], Any]:
    key = "__".join(field.source_attrs)

    def get(row: Any) -> Any:
        if type(row) is dict and key in row:
            return row[key]
        return field.get_attribute(row)

    return get


def _choice(mapping: dict[str, Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        # DRF: '' as is, else the choice whose string is str(value), else the value
        return value if value == "" else mapping.get(str(value), value)

    return convert


def _list_str(values: Iterable[Any]) -> list:
    return [None if v is None else str(v) for v in values]


class LeanListSerializer(serializers.ListSerializer):
    """``many=True`` of a serializer through its plan (same output as DRF, less CPU)."""

    def to_representation(self, data):  # type: ignore[override]
        rows = data.all() if isinstance(data, models.manager.BaseManager) else data
        build = row_builder(self.child)
        return [build(row) for row in rows]


def value_columns(
    serializer_class: type[serializers.Serializer],
    method_columns: dict[str, tuple[str, ...]] | None = None,
) -> list[str]:
    """The ``.values()`` columns a page of ``serializer_class`` reads: each field's source
    (``a.b`` as ``a__b``), and for a method field the columns ``method_columns`` names for it
    (the method must read a row dict's keys as it reads an instance's attributes). Raises
    ``TypeError`` for a method field ``method_columns`` does not name."""
    columns: list[str] = []
    for name, gkind, gpayload, _conv in plan_for(serializer_class):
        if gkind == "method":
            if method_columns is None or name not in method_columns:
                raise TypeError(f"{serializer_class.__name__}.{name}: name the columns it reads")
            columns.extend(c for c in method_columns[name] if c not in columns)
            continue
        field = gpayload[1] if gkind == "attr" else gpayload
        column = "__".join(field.source_attrs)
        if column not in columns:
            columns.append(column)
    return columns
