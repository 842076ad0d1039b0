"""Beat that survives its Redis: celery-redbeat's scheduler with the lock and the schedule
recovered after a broker outage or an empty restart (``CELERY_BEAT_SCHEDULER``).

celery-redbeat 2.4.2 (the newest on PyPI when this was written) extends its Redis lock on every
tick and lets any error end the process: a connection error while Redis is down, and after Redis
comes back empty ``LockNotOwnedError`` (the lock key is gone) or ``AttributeError`` on a lock
that was never acquired (sibson/redbeat#285, #230, both open). A restarted empty Redis has also
lost redbeat's schedule entries, so even a restarted beat sends nothing until they are
installed again. :class:`ResilientRedBeatScheduler` works around that by overriding ``tick``:

* the lock is extended when owned, re-acquired without blocking when lost; when another beat
  holds it this one stays on standby (sends nothing) and tries again next tick, as at start-up;
* when the static schedule is missing from Redis (``statics_key`` gone) it is installed again,
  so the resync runs again one interval after Redis returns;
* a Redis or broker error skips the tick (logged once per outage) and retries after
  ``RETRY_S``; beat never exits for a broker outage;
* every tick writes beat's heartbeat (:mod:`nvke.heartbeat`).
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.exceptions import OperationalError
from redbeat.schedulers import LUA_EXTEND_TO_SCRIPT, RedBeatScheduler, get_redis
from redis import RedisError
from redis.exceptions import LockError

from . import heartbeat

log = logging.getLogger(__name__)

#: seconds to the next tick after a failed one
RETRY_S = 1.0


class ResilientRedBeatScheduler(RedBeatScheduler):
    """RedBeatScheduler whose tick recovers the lock and the schedule (see the module)."""

    _outage = False

    def tick(self, min: Any = min, **kwargs: Any) -> float:
        try:
            if self.lock_key and not self._hold_lock():
                heartbeat.beat("standby")
                return self.max_interval
            self._ensure_schedule()
            heartbeat.beat("active")
            interval = self._tick_entries(min)
        except (RedisError, OperationalError, ConnectionError) as exc:
            if not self._outage:
                log.warning("beat: Redis unavailable, retrying every %.0f s (%s)", RETRY_S, exc)
            self._outage = True
            return RETRY_S
        if self._outage:
            log.info("beat: Redis reachable again")
            self._outage = False
        return interval

    def _tick_entries(self, min: Any) -> float:
        """redbeat's ``tick`` without its lock extension (kept in step with redbeat 2.4.2)."""
        remaining_times = []
        try:
            for entry in self.schedule.values():
                next_time_to_run = self.maybe_due(entry, **self._maybe_due_kwargs)
                if next_time_to_run:
                    remaining_times.append(next_time_to_run)
        except RuntimeError:
            log.debug("beat: RuntimeError", exc_info=True)
        return min([*remaining_times, self.max_interval])

    def _hold_lock(self) -> bool:
        """Extend the lock when this beat owns it, else try to take it (never blocks)."""
        lock = self.lock
        if lock is not None:
            try:
                if lock.extend(int(self.lock_timeout)):
                    return True
            except LockError:
                pass  # not owned any more (expired, or Redis restarted empty)
        client = get_redis(self.app)
        lock = client.lock(self.lock_key, timeout=self.lock_timeout, sleep=self.max_interval)
        lock.lua_extend = client.register_script(LUA_EXTEND_TO_SCRIPT)
        if not lock.acquire(blocking=False):
            if self.lock is not None:
                log.warning("beat: lost the lock to another beat; standing by")
            self.lock = None
            return False
        if self.lock is not None or self._outage:
            log.info("beat: lock re-acquired")
        self.lock = lock
        return True

    def _ensure_schedule(self) -> None:
        """Install the static entries again when Redis has lost them (an empty restart)."""
        client = get_redis(self.app)
        if self.app.redbeat_conf.schedule and not client.exists(self.app.redbeat_conf.statics_key):
            log.warning("beat: schedule missing from Redis (restarted empty?); installing it")
            self.setup_schedule()
