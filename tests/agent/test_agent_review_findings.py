"""Agent defects found by a fresh-user review, each pinned."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nvke_agent.smi_xml import parse_nvidia_smi_xml

CAPTURES = Path(__file__).resolve().parents[2] / "fleet" / "captures"
AGENT = [sys.executable, "-m", "nvke_agent"]


def test_an_unwritable_out_path_is_a_clean_error_not_a_traceback(tmp_path):
    result = subprocess.run(
        [*AGENT, "record", "--source", "nvidia-smi-xml", "--xml", str(CAPTURES / "tesla-t4.xml"),
         "--out", str(tmp_path / "missing-dir" / "x.jsonl"), "--duration", "0", "--interval", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "cannot write" in result.stderr and "No such file or directory" in result.stderr


def test_a_negative_memory_size_is_not_a_reading():
    xml = (CAPTURES / "tesla-t4.xml").read_text().replace("<total>15360 MiB", "<total>-5 MiB", 1)
    (gpu,) = parse_nvidia_smi_xml(xml).gpus
    assert gpu.memory_total_bytes is None


def test_a_record_3_ms_late_is_still_replayed_at_the_last_collection(tmp_path):
    """A 3 s recording stamps its third batch 2.003 s after the first; a 3 s replay collects
    at 0, 1 and 2 s and used to lose that batch."""
    import json
    from datetime import UTC, datetime, timedelta

    from nvke_agent.sources.replay import ReplaySource

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    path = tmp_path / "r.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "kind": "sample",
                    "gpu_uuid": "GPU-a",
                    "ts": (t0 + timedelta(seconds=s)).isoformat(),
                }
            )
            + "\n"
            for s in (0, 1.001, 2.003)
        )
    )
    start = datetime(2030, 1, 1, tzinfo=UTC)
    source = ReplaySource(path, start=start)
    got = [len(source.collect(start + timedelta(seconds=s))) for s in (0, 1, 2)]
    assert got == [1, 1, 1]
    assert source.exhausted
