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


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batches_are_appended_to_a_segment_and_come_back_in_seq_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for seq in (1, 2, 3):
        spool.put(seq, _body(seq))
    segment = spool.dir / "seg-000000000001.jsonl"
    assert [p.name for p in spool.dir.glob("seg-*")] == [segment.name]
    assert _lines(segment) == [_body(1), _body(2), _body(3)]  # one batch per line, in order
    assert _mode(segment) == 0o600
    assert spool.pending() == [1, 2, 3]
    assert spool.load(2) == _body(2)
    spool.ack(1)
    assert spool.pending() == [2, 3]
    assert _lines(spool.dir / "done.jsonl") == [{"seq": 1, "how": "acked"}]
    assert _lines(segment) == [_body(1), _body(2), _body(3)]  # append-only: never rewritten
    spool.close()
    assert Spool(tmp_path).pending() == [2, 3]  # a restart finds what is left


def test_a_segment_is_deleted_once_every_batch_in_it_is_done(tmp_path: Path) -> None:
    one = len(json.dumps(_body(1), separators=(",", ":"))) + 1
    spool = Spool(tmp_path, segment_bytes=2 * one)  # two batches per segment
    for seq in (1, 2, 3, 4, 5):
        spool.put(seq, _body(seq))
    assert sorted(p.name for p in spool.dir.glob("seg-*")) == [
        "seg-000000000001.jsonl",
        "seg-000000000003.jsonl",
        "seg-000000000005.jsonl",
    ]
    spool.ack(1)
    spool.ack(3)
    assert len(list(spool.dir.glob("seg-*"))) == 3
    spool.ack(2)
    spool.ack(4)
    assert [p.name for p in spool.dir.glob("seg-*")] == ["seg-000000000005.jsonl"]
    spool.close()
    restarted = Spool(tmp_path)
    assert restarted.pending() == [5]
    assert _lines(restarted.dir / "done.jsonl") == []  # compacted: no entry of a gone segment


def test_a_body_must_carry_its_seq(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seq"):
        Spool(tmp_path).put(5, _body(4))


def test_a_last_line_cut_short_by_a_crash_is_kept_aside_and_the_rest_survives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    spool.put(1, _body(1))
    spool.put(2, _body(2))
    spool.close()
    segment = spool.dir / "seg-000000000001.jsonl"
    good = segment.read_bytes()
    torn = json.dumps(_body(3)).encode()[:25]  # the process died in the middle of put(3)
    segment.write_bytes(good + torn)

    with caplog.at_level("ERROR", logger="nvke_agent"):
        restarted = Spool(tmp_path)
    assert "cut short by a crash" in caplog.text
    assert restarted.pending() == [1, 2]
    assert restarted.load(2) == _body(2)
    assert segment.read_bytes() == good  # truncated back to the last complete line
    [kept] = restarted.corrupt_dir.iterdir()
    assert kept.read_bytes() == torn
    restarted.put(3, _body(3))  # appending goes on cleanly
    restarted.close()
    assert Spool(tmp_path).pending() == [1, 2, 3]


def test_a_torn_done_record_means_the_batch_is_sent_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put(1, _body(1))
    spool.put(2, _body(2))
    spool.ack(1)
    spool.close()
    done = spool.dir / "done.jsonl"
    done.write_bytes(done.read_bytes() + b'{"seq": 2, "ho')  # died while recording the ack of 2
    restarted = Spool(tmp_path)
    # 2 is sent again: the server answers "duplicate" (idempotent on (host, seq))
    assert restarted.pending() == [2]


def test_a_damaged_line_in_the_middle_is_kept_aside_and_the_others_are_read(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path)
    for seq in (1, 2, 3):
        spool.put(seq, _body(seq))
    spool.close()
    segment = spool.dir / "seg-000000000001.jsonl"
    lines = segment.read_bytes().split(b"\n")
    lines[1] = b"\x00" * len(lines[1])  # a bad sector
    segment.write_bytes(b"\n".join(lines))
    restarted = Spool(tmp_path)
    assert restarted.pending() == [1, 3]
    assert len(list(restarted.corrupt_dir.iterdir())) == 1


def test_a_refused_batch_is_kept_in_rejected_with_the_reason(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put(9, _body(9))
    spool.reject(9, status=400, detail="invalid_report: bad sample")
    assert spool.pending() == []
    assert json.loads((spool.rejected_dir / "000000000009.json").read_text()) == _body(9)
    reason = json.loads((spool.rejected_dir / "000000000009.reason.json").read_text())
    assert reason["status"] == 400
    assert reason["detail"] == "invalid_report: bad sample"
    assert _lines(spool.dir / "done.jsonl") == [{"seq": 9, "how": "rejected"}]


def test_over_the_cap_the_oldest_batches_are_dropped_never_the_newest(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1)
    spool.put(1, _body(1, samples=3))
    assert spool.enforce_cap() == []  # the only (newest) batch stays even over the cap
    spool.put(2, _body(2, samples=2))
    spool.put(3, _body(3))
    dropped = spool.enforce_cap()
    assert [(d.seq, d.samples) for d in dropped] == [(1, 3), (2, 2)]
    assert spool.pending() == [3]
    assert _lines(spool.dir / "done.jsonl") == [
        {"seq": 1, "how": "dropped"},
        {"seq": 2, "how": "dropped"},
    ]


def test_the_cap_counts_the_bytes_of_pending_batches(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10_000)
    for seq in range(1, 6):
        spool.put(seq, _body(seq, samples=20))
    size = len(json.dumps(_body(1, samples=20), separators=(",", ":"))) + 1
    assert spool.total_bytes == 5 * size == (spool.dir / "seg-000000000001.jsonl").stat().st_size
    spool.max_bytes = 3 * size
    assert [d.seq for d in spool.enforce_cap()] == [1, 2]
    assert spool.pending() == [3, 4, 5]


def test_a_registration_moves_next_seq_above_the_servers_baseline_never_back(
    tmp_path: Path,
) -> None:
    """The server's ``seq_baseline`` (its last accepted seq, 41) puts a fresh agent at 42; a
    baseline below what the agent already used (an older answer) changes nothing."""
    store = StateStore(tmp_path)
    store.set_registration("host-1", "cred-1", 10, seq_baseline=41)
    assert store.allocate_seq() == 42
    store.set_registration("host-1", "cred-2", 10, seq_baseline=5)
    assert store.allocate_seq() == 43
    assert json.loads((tmp_path / "state.json").read_text())["next_seq"] == 44
