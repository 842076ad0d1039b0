"""Whether the agent can write its state dir (state file and spool), shared by the loop, the
ops endpoints and the report it sends.

A full disk (ENOSPC) or a read-only state dir (EROFS, EACCES) used to kill the agent on an
uncaught ``OSError`` in ``allocate_seq`` — and kill it again within 0.2 s of each restart,
sending nothing although the API was reachable. Now the loop records the failure here and
goes on: it keeps delivering what is already spooled, makes no new reports (each one it
cannot write is counted as dropped, with its samples), and says so on ``/healthz``,
``/metrics`` (``nvke_agent_spool_writable``) and in the ``agent_status`` of every report it
sends. It tries to write again at each collection and says when it can.
"""

from __future__ import annotations

import errno
import logging
import threading
import time

log = logging.getLogger(__name__)

#: errors that mean "this state dir cannot be written now", not a bug
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def describe(exc: OSError) -> str:
    """``[Errno 28] No space left on device`` — short, without the file name (a log line
    carries that; the server's warning only needs the cause)."""
    if exc.errno is not None:
        return f"[Errno {exc.errno}] {exc.strerror or errno.errorcode.get(exc.errno, '')}"
    return str(exc)[:200]


class StorageHealth:
    """The state dir's writability: ``error`` is None while writes succeed, else the last
    failure's :func:`describe`; ``since`` (Unix time) when it started. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error: str | None = None
        self.since: float | None = None

    @property
    def writable(self) -> bool:
        """True while the last write to the state dir succeeded."""
        return self.error is None

    def failed(self, exc: OSError, what: str) -> None:
        """A write failed; logs at ERROR on the first failure only (then once more when
        writing works again), so a full disk is not a log line every interval."""
        with self._lock:
            first = self.error is None
            self.error = describe(exc)
            if first:
                self.since = time.time()
        if first:
            log.error(
                "cannot write the state dir (%s: %s): making no new reports until it can be "
                "written; delivering what is spooled; each report not made is counted as dropped",
                what,
                exc,
                extra={"fields": {"errno": exc.errno, "what": what}},
            )

    def succeeded(self) -> None:
        """A write worked: clears the failure (logged once)."""
        with self._lock:
            was, self.error, self.since = self.error, None, None
        if was is not None:
            log.info("the state dir can be written again (was: %s): reports resume", was)
