"""Persisted state (seq allocation) and the on-disk spool."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from nvke_agent.spool import Spool
from nvke_agent.state import StateError, StateStore


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _body(seq: int, samples: int = 1) -> dict:
    return {
        "seq": seq,
        "samples": [
            {"gpu_uuid": "GPU-a", "ts": f"2024-05-01T12:00:{i:02d}.000000Z"} for i in range(samples)
        ],
    }


# --- state ----------------------------------------------------------------------------------


def test_a_fresh_state_starts_at_seq_1_and_is_written_0600(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    assert store.state.next_seq == 1
    assert not store.state.registered
    store.set_registration("host-1", "s3cret", 15)
    assert _mode(store.path) == 0o600
    assert _mode(tmp_path / "state") == 0o700
    assert json.loads(store.path.read_text())["credential"] == "s3cret"


def test_seq_is_persisted_before_it_is_handed_out(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.allocate_seq() == 1
    # Were the process killed right now, the next start must not hand out 1 again.
    assert json.loads(store.path.read_text())["next_seq"] == 2
    assert StateStore(tmp_path).allocate_seq() == 2


def test_seqs_are_never_reused_across_restarts(tmp_path: Path) -> None:
    seen = []
    for _ in range(3):
        store = StateStore(tmp_path)
        seen += [store.allocate_seq(), store.allocate_seq()]
    assert seen == [1, 2, 3, 4, 5, 6]


def test_a_corrupt_state_file_is_refused_not_reset(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"next_seq": 4')
    with pytest.raises(StateError, match="refusing to start"):
        StateStore(tmp_path)
    (tmp_path / "state.json").write_text('{"next_seq": 0}')
    with pytest.raises(StateError, match="next_seq"):
        StateStore(tmp_path)


def test_drop_counters_accumulate_in_the_state_file(tmp_path: Path) -> None:
    StateStore(tmp_path).count_dropped(2, 10)
    store = StateStore(tmp_path)
    store.count_dropped(1, 5)
    assert json.loads(store.path.read_text())["dropped_batches"] == 3
    assert StateStore(tmp_path).state.dropped_samples == 15


# --- spool ----------------------------------------------------------------------------------


def test_batches_are_files_named_by_seq_and_come_back_in_seq_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for seq in (3, 1, 2):
        spool.put(seq, _body(seq))
    assert sorted(p.name for p in spool.dir.glob("*.json")) == [
        "000000000001.json",
        "000000000002.json",
        "000000000003.json",
    ]
    assert _mode(spool.dir / "000000000001.json") == 0o600
    assert spool.pending() == [1, 2, 3]
    assert spool.load(2) == _body(2)
    spool.ack(1)
    assert spool.pending() == [2, 3]
    assert not (spool.dir / "000000000001.json").exists()
    assert Spool(tmp_path).pending() == [2, 3]  # a restart finds what is left


def test_a_body_must_carry_its_seq(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seq"):
        Spool(tmp_path).put(5, _body(4))


def test_a_truncated_batch_is_moved_to_corrupt_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    spool.put(1, _body(1))
    spool.put(2, _body(2))
    path = spool.dir / "000000000001.json"
    path.write_bytes(path.read_bytes()[:20])  # what a crash or a full disk can leave

    restarted = Spool(tmp_path)
    assert restarted.pending() == [1, 2]
    with caplog.at_level("ERROR", logger="nvke_agent"):
        assert restarted.load(1) is None
    assert "unreadable batch" in caplog.text
    assert (restarted.corrupt_dir / "000000000001.json").exists()
    assert restarted.pending() == [2]
    assert restarted.load(2) == _body(2)


def test_a_leftover_temporary_file_is_moved_aside_on_start(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    (spool.dir / ".000000000007.json.1234.tmp").write_text('{"seq": 7, "sam')
    restarted = Spool(tmp_path)
    assert restarted.pending() == []
    assert [p.name for p in restarted.corrupt_dir.iterdir()] == [".000000000007.json.1234.tmp"]


def test_a_refused_batch_is_kept_in_rejected_with_the_reason(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put(9, _body(9))
    spool.reject(9, status=400, detail="invalid_report: bad sample")
    assert spool.pending() == []
    assert json.loads((spool.rejected_dir / "000000000009.json").read_text()) == _body(9)
    reason = json.loads((spool.rejected_dir / "000000000009.reason.json").read_text())
    assert reason["status"] == 400
    assert reason["detail"] == "invalid_report: bad sample"


def test_over_the_cap_the_oldest_batches_are_dropped_never_the_newest(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1)
    spool.put(1, _body(1, samples=3))
    assert spool.enforce_cap() == []  # the only (newest) batch stays even over the cap
    spool.put(2, _body(2, samples=2))
    spool.put(3, _body(3))
    dropped = spool.enforce_cap()
    assert [(d.seq, d.samples) for d in dropped] == [(1, 3), (2, 2)]
    assert spool.pending() == [3]
    assert sorted(p.name for p in spool.dir.glob("*.json")) == ["000000000003.json"]


def test_the_cap_counts_bytes_on_disk(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10_000)
    for seq in range(1, 6):
        spool.put(seq, _body(seq, samples=20))
    size = (spool.dir / "000000000001.json").stat().st_size
    assert spool.total_bytes == sum(p.stat().st_size for p in spool.dir.glob("*.json"))
    spool.max_bytes = 3 * size
    assert [d.seq for d in spool.enforce_cap()] == [1, 2]
    assert spool.pending() == [3, 4, 5]
