"""The ``nvidia-smi-xml`` and ``replay`` sources, and ``record`` -> ``replay`` round trips."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nvke_agent.record import record
from nvke_agent.sources import SourceUnavailable, open_source
from nvke_agent.sources.base import SAMPLE_FIELDS, format_ts, parse_ts
from nvke_agent.sources.replay import ReplaySource
from nvke_agent.sources.smi_xml import SmiXmlSource

A10G_UUID = "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"
A100_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


# --- nvidia-smi-xml -------------------------------------------------------------------------


def test_xml_source_rereads_the_file_every_collection(captures: Path, tmp_path: Path) -> None:
    path = tmp_path / "smi.xml"
    shutil.copy(captures / "a10g.xml", path)
    source = SmiXmlSource(path)
    now = datetime.now(UTC)

    [first] = source.collect(now)
    assert first["gpu_uuid"] == A10G_UUID
    assert first["ts"] == format_ts(now)
    assert first["utilization_gpu_pct"] == 0.0
    assert first["power_mw"] == 25580
    assert first["energy_mj"] is None  # nvidia-smi -q -x prints no energy counter
    assert set(first) == set(SAMPLE_FIELDS)

    path.write_text(
        path.read_text()
        .replace("<gpu_util>0 %</gpu_util>", "<gpu_util>87 %</gpu_util>")
        .replace("<power_draw>25.58 W</power_draw>", "<power_draw>212.40 W</power_draw>")
    )
    [second] = source.collect(now + timedelta(seconds=10))
    assert second["utilization_gpu_pct"] == 87.0
    assert second["power_mw"] == 212400
    assert second["ts"] == format_ts(now + timedelta(seconds=10))


def test_xml_source_reports_mig_devices_with_their_memory(captures: Path) -> None:
    source = SmiXmlSource(captures / "a100-sxm4-v12.xml")
    samples = source.collect(T0)
    gpu, *migs = samples
    assert gpu["mig_gpu_instance_id"] is None
    assert gpu["utilization_gpu_pct"] is None  # N/A in MIG mode stays null
    assert gpu["memory_total_bytes"] == 85899345920
    assert [m["mig_gpu_instance_id"] for m in migs] == [3, 4, 5, 6]
    assert {m["gpu_uuid"] for m in migs} == {A100_UUID}
    assert all(m["memory_total_bytes"] == 19968 * 2**20 for m in migs)
    assert all(m["memory_used_bytes"] == 12 * 2**20 for m in migs)
    assert all(m["utilization_gpu_pct"] is None for m in migs)

    inventory = source.inventory()
    assert inventory["driver_version"] == "535.54.03"
    assert inventory["cuda_version"] == "12.2"
    [inv] = inventory["gpus"]
    assert inv == {
        "uuid": A100_UUID,
        "index": 0,
        "name": "NVIDIA A100-SXM4-80GB",
        "pci_bus_id": "00000000:01:00.0",
        "memory_total_bytes": 85899345920,
        "mig_mode": "enabled",
        "mig_devices": [
            {
                "uuid": None,
                "gpu_instance_id": gi,
                "compute_instance_id": 0,
                "memory_total_bytes": 19968 * 2**20,
                "multiprocessor_count": 14,
            }
            for gi in (3, 4, 5, 6)
        ],
        # read by hand from the capture: <gpu_reset_status> No/No, every ECC counter 0,
        # <retired_pages> and <remapped_rows> N/A (MIG on), <pending_mig>Enabled
        "health": {
            "reset_required": False,
            "drain_and_reset_recommended": False,
            "ecc_volatile_uncorrected": 0,
            "ecc_aggregate_uncorrected": 0,
            "retired_pages_sbe": None,
            "retired_pages_dbe": None,
            "retired_pages_pending": None,
            "remapped_rows_correctable": None,
            "remapped_rows_uncorrectable": None,
            "remapped_rows_pending": None,
            "remapped_rows_failure": None,
            "mig_mode_pending": "enabled",
            "gpu_recovery_action": None,
        },
        # <serial>, <product_architecture>, <vbios_version>, 500.00 W limits, <max_clocks>
        "attributes": {
            "serial": "1650522003820",
            "architecture": "Ampere",
            "compute_capability": None,
            "vbios_version": "92.00.36.00.02",
            "power_limit_mw": 500_000,
            "power_limit_default_mw": 500_000,
            "power_limit_max_mw": 500_000,
            "max_sm_clock_mhz": 1410,
            "max_memory_clock_mhz": 1593,
            "nvlink_links_active": None,
        },
    }
    # <clocks> 1275 / 1593 MHz, every clocks_event_reason "Not Active", volatile correctable 0
    assert (
        gpu["sm_clock_mhz"],
        gpu["memory_clock_mhz"],
        gpu["clocks_event_reasons"],
        gpu["ecc_volatile_corrected"],
    ) == (1275, 1593, 0, 0)


def test_xml_source_skips_a_round_when_the_file_is_broken(captures: Path, tmp_path: Path) -> None:
    path = tmp_path / "smi.xml"
    shutil.copy(captures / "tesla-t4.xml", path)
    source = SmiXmlSource(path)
    path.write_text("<nvidia_smi_log><gpu>")  # half-written
    assert source.collect(T0) == []
    assert source.inventory()["gpus"][0]["name"] == "Tesla T4"  # last good report
    shutil.copy(captures / "tesla-t4.xml", path)
    assert len(source.collect(T0)) == 1


def test_xml_source_cannot_start_without_a_report(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="No such file"):
        SmiXmlSource(tmp_path / "missing.xml")
    (tmp_path / "other.xml").write_text("<html/>")
    with pytest.raises(SourceUnavailable, match="<html>"):
        SmiXmlSource(tmp_path / "other.xml")


# --- replay ---------------------------------------------------------------------------------


def _write_replay(path: Path, offsets_s: list[float], *, inventory: bool = True) -> None:
    lines = []
    if inventory:
        lines.append(
            {"kind": "inventory", "driver_version": "550.54.15", "cuda_version": "12.4", "gpus": []}
        )
    for i, offset in enumerate(offsets_s):
        lines.append(
            {
                "kind": "sample",
                "ts": format_ts(T0 + timedelta(seconds=offset)),
                "gpu_uuid": "GPU-a",
                "mig_gpu_instance_id": None,
                "utilization_gpu_pct": None if i == 0 else float(i),
                "memory_used_bytes": 1000 + i,
                "power_mw": 50_000,
            }
        )
    lines.append(
        {
            "kind": "event",
            "ts": format_ts(T0 + timedelta(seconds=offsets_s[1])),
            "gpu_uuid": "GPU-a",
            "type": "xid",
            "xid": 79,
            "message": "GPU has fallen off the bus",
        }
    )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_replay_rebases_the_first_record_to_the_start_and_keeps_intervals(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _write_replay(path, [0, 10, 20])
    start = datetime(2030, 1, 1, tzinfo=UTC)
    source = ReplaySource(path, start=start)
    assert source.inventory() == {
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "gpus": [],
    }

    first = source.collect(start)
    assert [s["ts"] for s in first] == [format_ts(start)]
    assert first[0]["utilization_gpu_pct"] is None  # null stays null
    assert first[0]["energy_mj"] is None  # absent fields are null
    assert source.events() == []

    # not before it is due (beyond the replay's 100 ms clock slack)
    assert source.collect(start + timedelta(seconds=9.85)) == []
    second = source.collect(start + timedelta(seconds=10))
    assert [s["ts"] for s in second] == [format_ts(start + timedelta(seconds=10))]
    assert second[0]["utilization_gpu_pct"] == 1.0
    [event] = source.events()
    assert event == {
        "ts": format_ts(start + timedelta(seconds=10)),
        "gpu_uuid": "GPU-a",
        "type": "xid",
        "xid": 79,
        "message": "GPU has fallen off the bus",
    }
    assert not source.exhausted
    assert len(source.collect(start + timedelta(hours=1))) == 1
    assert source.exhausted
    assert source.collect(start + timedelta(hours=2)) == []


def test_replay_without_rebase_keeps_the_original_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _write_replay(path, [0, 10, 20], inventory=False)
    source = ReplaySource(path, start=datetime.now(UTC), rebase=False)
    assert source.inventory() is None
    samples = source.collect(datetime.now(UTC))
    assert [parse_ts(s["ts"]) for s in samples] == [T0 + timedelta(seconds=s) for s in (0, 10, 20)]
    assert source.exhausted


def test_replay_loop_never_repeats_a_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _write_replay(path, [0, 5, 10])
    start = datetime(2030, 1, 1, tzinfo=UTC)
    source = ReplaySource(path, start=start, loop=True)
    samples = source.collect(start + timedelta(seconds=44))
    stamps = [parse_ts(s["ts"]) for s in samples]
    # Passes are 15 s apart (span 10 s + step 5 s): 0,5,10, 15,20,25, 30,35,40
    assert stamps == [start + timedelta(seconds=s) for s in range(0, 45, 5)]
    assert not source.exhausted


def test_replay_loop_needs_rebasing(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _write_replay(path, [0, 5])
    with pytest.raises(ValueError, match="rebas"):
        ReplaySource(path, start=T0, rebase=False, loop=True)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"kind": "sample", "gpu_uuid": "GPU-a"}', "ts"),
        ('{"kind": "sample", "ts": "2024-05-01T12:00:00Z"}', "gpu_uuid"),
        ('{"kind": "event", "ts": "2024-05-01T12:00:00Z", "gpu_uuid": "GPU-a"}', "xid"),
        ('{"kind": "metric"}', "unknown kind"),
        ("[1, 2]", "not a JSON object"),
        ("{not json", "invalid replay record"),
        ('{"kind": "sample", "ts": "yesterday", "gpu_uuid": "GPU-a"}', "invalid replay record"),
    ],
)
def test_replay_refuses_an_invalid_file_naming_the_line(
    tmp_path: Path, line: str, error: str
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(
        '{"kind": "sample", "ts": "2024-05-01T12:00:00Z", "gpu_uuid": "GPU-a"}\n' + line
    )
    with pytest.raises(SourceUnavailable, match=r"r\.jsonl:2: .*" + error):
        ReplaySource(path, start=T0)


def test_replay_inventory_must_come_first(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(
        '{"kind": "sample", "ts": "2024-05-01T12:00:00Z", "gpu_uuid": "GPU-a"}\n'
        '{"kind": "inventory", "gpus": []}\n'
    )
    with pytest.raises(SourceUnavailable, match="first"):
        ReplaySource(path, start=T0)


# --- record ---------------------------------------------------------------------------------


def test_record_from_xml_then_replay_gives_the_same_samples(captures: Path, tmp_path: Path) -> None:
    out = tmp_path / "a100.jsonl"
    source = open_source("nvidia-smi-xml", start=T0, xml=str(captures / "a100-sxm4-v12.xml"))
    summary = record(source, out, duration_s=0.05, interval_s=0.02)
    assert summary.gpus == 1
    assert summary.collections >= 2
    assert summary.samples == 5 * summary.collections  # 1 GPU + 4 MIG devices each time
    assert summary.line().startswith(f"recorded 1 GPU(s), {summary.samples} sample(s)")

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "inventory"
    assert lines[0]["gpus"][0]["uuid"] == A100_UUID
    recorded = [line for line in lines[1:] if line["kind"] == "sample"]
    assert len(recorded) == summary.samples

    replay = ReplaySource(out, start=T0, rebase=False)
    assert replay.inventory()["gpus"] == lines[0]["gpus"]
    replayed = replay.collect(datetime.now(UTC) + timedelta(days=1))
    assert replayed == [{k: v for k, v in line.items() if k != "kind"} for line in recorded]
    assert replay.exhausted


def test_record_stops_when_a_replay_source_is_exhausted(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    _write_replay(path, [0, 1, 2])
    source = ReplaySource(path, start=T0, rebase=False)
    summary = record(source, tmp_path / "out.jsonl", duration_s=3600, interval_s=1)
    assert (summary.samples, summary.events, summary.collections) == (3, 1, 1)


def test_replay_without_a_start_is_anchored_at_its_first_collection(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _write_replay(path, [0, 10])
    source = open_source("replay", replay=str(path))
    first_collect = datetime(2031, 6, 1, tzinfo=UTC)
    assert [s["ts"] for s in source.collect(first_collect)] == [format_ts(first_collect)]
    later = first_collect + timedelta(seconds=10)
    assert [s["ts"] for s in source.collect(later)] == [format_ts(later)]
