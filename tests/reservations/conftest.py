"""Shared set-up of the reservation tests: a fleet of SIMULATED hosts (tests/conftest.py's
``make_host``: the GPU infrastructure is the only simulated part) and running clusters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import drive_pool, make_cluster

MODEL = "h100-sxm5-80gb"


@pytest.fixture
def h100_fleet(make_host):
    """2 hosts x 8 H100 in us-east-1a: 16 GPUs in region us-east-1."""
    return [make_host(MODEL, gpus=8, zone="us-east-1a") for _ in range(2)]


def reserve(client, gpus, *, start=None, hours=4, **extra):
    start = start or timezone.now()
    body = {
        "gpu_model": MODEL,
        "region": "us-east-1",
        "gpus": gpus,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=hours)).isoformat() if hours else None,
        **extra,
    }
    return client.post("/api/v1/reservations", body, format="json")


def pool_body(name, nodes, gpus=8, **extra):
    return {"name": name, "gpu_model": MODEL, "gpus_per_node": gpus, "node_count": nodes, **extra}


def pool_on_reservation(
    client, *, reserved_gpus: int, nodes: int, gpus_per_node: int, name: str = "train-q4"
) -> tuple[dict, str]:
    """Reserve ``reserved_gpus`` H100s in us-east-1 now (reservation ``name``), create cluster
    ``r`` and its node pool ``trainers`` of ``nodes`` x ``gpus_per_node`` GPUs on the
    reservation, and drive the pool until it converges; returns (the reservation's JSON, the
    pool's id)."""
    reservation = reserve(client, reserved_gpus, name=name).json()
    cluster = make_cluster(client, "r")
    op = client.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        pool_body("trainers", nodes, gpus=gpus_per_node, reservation=reservation["id"]),
        format="json",
    )
    assert op.status_code == 202, op.content
    pool_id = op.json()["target_id"]
    drive_pool(pool_id)
    return reservation, pool_id
