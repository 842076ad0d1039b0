"""``nvkectl reservations`` and ``nvkectl nodepools create --reservation … --dry-run``: the real
console script (a separate process) against Django's live server and a real Celery worker.

Fleet: 2 SIMULATED hosts x 8 H100 in us-east-1a (tests/conftest.py's ``make_host``). Price
sheet: 2.50 USD per GPU-hour on-demand, 1.75 per reserved GPU-hour. Worked by hand: a
reservation of 8 for 4 h (drain) leaves unreserved pools 16 - 0 - 8 = 8 GPUs; a pool of 1 x 8
on it costs 0.00 per hour more (its usage is covered) and the reservation 8 x 1.75 = 14.00 per
hour; an on-demand pool of 2 x 8 is not placeable (8 of 16 reserved) and would cost
16 x 2.50 = 40.00 per hour.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MODEL = "h100-sxm5-80gb"


def test_reservations_from_the_command_line(live_server, worker, make_host, nvkectl):
    from billing.prices import set_price
    from tenants.services import create_api_key, create_tenant

    for _ in range(2):
        make_host(MODEL, gpus=8, zone="us-east-1a")
    set_price(
        gpu_model=MODEL,
        hourly_rate=Decimal("2.50"),
        reservation_hourly_rate=Decimal("1.75"),
        effective_from=timezone.now() - timedelta(days=1),
    )
    tenant = create_tenant(name="acme")
    key = create_api_key(tenant=tenant, name="cli", role="owner")[1]
    nvkectl("config", "set-context", "demo", "--server", live_server.url, "--api-key", key)
    nvkectl("clusters", "create", "train", "-k", "1.36", "-r", "us-east-1", "--wait")

    now = timezone.now().replace(microsecond=0)
    end = now + timedelta(hours=4)
    made = json.loads(
        nvkectl(
            "reservations",
            "create",
            "--gpu-model",
            MODEL,
            "--region",
            "us-east-1",
            "--gpus",
            "8",
            "--start",
            now.isoformat(),
            "--end",
            end.isoformat(),
            "--end-action",
            "drain",
            "-o",
            "json",
        ).stdout
    )
    assert (made["gpus"], made["state"], made["end_action"]) == (8, "ACTIVE", "drain")
    rid = made["id"]
    listed = list(csv.DictReader(io.StringIO(nvkectl("reservations", "list", "-o", "csv").stdout)))
    assert [(r["id"], r["gpus"], r["state"]) for r in listed] == [(rid, "8", "ACTIVE")]
    assert rid in nvkectl("reservations", "get", rid).stdout
    # a second 9 do not fit beside the 8: the API's 409 as one line, exit 1
    refused = nvkectl(
        "reservations",
        "create",
        "--gpu-model",
        MODEL,
        "-r",
        "us-east-1",
        "--gpus",
        "9",
        "--start",
        now.isoformat(),
        "--end",
        end.isoformat(),
        expect=1,
    )
    assert "(reservation_capacity, HTTP 409)" in refused.stderr

    cal = json.loads(
        nvkectl(
            "reservations",
            "calendar",
            "--gpu-model",
            MODEL,
            "--region",
            "us-east-1",
            "--from",
            now.isoformat(),
            "--to",
            (now + timedelta(hours=6)).isoformat(),
            "-o",
            "json",
        ).stdout
    )
    assert (cal["capacity"], cal["on_demand"]) == (16, 0)
    assert [(i["reserved"], i["free"]) for i in cal["intervals"]] == [(8, 8), (0, 16)]

    # pool "p" of cluster train: 1 node x 8 GPUs on the reservation
    pool_on_reservation = (
        *("nodepools", "create", "train", "p", "--gpu-model", MODEL),
        *("--gpus-per-node", "8", "--nodes", "1", "--reservation", rid),
    )
    on_res = nvkectl(*pool_on_reservation, "--dry-run").stdout
    # the verdict once, the reservation by its default name and id (r- + its first 8 hex)
    name = "r-" + rid.replace("-", "")[:8]
    assert made["name"] == name
    assert f"capacity: placeable now on reservation {name} ({rid})" in on_res
    assert "needed 8 GPU(s), free 8, reservation of 8, held by other reservations 0" in on_res
    assert "left after 504" in on_res  # 512 - 8
    assert "cost: 0.00 USD per hour (its 8 GPU-h per hour are covered by the reservation)" in on_res
    assert (
        "the reservation itself: 14.00 USD/h at 1.75 per reserved GPU-hour, billed whether "
        "used or not"
    ) in on_res
    on_demand = json.loads(
        nvkectl(
            "nodepools",
            "create",
            "train",
            "q",
            "--gpu-model",
            MODEL,
            "--gpus-per-node",
            "8",
            "--nodes",
            "2",
            "--dry-run",
            "-o",
            "json",
        ).stdout
    )
    assert (on_demand["capacity"]["placeable_now"], on_demand["capacity"]["free_gpus"]) == (
        False,
        8,
    )
    assert Decimal(str(on_demand["cost"]["hourly"])) == Decimal("40.00")
    text = nvkectl(
        "nodepools",
        "create",
        "train",
        "q",
        "--gpu-model",
        MODEL,
        "--gpus-per-node",
        "8",
        "--nodes",
        "2",
        "--dry-run",
    ).stdout
    assert "capacity: NOT placeable now" in text and "8 of 16 GPU(s) are reserved" in text

    # the pool on the reservation for real, then the cancel drains it
    nvkectl(*pool_on_reservation, "--wait")
    assert json.loads(nvkectl("reservations", "get", rid, "-o", "json").stdout)["used_gpus"] == 8
    said = nvkectl("reservations", "cancel", rid).stdout
    assert said.startswith(f"reservation {rid} CANCELLED at ")
    again = nvkectl("reservations", "cancel", rid, expect=1)
    assert "(reservation_cancelled, HTTP 409)" in again.stderr
    pool = json.loads(nvkectl("nodepools", "get", "train", "p", "-o", "json").stdout)
    assert pool["node_count"] == 0
