"""List pages whose rows PostgreSQL writes as JSON (issue 15: lists at framework speed).

The lean path (``nvke/lean_lists.py``) already skips DRF's per-field walk, but a page of 50
node pools with their 100 nodes still spent most of its CPU time in Python turning database
values into objects and back: psycopg parsing ~200 timestamps and ~300 UUIDs, Django's
``JSONField.from_db_value`` running ``json.loads`` ~450 times, dicts built per row, then the
same values converted and encoded again. Measured in-process on the 2-core machine: reading
the page of pools as ``.values()`` took 2.6 ms where the same SQL read as one JSON text per row
took 0.1 ms. Here the serializer class is read once into SQL expressions — one
``JSON_BUILD_OBJECT`` per row, the serializer's fields in its order — and each row reaches
Python as one string, wrapped in :class:`orjson.Fragment` and written into the response as is.

The SQL is text built once per serializer class (quoted with the connection's
``quote_name``, from model metadata only, never from input) and added as ``RawSQL``: the same
page built from Django expressions (``Func``/``Cast``/``Subquery``) spent about as much CPU
copying and compiling the expression tree per request as the rows had cost.

Each field's SQL gives the value DRF gives (``tests/api/test_lean_lists.py`` compares every
list with DRF's own output, parsed, key order included; ``tests/api/test_sql_lists.py`` checks
values worked out by hand):

* UUID, text and choice columns (also through a nullable foreign key: ``host.hostname`` with
  ``default=None``): the text; integer and boolean columns: the number / ``true``/``false``;
  ``JSONField`` columns: the stored document, embedded; an ``ArrayField`` of text: an array of
  strings;
* ``DateTimeField`` (ISO 8601, no field timezone): DRF writes ``astimezone(current).isoformat()``
  with ``+00:00`` as ``Z``; the SQL writes ``YYYY-MM-DDTHH:MM:SS``, ``.ffffff`` only when the
  microseconds are not 0 (as ``isoformat``), and ``Z``. So this path serves only while the
  current timezone is UTC (NVKE's API always is: ``TIME_ZONE = "UTC"``, nothing activates
  another); otherwise, and for any field it has no SQL for, the caller uses the lean path;
* a ``SerializerMethodField``: computed in Python per row from the columns the caller names,
  its JSON spliced between the SQL-written parts, in the serializer's field order;
* a nested list of a child ``ModelSerializer``: given by the caller as a :class:`Nested`
  subquery (the node pool page's nodes: ``nodepools/api/views.py``).

What differs from DRF's bytes: the whitespace PostgreSQL writes (``"key" : value``, ``, ``;
inside stored JSON ``": "``), and a stored JSON number is written as PostgreSQL keeps it
(``1e16`` is ``10000000000000000``). Clients parse JSON; the values and the key order are
DRF's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import FieldDoesNotExist
from django.db import connection, models
from django.db.models.expressions import RawSQL
from django.utils import timezone
from rest_framework import fields as f
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.settings import api_settings

from .lean_lists import plan_for
from .renderers import dumps

_TEXT = {"CharField", "TextField", "SlugField", "UUIDField", "EmailField", "URLField"}
_INT = {
    "IntegerField",
    "BigIntegerField",
    "SmallIntegerField",
    "PositiveIntegerField",
    "PositiveSmallIntegerField",
    "PositiveBigIntegerField",
    "AutoField",
    "BigAutoField",
    "SmallAutoField",
}
#: json_build_object takes at most 100 arguments (PostgreSQL's FUNC_MAX_ARGS): 50 fields
_MAX_FIELDS = 50

#: a timestamptz as DRF writes it in UTC: 2026-12-02T13:33:56.123456Z, the fraction only when
#: the microseconds are not 0 (datetime.isoformat); NULL stays NULL
_DRF_DATETIME = (
    "CASE WHEN {c} IS NULL THEN NULL ELSE "
    "TO_CHAR({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || "
    "CASE WHEN DATE_TRUNC('second', {c}) = {c} THEN '' "
    "ELSE TO_CHAR({c} AT TIME ZONE 'UTC', '.US') END || 'Z' END"
)


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class Nested:
    """A nested list field (a ``ListSerializer`` of a child ``ModelSerializer``) written by
    PostgreSQL: the rows of the child's model whose foreign key ``fk`` (a field name) points
    at the row, as a JSON array of the child serializer's objects, ordered by ``ordering``
    (column names of the child's model) and kept where ``where`` holds: SQL with ``{row}``
    for the child's table and ``{parent}`` for the parent's (static text, never input)."""

    serializer_class: type[serializers.ModelSerializer]
    fk: str
    ordering: tuple[str, ...]
    where: str = "TRUE"

    def sql(self, parent: str) -> str | None:
        """The subquery's SQL for the parent table ``parent``, or None (a child field has no
        SQL here)."""
        model = self.serializer_class.Meta.model
        alias = _q("_nested_" + model._meta.db_table)
        plan = sql_plan(self.serializer_class, alias=alias)
        if plan is None or plan.method_names or len(plan.segments) != 1:
            return None  # a method field, or more fields than one JSON_BUILD_OBJECT takes
        (fields,) = plan.segments
        fk = model._meta.get_field(self.fk)
        order = ", ".join(f"{alias}.{_q(model._meta.get_field(o).column)}" for o in self.ordering)
        where = self.where.format(row=alias, parent=_q(parent))
        return (
            f"(SELECT COALESCE(JSON_AGG({_object(fields)} ORDER BY {order}), '[]'::json) "
            f"FROM {_q(model._meta.db_table)} {alias} WHERE {alias}.{_q(fk.column)} = "
            f"{_q(parent)}.{_q(fk.target_field.column)} AND ({where}))"
        )


@dataclass(frozen=True)
class SqlPlan:
    """``segments``: the SQL-written fields as lists of ``(name, SQL)`` pairs, and between
    them the method fields as ``(name, method name)`` tuples, in the serializer's order."""

    segments: list[Any]

    @property
    def method_names(self) -> list[str]:
        """The method fields' names, in order."""
        return [s[0] for s in self.segments if isinstance(s, tuple)]

    def objects_sql(self) -> list[str]:
        """One ``JSON_BUILD_OBJECT(...)::text`` per SQL segment."""
        return [_object(s) + "::text" for s in self.segments if isinstance(s, list)]


def _object(fields: list[tuple[str, str]]) -> str:
    return "JSON_BUILD_OBJECT(" + ", ".join(f"{_literal(n)}, {sql}" for n, sql in fields) + ")"


_PLANS: dict[tuple, SqlPlan | None] = {}


def sql_plan(
    serializer_class: type[serializers.ModelSerializer],
    nested: dict[str, Nested] | None = None,
    *,
    alias: str | None = None,
) -> SqlPlan | None:
    """The plan of ``serializer_class`` (built once), or None when a field has no SQL here
    (module docstring): the caller then serves the page through the lean path. ``nested``
    gives nested list fields by name; ``alias`` is the (quoted) name the row's table goes
    by, its table name by default."""
    key = (serializer_class, tuple(sorted((nested or {}).items(), key=str)), alias)
    if key in _PLANS:
        return _PLANS[key]
    model = serializer_class.Meta.model
    table = model._meta.db_table
    alias = alias or _q(table)
    segments: list[Any] = []
    plan: SqlPlan | None = SqlPlan(segments)
    for name, gkind, gpayload, _conv in plan_for(serializer_class):
        if gkind == "method":
            segments.append((name, gpayload))
            continue
        field = gpayload[1] if gkind == "attr" else gpayload
        inner = (nested or {}).get(name)
        sql = inner.sql(table) if inner is not None else _field_sql(field, model, alias)
        if sql is None:
            plan = None
            break
        if not segments or isinstance(segments[-1], tuple) or len(segments[-1]) >= _MAX_FIELDS:
            segments.append([])
        segments[-1].append((name, sql))
    _PLANS[key] = plan
    return plan


def _model_fields(model: type[models.Model], path: list[str]) -> list[models.Field] | None:
    """The concrete model fields ``path`` walks (``["host", "hostname"]``: the foreign key,
    then the host's column), or None for a reverse relation, a many-to-many, an unknown name,
    or a path ending on a related object."""
    walked = []
    for i, part in enumerate(path):
        try:
            field = model._meta.get_field(part)
        except FieldDoesNotExist:
            return None
        if not getattr(field, "concrete", False) or field.many_to_many:
            return None
        if i < len(path) - 1:
            if not field.many_to_one:
                return None
            model = field.related_model
        elif field.is_relation and part != field.attname:
            return None  # the related object itself: DRF would render the instance
        walked.append(field)
    return walked


def _internal_type(field: models.Field) -> str:
    if field.is_relation:
        return field.target_field.get_internal_type()
    return field.get_internal_type()


def _column_sql(walked: list[models.Field], alias: str) -> str:
    """The column at the end of ``walked`` for a row of ``alias``: through a foreign key a
    scalar subquery (NULL where the key is NULL)."""
    if len(walked) == 1:
        return f"{alias}.{_q(walked[0].column)}"
    fk, rest = walked[0], walked[1:]
    table = fk.related_model._meta.db_table
    inner = _q(f"_{table}_{len(walked)}")
    return (
        f"(SELECT {_column_sql(rest, inner)} FROM {_q(table)} {inner} "
        f"WHERE {inner}.{_q(fk.target_field.column)} = {alias}.{_q(fk.column)})"
    )


def _field_sql(field: f.Field, model: type[models.Model], alias: str) -> str | None:
    """SQL giving the JSON value DRF gives for a prototype ``field``, or None."""
    walked = _model_fields(model, list(field.source_attrs))
    if walked is None:
        return None
    if len(walked) > 1 and not (field.default is None or field.allow_null):
        return None  # DRF would skip the key when the related row is missing
    mf, column = walked[-1], _column_sql(walked, alias)
    kind, it = type(field), _internal_type(walked[-1])
    if kind is f.JSONField and not field.binary and it == "JSONField":
        return column
    if kind is f.ReadOnlyField:  # the model value as the renderer writes it
        if it in ("JSONField", "BooleanField", *_INT):
            return column
        if it in _TEXT:
            return f"({column})::text"
        return _DRF_DATETIME.format(c=column) if it == "DateTimeField" else None
    if kind is f.UUIDField and field.uuid_format == "hex_verbose" and it == "UUIDField":
        return f"({column})::text"
    if kind in (f.CharField, f.ChoiceField) and it in _TEXT:
        return f"({column})::text"
    if kind is f.IntegerField and it in _INT:
        return column
    if kind is f.BooleanField and it == "BooleanField":
        return column
    if (
        kind is f.ListField
        and type(field.child) is f.CharField
        and it == "ArrayField"
        and _internal_type(mf.base_field) in _TEXT
    ):
        return f"({column})::text[]"
    if (
        kind is f.DateTimeField
        and it == "DateTimeField"
        and str(getattr(field, "format", api_settings.DATETIME_FORMAT)).lower() == f.ISO_8601
        and not hasattr(field, "timezone")
    ):
        return _DRF_DATETIME.format(c=column)
    return None


def usable(plan: SqlPlan | None) -> bool:
    """Whether a page can be served by ``plan`` now: a plan, and the current timezone UTC
    (the SQL writes datetimes in UTC, as DRF does only then)."""
    if plan is None or not settings.USE_TZ:
        return False
    return timezone.get_current_timezone_name() == "UTC"


def json_rows(queryset, plan: SqlPlan, method_columns: tuple[str, ...] = ()):
    """``queryset`` as ``values_list`` rows: one JSON text per SQL segment of ``plan``, then
    ``method_columns`` (what the method fields read)."""
    annotations = {
        f"_json{i}": RawSQL(sql, (), output_field=models.TextField())
        for i, sql in enumerate(plan.objects_sql())
    }
    return queryset.annotate(**annotations).values_list(*annotations, *method_columns)


def row_renderer(
    plan: SqlPlan, serializer: serializers.Serializer, method_columns: tuple[str, ...] = ()
) -> Callable[[tuple], orjson.Fragment]:
    """A function ``row -> orjson.Fragment`` of one :func:`json_rows` row: the SQL-written
    objects joined, each method field's value (the method of ``serializer``, so it sees its
    ``context``, given a dict of ``method_columns``) spliced in its place."""
    if not plan.method_names:
        if len(plan.segments) == 1:
            return lambda row: orjson.Fragment(row[0])
        return lambda row: orjson.Fragment("{" + ",".join(t[1:-1] for t in row) + "}")
    n_json = sum(1 for s in plan.segments if isinstance(s, list))
    steps: list[Any] = []  # the key's JSON and the bound method, or None for a JSON text
    for seg in plan.segments:
        if isinstance(seg, tuple):
            steps.append((orjson.dumps(seg[0]).decode() + ":", getattr(serializer, seg[1])))
        else:
            steps.append(None)

    def render(row: tuple) -> orjson.Fragment:
        values = dict(zip(method_columns, row[n_json:], strict=True))
        parts, i = [], 0
        for step in steps:
            if step is None:
                inner = row[i][1:-1]
                i += 1
                if inner.strip():
                    parts.append(inner)
            else:
                parts.append(step[0] + dumps(step[1](values)).decode())
        return orjson.Fragment("{" + ",".join(parts) + "}")

    return render


def list_response(
    view,
    serializer_class: type[serializers.ModelSerializer],
    *,
    method_columns: tuple[str, ...] = (),
    nested: dict[str, Nested] | None = None,
    on_page: Callable[[list], None] | None = None,
) -> Response | None:
    """The list response of ``view`` (its filtered, scoped queryset, paginated as the view
    paginates) with rows written by PostgreSQL, or None when :func:`usable` says no (the
    caller then serves the lean path). ``on_page`` is called with the page's rows before they
    are rendered (the node pool page's check of an empty page)."""
    plan = sql_plan(serializer_class, nested)
    if not usable(plan):
        return None
    assert plan is not None
    queryset = json_rows(view.filter_queryset(view.get_queryset()), plan, method_columns)
    page = view.paginate_queryset(queryset)
    rows = list(queryset) if page is None else page
    if on_page is not None:
        on_page(rows)
    render = row_renderer(plan, view.get_serializer(), method_columns)
    data = [render(row) for row in rows]
    return Response(data) if page is None else view.get_paginated_response(data)
