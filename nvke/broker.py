"""A work-around for kombu's Redis transport losing a worker on a broker restart.

When the worker's broker connection breaks, Celery closes it (``Consumer.
on_connection_error_after_connected``). Closing the channel asks its QoS to restore the
unacknowledged messages the worker holds (countdown messages waiting for their ETA, the task in
progress); by then kombu has already dropped the channel's connection pool and the transport's
``client``, so building a new pool reads ``None.hostname`` and the ``AttributeError`` escapes
(``ignore_errors`` only swallows connection errors): "Unrecoverable error: AttributeError(
"'NoneType' object has no attribute 'hostname'")" and the worker exits. Seen with kombu 5.7.0
and celery 5.7.0 (the newest on PyPI when this was written); kombu's tracker has the same
failure in other close paths (celery/kombu#582, #970), no fix for this one.

:func:`install` makes ``Channel._connparams`` remember the parameters of the last pool it built
and use them when the transport has lost its client. The restore then runs against the broker
as it is now: a restarted Redis gets the held messages back (they would otherwise be lost with
its data), a Redis still down raises a connection error that kombu does ignore, and the
worker reconnects as designed (``tests/e2e/test_faults.py`` restarts Redis empty under
workers holding countdown messages). Remove it once kombu handles a missing client itself.
"""

from __future__ import annotations

from typing import Any

_INSTALLED = False


def install() -> None:
    """Patch ``kombu.transport.redis.Channel._connparams`` once per process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from kombu.transport import redis as kombu_redis

    original = kombu_redis.Channel._connparams

    def _connparams(self: Any, asynchronous: bool = False) -> dict[str, Any]:
        remembered = self.__dict__.setdefault("_nvke_connparams", {})
        if getattr(self.connection, "client", None) is None and asynchronous in remembered:
            return dict(remembered[asynchronous])
        params = original(self, asynchronous=asynchronous)
        remembered[asynchronous] = dict(params)
        return params

    kombu_redis.Channel._connparams = _connparams
    _INSTALLED = True
