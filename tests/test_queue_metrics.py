"""Queue metrics count waiting, reserved (unacked) and scheduled (unacked, ETA ahead) messages,
read from the broker's Redis in kombu's own layout: messages sent through Celery land in the
queue list; a worker's unacked messages are ``unacked`` hash entries of
``[message, exchange, routing key]`` (kombu.transport.redis.QoS.append)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.conf import settings

from nvke.observability import QueueDepthCollector, broker_redis_url

pytestmark = pytest.mark.django_db


def test_broker_urls_map_to_redis_py_urls():
    assert broker_redis_url("redis+socket:///d/redis.sock") == "unix:///d/redis.sock?db=0"
    assert broker_redis_url("redis+socket:///d/r.sock?virtual_host=3") == "unix:///d/r.sock?db=3"
    assert broker_redis_url("redis://h:6380/1") == "redis://h:6380/1"


def test_waiting_reserved_and_scheduled_messages_are_counted_per_queue():
    from clusters.tasks import reconcile_cluster

    client = redis.Redis.from_url(broker_redis_url(settings.CELERY_BROKER_URL))
    client.delete("reconcile", "billing", "unacked")
    for _ in range(3):
        reconcile_cluster.apply_async(("00000000-0000-0000-0000-000000000001",))
    (raw,) = client.lrange("reconcile", 0, 0)
    message = json.loads(raw)
    now = datetime.now(UTC)
    for tag, (eta, key) in {
        "a": (None, "reconcile"),  # running
        "b": ((now - timedelta(seconds=5)).isoformat(), "reconcile"),  # due: running now
        "c": ((now + timedelta(seconds=30)).isoformat(), "reconcile"),  # countdown waiting
        "d": ((now + timedelta(seconds=30)).isoformat(), "billing"),
    }.items():
        held = {**message, "headers": {**message["headers"], "eta": eta}}
        client.hset("unacked", tag, json.dumps([held, key, key]))
    try:
        [depth, states] = list(QueueDepthCollector().collect())
        counts = {(s.labels["queue"], s.labels["state"]): s.value for s in states.samples}
        assert {s.labels["queue"]: s.value for s in depth.samples}["reconcile"] == 3
        assert counts[("reconcile", "waiting")] == 3
        assert counts[("reconcile", "reserved")] == 2
        assert counts[("reconcile", "scheduled")] == 1
        assert (counts[("billing", "scheduled")], counts[("billing", "reserved")]) == (1, 0)
    finally:
        client.delete("reconcile", "billing", "unacked")
