"""Beat survives losing its Redis state: the lock and the schedule are recovered on the next
tick (an empty Redis restart), and a beat whose lock another beat holds stands by. Plain
celery-redbeat 2.4.2 raises LockNotOwnedError in the same situation (the positive control).
On the real Redis of the test suite; the e2e fault suite restarts a real beat's Redis."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis
from redbeat.schedulers import RedBeatScheduler, acquire_distributed_beat_lock, get_redis
from redis.exceptions import LockNotOwnedError

from nvke.beat import ResilientRedBeatScheduler
from nvke.celery import app

QUEUES = ("reconcile", "telemetry", "billing", "default")


@pytest.fixture
def scheduler():
    client = get_redis(app)
    conf = app.redbeat_conf
    sched = ResilientRedBeatScheduler(app=app)
    acquire_distributed_beat_lock(sender=SimpleNamespace(scheduler=sched))
    yield sched, client, conf
    if sched.lock is not None and sched.lock.owned():
        sched.lock.release()
    for key in client.scan_iter(conf.key_prefix + "*"):
        client.delete(key)
    client.delete(*QUEUES)  # what the ticks sent


def test_an_empty_redis_restart_gives_the_lock_and_the_schedule_back(scheduler):
    sched, client, conf = scheduler
    assert sched.lock.owned()
    wiped = list(client.scan_iter(conf.key_prefix + "*"))
    client.delete(*wiped)  # what an empty restart leaves: no lock, no schedule entries
    assert not client.exists(conf.statics_key)
    with pytest.raises(LockNotOwnedError):  # what plain redbeat does: beat exits
        RedBeatScheduler.tick(sched)
    interval = sched.tick()
    assert 0 < interval <= sched.max_interval
    assert sched.lock is not None and sched.lock.owned()
    assert client.exists(conf.statics_key)
    assert set(client.smembers(conf.statics_key)) == set(conf.schedule)


def test_a_beat_whose_lock_another_holds_stands_by_then_takes_over(scheduler):
    sched, client, _conf = scheduler
    client.set(sched.lock_key, "another-beat", px=2000)
    assert sched.tick() == sched.max_interval  # sends nothing
    assert sched.lock is None
    client.delete(sched.lock_key)  # the other beat is gone
    sched.tick()
    assert sched.lock is not None and sched.lock.owned()


def test_a_tick_while_redis_is_unreachable_is_skipped_not_fatal(scheduler, monkeypatch):
    sched, _client, _conf = scheduler

    def unreachable(*args, **kwargs):
        raise redis.ConnectionError("Error 111 connecting")

    monkeypatch.setattr(sched.lock, "extend", unreachable)
    assert sched.tick() == 1.0  # RETRY_S
    assert sched._outage


def test_redbeat_finds_its_own_settings_without_falling_back_to_the_broker():
    """RedBeat's configuration names its Redis itself: no "falling back to broker_url" or
    "broker_transport_options" deprecation (celery-redbeat 2.4.2 warns on each beat start
    when it cannot find ``redbeat_redis_url`` / ``redbeat_redis_options``)."""
    import warnings

    from django.conf import settings
    from redbeat.schedulers import RedBeatConfig

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        conf = RedBeatConfig(app)
    assert conf.redis_url == settings.CELERY_REDBEAT_REDIS_URL == settings.REDIS_URL
    assert conf.redbeat_redis_options == {}
