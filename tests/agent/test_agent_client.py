"""HTTP client against the local test server (``api_server`` in conftest), and the backoff."""

from __future__ import annotations

import random
import socket
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nvke_agent.client import (
    Ack,
    ApiClient,
    Backoff,
    Refused,
    RegistrationRefused,
    RetryLater,
    Stopped,
    Unauthorized,
    parse_retry_after,
)

FAST = {"base_s": 0.001, "cap_s": 0.01}


def _report(host_id: str, seq: int) -> dict:
    return {
        "host_id": host_id,
        "seq": seq,
        "agent_version": "0.1.0",
        "source": "replay",
        "sent_at": "2024-05-01T12:00:00.000000Z",
        "driver_version": None,
        "cuda_version": None,
        "inventory": None,
        "samples": [{"ts": "2024-05-01T12:00:00.000000Z", "gpu_uuid": "GPU-a"}],
        "events": [],
    }


# --- backoff --------------------------------------------------------------------------------


@given(
    base=st.floats(0.001, 5),
    cap=st.floats(5, 120),
    attempts=st.integers(0, 80),
    seed=st.integers(0, 2**32),
)
def test_full_jitter_stays_within_the_exponential_ceiling(
    base: float, cap: float, attempts: int, seed: int
) -> None:
    backoff = Backoff(base_s=base, cap_s=cap, rng=random.Random(seed))
    for attempt in range(attempts):
        ceiling = min(cap, base * 2**attempt)
        assert backoff.ceiling() == pytest.approx(ceiling)
        assert 0 <= backoff.next_delay() <= ceiling


@given(retry_after=st.floats(0, 3600), seed=st.integers(0, 2**32))
def test_retry_after_is_a_floor(retry_after: float, seed: int) -> None:
    backoff = Backoff(rng=random.Random(seed))
    assert backoff.next_delay(retry_after) >= retry_after


def test_backoff_resets_after_a_success() -> None:
    backoff = Backoff(base_s=1, cap_s=60)
    for _ in range(10):
        backoff.next_delay()
    assert backoff.ceiling() == 60
    backoff.reset()
    assert backoff.ceiling() == 1


def test_retry_after_parses_seconds_and_http_dates() -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert (
        parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now) == 30
    )
    assert (
        parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now=now) == 0
    )
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None


# --- register -------------------------------------------------------------------------------


def test_register_exchanges_a_bootstrap_token_for_a_credential(api_server) -> None:
    token = api_server.add_token()
    api_server.state.report_interval_s = 15
    registration = ApiClient(api_server.url).register(bootstrap_token=token, hostname="gpu-node-1")
    assert registration.host_id in api_server.state.hosts
    assert api_server.state.hosts[registration.host_id] == "gpu-node-1"
    assert api_server.state.credentials[registration.credential] == registration.host_id
    assert registration.report_interval_s == 15


def test_a_used_bootstrap_token_is_refused_with_the_servers_detail(api_server) -> None:
    token = api_server.add_token()
    client = ApiClient(api_server.url)
    client.register(bootstrap_token=token, hostname="a")
    with pytest.raises(RegistrationRefused) as info:
        client.register(bootstrap_token=token, hostname="a")
    assert info.value.status == 401
    assert info.value.code == "invalid_bootstrap_token"
    assert info.value.detail == "bootstrap token unknown, used or expired"


def test_register_retries_while_the_server_is_unavailable(api_server) -> None:
    token = api_server.add_token()
    api_server.fail_next(2, 503)
    registration = ApiClient(api_server.url).register(
        bootstrap_token=token, hostname="a", backoff=Backoff(**FAST)
    )
    assert registration.host_id in api_server.state.hosts
    assert [status for _, status, _ in api_server.state.requests] == [503, 503, 201]


def test_register_gives_up_waiting_when_stopped() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    client = ApiClient(f"http://127.0.0.1:{closed_port}", timeout=(0.5, 0.5))
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(Stopped):
        client.register(bootstrap_token="t", hostname="a", backoff=Backoff(**FAST), stop=stop)


# --- reports --------------------------------------------------------------------------------


def test_an_acknowledged_report_and_its_duplicate(api_server) -> None:
    host_id, credential = api_server.add_host()
    client = ApiClient(api_server.url)
    assert client.send_report(credential, _report(host_id, 1)) == Ack(1, False, 1, 0)
    assert client.send_report(credential, _report(host_id, 1)) == Ack(1, True, 0, 0)
    assert len(api_server.reports()) == 1


def test_a_bad_credential_raises_unauthorized(api_server) -> None:
    host_id, _ = api_server.add_host()
    with pytest.raises(Unauthorized) as info:
        ApiClient(api_server.url).send_report("wrong", _report(host_id, 1))
    assert info.value.status == 401


def test_a_final_4xx_is_refused(api_server) -> None:
    host_id, credential = api_server.add_host()
    api_server.state.refuse_seqs[3] = 422
    outcome = ApiClient(api_server.url).send_report(credential, _report(host_id, 3))
    assert outcome == Refused(422, "invalid_report: report 3 refused")


@pytest.mark.parametrize(
    ("status", "retry_after"), [(503, "2"), (500, None), (429, "1"), (408, None)]
)
def test_transient_statuses_ask_for_a_retry(
    api_server, status: int, retry_after: str | None
) -> None:
    host_id, credential = api_server.add_host()
    api_server.fail_next(1, status, retry_after)
    outcome = ApiClient(api_server.url).send_report(credential, _report(host_id, 1))
    assert isinstance(outcome, RetryLater)
    assert f"HTTP {status}" in outcome.reason
    assert outcome.retry_after_s == (float(retry_after) if retry_after else None)
    assert api_server.reports() == []


def test_a_connection_error_asks_for_a_retry() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    outcome = ApiClient(f"http://127.0.0.1:{port}").send_report("c", _report("h", 1))
    assert isinstance(outcome, RetryLater)
    assert "ConnectionError" in outcome.reason
