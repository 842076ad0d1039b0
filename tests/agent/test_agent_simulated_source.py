"""The ``simulated`` source: reads a SIMULATED host's state file (the shape written by
``clusters/providers/simhosts.py``) the way the ``nvml`` source reads NVML. Plain Python, no
Django (the agent package is standalone)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nvke_agent.agent import Agent
from nvke_agent.client import ApiClient, Backoff
from nvke_agent.sources import open_source
from nvke_agent.sources.base import SourceError, SourceUnavailable
from nvke_agent.spool import Spool
from nvke_agent.state import StateStore

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def state(**changes) -> dict:
    """A 1-GPU H100 host with MIG on: two 3g.40gb instances at memory slices 0 and 4."""
    base = {
        "driver_version": "580.95.05",
        "cuda_version": "13.0",
        "nvml_error": "",
        "gpus": [
            {
                "uuid": "GPU-sim-1",
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": "00000000:18:00.0",
                "memory_total_bytes": 80 * 2**30,
                "mig_mode": "enabled",
                "mig_mode_pending": "enabled",
                "instances": [
                    {
                        "profile": "3g.40gb",
                        "start": 0,
                        "size": 4,
                        "gpu_instance_id": 1,
                        "uuid": "MIG-a",
                        "memory_total_bytes": 40 * 2**30,
                    },
                    {
                        "profile": "3g.40gb",
                        "start": 4,
                        "size": 4,
                        "gpu_instance_id": 2,
                        "uuid": "MIG-b",
                        "memory_total_bytes": 40 * 2**30,
                    },
                ],
                "health": {"remapped_rows_pending": True, "ecc_volatile_uncorrected": 0},
            }
        ],
        "events": [
            {
                "id": 1,
                "ts": "2026-01-01T11:00:00Z",
                "gpu_uuid": "GPU-sim-1",
                "type": "xid",
                "xid": 95,
                "message": "old",
            }
        ],
    }
    base.update(changes)
    return base


def write(path: Path, body: dict) -> Path:
    path.write_text(json.dumps(body))
    return path


def test_it_reports_mig_instances_with_profile_and_placement_and_the_health_counters(tmp_path):
    source = open_source("simulated", sim_state=str(write(tmp_path / "h.json", state())))
    inventory = source.inventory()
    assert inventory["driver_version"] == "580.95.05"
    (gpu,) = inventory["gpus"]
    assert gpu["mig_mode"] == "enabled"
    assert [
        (d["profile"], d["placement_start"], d["placement_size"], d["gpu_instance_id"])
        for d in gpu["mig_devices"]
    ] == [("3g.40gb", 0, 4, 1), ("3g.40gb", 4, 4, 2)]
    assert gpu["health"]["remapped_rows_pending"] is True
    assert gpu["health"]["mig_mode_pending"] == "enabled"
    samples = source.collect(NOW)
    assert [(s["gpu_uuid"], s["mig_gpu_instance_id"]) for s in samples] == [
        ("GPU-sim-1", None),
        ("GPU-sim-1", 1),
        ("GPU-sim-1", 2),
    ]
    assert samples[0]["utilization_gpu_pct"] is None  # N/A in MIG mode, never 0


def test_nvml_that_does_not_initialise_is_a_source_error_and_reaches_the_report(
    api_server, tmp_path
):
    path = write(
        tmp_path / "h.json",
        state(
            nvml_error="Driver/library version mismatch",
            nvml_error_code="NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        ),
    )
    source = open_source("simulated", sim_state=str(path))
    with pytest.raises(SourceError, match="NVML: Driver/library version mismatch") as failed:
        source.inventory()
    assert failed.value.code == "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
    store = StateStore(tmp_path / "state")
    host_id, credential = api_server.add_host()
    store.set_registration(host_id, credential, 10)
    agent = Agent(
        source=source,
        client=ApiClient(api_server.url),
        store=store,
        spool=Spool(tmp_path / "state"),
        interval_s=1,
        backoff=Backoff(base_s=0.01, cap_s=0.05),
    )
    (seq,) = agent.produce()
    body = agent.spool.load(seq)
    assert body["source_error"] == "NVML: Driver/library version mismatch"
    assert body["source_error_code"] == "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
    assert body["inventory"] is None and body["samples"] == []
    write(path, state())  # the driver is fixed: the next round reads the GPUs again
    (seq,) = agent.produce()
    assert agent.spool.load(seq)["source_error"] is None
    assert "source_error_code" not in agent.spool.load(seq)


def test_a_gpu_marked_lost_is_listed_lost_and_not_sampled_as_the_nvml_source_does(tmp_path):
    lost = {**state()["gpus"][0], "lost": True}
    source = open_source("simulated", sim_state=str(write(tmp_path / "h.json", state(gpus=[lost]))))
    (gpu,) = source.inventory()["gpus"]
    assert gpu == {
        "uuid": "GPU-sim-1",
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:18:00.0",
        "memory_total_bytes": 80 * 2**30,
        "mig_mode": None,
        "mig_devices": [],
        "health": {"gpu_is_lost": True},
    }
    assert source.collect(NOW) == []


def test_each_xid_is_handed_out_once_and_only_those_logged_after_it_opened(tmp_path):
    path = write(tmp_path / "h.json", state())
    source = open_source("simulated", sim_state=str(path))
    assert source.events() == []  # event 1 was logged before the agent started
    body = state()
    body["events"].append(
        {"id": 2, "ts": "2026-01-01T12:00:01Z", "gpu_uuid": "GPU-sim-1", "type": "xid",
         "xid": 79, "message": "NVRM: Xid 79"}
    )  # fmt: skip
    write(path, body)
    source.collect(NOW)
    assert [(e["xid"], e["ts"]) for e in source.events()] == [(79, "2026-01-01T12:00:01Z")]
    source.collect(NOW)
    assert source.events() == []


def test_a_missing_state_file_cannot_start_the_source(tmp_path):
    with pytest.raises(SourceUnavailable):
        open_source("simulated", sim_state=str(tmp_path / "absent.json"))
    with pytest.raises(ValueError, match="--sim-state"):
        open_source("simulated")
