"""``nvke-agent`` with a journal of what it spooled — test instrumentation for the soak test.

Usage: ``python soak_agent.py JOURNAL -- <nvke-agent arguments>``.

Every batch the agent durably spools is also appended (and fsync'ed) to JOURNAL as
``{"seq": n, "keys": [[gpu_uuid, ts], ...]}`` right after ``Spool.put`` returns. If the process
is killed between the two, the batch is still pending in the spool: on start, before the agent
runs, every pending batch missing from the journal is journaled. So the journal is exactly the
set of samples the agent took responsibility for — what the soak test requires the server to
have stored, no more and no less. The agent itself is unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path


def main() -> int:
    journal_path = Path(sys.argv[1])
    args = sys.argv[3:] if sys.argv[2] == "--" else sys.argv[2:]
    state_dir = args[args.index("--state-dir") + 1]

    from nvke_agent import cli
    from nvke_agent.spool import Spool

    journaled: set[int] = set()
    if journal_path.exists():
        for line in journal_path.read_text().splitlines():
            # a torn last line: that batch is journaled again from the spool below
            with contextlib.suppress(ValueError, KeyError):
                journaled.add(json.loads(line)["seq"])
    fd = os.open(journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if journal_path.stat().st_size and not journal_path.read_bytes().endswith(b"\n"):
        os.write(fd, b"\n")  # end a line torn by a kill, so it stays apart from the next

    def record(seq: int, body: dict) -> None:
        keys = [[s["gpu_uuid"], s["ts"]] for s in body.get("samples") or []]
        os.write(fd, (json.dumps({"seq": seq, "keys": keys}) + "\n").encode())
        os.fsync(fd)
        journaled.add(seq)

    if (Path(state_dir) / "spool").exists():
        spool = Spool(state_dir)
        for seq in spool.pending():
            if seq not in journaled:
                body = spool.load(seq)
                if body is not None:
                    record(seq, body)
        spool.close()

    original_put = Spool.put

    def put(self: Spool, seq: int, body: dict) -> None:
        original_put(self, seq, body)
        record(seq, body)

    Spool.put = put  # type: ignore[method-assign]
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
