"""The real ``nvidia-smi -q -x`` captures of ../shared/data fed to the real agent process.

For every capture: ``nvke-agent record`` must not crash and must write the inventory the XML
holds (read here independently with ElementTree); for the GPUs in the catalog, the capture is
imported as a host and ``nvke-agent run`` reports it to the live API, which stores the agent's
samples and finds the inventory equal to the host's (no warning).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "nvidia-smi-xml"
# fleet/captures holds byte-for-byte copies, so a clone without ../shared still runs this
VENDORED = ROOT / "fleet" / "captures"
CAPTURES = sorted((SHARED if SHARED.is_dir() else VENDORED).glob("*.xml"))
AGENT = Path(sys.executable).with_name("nvke-agent")


def expected(path: Path) -> list[dict]:
    """UUID, name, memory (bytes) and MIG mode of each <gpu>, read without NVKE's parser."""
    root = ET.fromstring(path.read_bytes())  # DOCTYPE without entities: nothing fetched
    out = []
    for gpu in root.iter("gpu"):
        mib = int(gpu.findtext("fb_memory_usage/total").split()[0])
        mig = (gpu.findtext("mig_mode/current_mig") or "").strip().lower()
        out.append(
            {
                "uuid": gpu.findtext("uuid").strip(),
                "name": gpu.findtext("product_name").strip(),
                "memory_total_bytes": mib * 2**20,
                "mig_mode": mig if mig in ("enabled", "disabled") else None,
            }
        )
    return out


@pytest.mark.skipif(not CAPTURES, reason="../shared/data/nvidia-smi-xml not found")
@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_the_agent_records_the_inventory_of_every_real_capture(capture: Path, tmp_path: Path):
    out = tmp_path / "recording.jsonl"
    done = subprocess.run(
        [str(AGENT), "record", "--source", "nvidia-smi-xml", "--xml", str(capture),
         "--out", str(out), "--duration", "0", "--interval", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    inventory = lines[0]
    assert inventory["kind"] == "inventory"
    got = [
        {k: g[k] for k in ("uuid", "name", "memory_total_bytes", "mig_mode")}
        for g in inventory["gpus"]
    ]
    assert got == expected(capture)
    samples = [line for line in lines if line["kind"] == "sample"]
    gpus = {g["uuid"] for g in got}
    assert {s["gpu_uuid"] for s in samples} == gpus
    for s in samples:  # MIG mode: utilization N/A stays null, never 0
        if next(g for g in got if g["uuid"] == s["gpu_uuid"])["mig_mode"] == "enabled":
            assert s["utilization_gpu_pct"] is None


@pytest.mark.skipif(not CAPTURES, reason="../shared/data/nvidia-smi-xml not found")
@pytest.mark.django_db(transaction=True)
def test_the_agent_reports_every_catalogued_capture_to_the_live_api(live_server, catalog, tmp_path):
    from django.db import connection

    from fleet.models import Host
    from fleet.services import import_host
    from nvke.errors import InvalidInput

    env = {**os.environ, "NVKE_LOG_LEVEL": "WARNING"}
    reported = 0
    for n, capture in enumerate(CAPTURES):
        try:
            imported = import_host(
                hostname=f"real-{n}", zone="us-east-1a", nvidia_smi_xml=capture.read_text()
            )
        except InvalidInput as exc:  # a workstation card outside the catalog
            assert exc.code == "unknown_gpu_product", capture.name
            continue
        done = subprocess.run(
            [str(AGENT), "run", "--server", live_server.url, "--state-dir", str(tmp_path / f"a{n}"),
             "--source", "nvidia-smi-xml", "--xml", str(capture), "--interval", "0.2",
             "--max-reports", "2", "--bootstrap-token", imported.bootstrap_token,
             "--retry-base-s", "0.1", "--retry-cap-s", "0.5"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        host = Host.objects.get(pk=imported.host.pk)
        assert host.last_report_seq == 2
        assert [w for w in host.warnings if w.startswith("agent inventory")] == []
        uuids = [g["uuid"] for g in expected(capture)]
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT DISTINCT gpu_uuid FROM fleet_gpusample WHERE host_id = %s", [host.id]
            )
            assert sorted(r[0] for r in cursor.fetchall()) == sorted(uuids)
        reported += 1
    assert reported == 3  # A100 (MIG on), A10G, T4; the RTX 4000 SFF Ada is not in the catalog
