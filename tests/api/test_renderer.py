"""The API's renderer (nvke/renderers.py) writes the bytes DRF's JSONRenderer writes."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from ipaddress import ip_address

from django.utils.functional import lazy
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

from nvke.renderers import FastJSONRenderer


def test_it_writes_drfs_bytes_for_every_type_the_api_returns():
    berlin = timezone(timedelta(hours=1))
    data = ReturnDict(
        {
            "id": uuid.UUID("0b4a7e4c-2a1f-4d7e-9a55-6f1b2c3d4e5f"),
            "at": datetime(2026, 12, 2, 7, 31, 7, 123456, tzinfo=UTC),
            "whole": datetime(2026, 12, 2, 7, 31, 7, tzinfo=UTC),
            "local": datetime(2026, 12, 2, 8, 31, 7, 5, tzinfo=berlin),
            "naive": datetime(2026, 12, 2, 7, 31),
            "day": date(2026, 12, 2),
            "clock": time(2, 0),
            "took": timedelta(seconds=90.5),
            "price": Decimal("2.4900"),
            "label": lazy(lambda: "Gerät", str)(),
            "ip": ip_address("10.0.0.1"),
            "text": 'ü "quoted" \\ tab\t nl\n nul\x00 \x1f sep\u2028\u2029 emoji \U0001f600',
            "keys": {2: "int key", None: "none key", True: "bool key"},
            "nested": OrderedDict(b=[1, 2.5, -0.0, None, False], a={}),
            "list": ReturnList([{"x": 1}], serializer=None),
            "big": 2**63 - 1,
            "small": -(2**63),
        },
        serializer=None,
    )
    assert FastJSONRenderer().render(data) == JSONRenderer().render(data)
    # worked by hand for a few of them: microseconds kept, +00:00 written Z, Decimal a float
    body = FastJSONRenderer().render({"at": data["at"], "p": Decimal("2.49"), "s": "\u2028"})
    assert body == b'{"at":"2026-12-02T07:31:07.123456Z","p":2.49,"s":"\\u2028"}'


def test_it_falls_back_to_drf_where_orjson_would_differ():
    # an integer beyond 64 bits (orjson refuses it) and a pretty-printed response
    huge = {"n": 2**70}
    assert (
        FastJSONRenderer().render(huge)
        == JSONRenderer().render(huge)
        == b'{"n":1180591620717411303424}'
    )
    pretty = FastJSONRenderer().render({"a": [1]}, "application/json; indent=2")
    assert pretty == JSONRenderer().render({"a": [1]}, "application/json; indent=2")
    assert pretty == b'{\n  "a": [\n    1\n  ]\n}'
    assert FastJSONRenderer().render(None) == b""


def test_a_pretty_printed_page_of_postgresql_rows_keeps_their_values():
    """Rows written by PostgreSQL (nvke/sql_lists.py) are orjson.Fragment values; the pretty
    path parses them for DRF's encoder, an integer beyond 64 bits staying an integer (it came
    back the float 1e+23) and the key order kept."""
    import orjson

    rows = [orjson.Fragment('{"id" : "x", "n" : 100000000000000000000000, "f" : 1.5}')]
    body = FastJSONRenderer().render({"count": 1, "results": rows}, "application/json; indent=2")
    assert body == (
        b'{\n  "count": 1,\n  "results": [\n    {\n      "id": "x",\n'
        b'      "n": 100000000000000000000000,\n      "f": 1.5\n    }\n  ]\n}'
    )
    assert (
        FastJSONRenderer().render(rows)
        == b'[{"id" : "x", "n" : 100000000000000000000000, "f" : 1.5}]'
    )
