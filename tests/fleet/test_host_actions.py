"""Operator actions on hosts through the API: cordon, uncordon, drain, maintenance, retire,
bootstrap token, mark healthy — with their history, guarded transitions and signals."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from fleet import placement, signals
from fleet.models import Gpu, GpuHealthInterval, Host, HostEvent
from fleet.placement import GpuRequest

pytestmark = pytest.mark.django_db


@pytest.fixture
def host(make_host):
    return make_host("h100-sxm5-80gb", gpus=2, hostname="gpu-01")


@pytest.fixture
def caught():
    """Signals the fleet sent: ``[(signal name, kwargs)]``."""
    seen = []

    def make(name):
        def receiver(sender, **kwargs):
            kwargs.pop("signal", None)
            seen.append((name, kwargs))

        return receiver

    receivers = {
        "host_state_changed": make("host_state_changed"),
        "host_drain_requested": make("host_drain_requested"),
        "gpu_health_changed": make("gpu_health_changed"),
    }
    for name, fn in receivers.items():
        getattr(signals, name).connect(fn, weak=False)
    yield seen
    for name, fn in receivers.items():
        getattr(signals, name).disconnect(fn)


def post(client, host, action, body=None):
    return client.post(f"/api/v1/fleet/hosts/{host.id}/{action}", body or {}, format="json")


def hold(host, tenant, n=1):
    with transaction.atomic():
        placement.claim_gpus(
            [GpuRequest(uuid.UUID(int=n), tenant.id, "h100-sxm5-80gb", 1, "us-east-1")]
        )


def test_cordon_and_uncordon(operator, host, django_capture_on_commit_callbacks, caught):
    with django_capture_on_commit_callbacks(execute=True):
        resp = post(operator, host, "cordon", {"reason": "fan noise"})
    assert resp.status_code == 200, resp.content
    body = resp.json()
    actor = HostEvent.objects.get(host=host, kind="action").actor
    assert actor.startswith("apikey:")
    assert (body["state"], body["state_reason"]) == ("CORDONED", f"cordoned by {actor}: fan noise")
    assert body["state_actor"] == actor  # who holds it (a verified repair lifts only "agent")
    assert caught == [
        (
            "host_state_changed",
            {
                "host_id": host.id,
                "old_state": "AVAILABLE",
                "new_state": "CORDONED",
                "reason": body["state_reason"],
                "holder_ids": [],
            },
        )
    ]
    assert post(operator, host, "cordon").json()["state"] == "CORDONED"  # idempotent
    lifted = post(operator, host, "uncordon").json()
    assert (lifted["state"], lifted["state_actor"]) == ("AVAILABLE", actor)
    kinds = list(
        HostEvent.objects.filter(host=host)
        .order_by("ts", "id")
        .values_list("kind", "from_state", "to_state")
    )
    assert kinds == [
        ("action", "", ""),
        ("state", "AVAILABLE", "CORDONED"),
        ("action", "", ""),
        ("action", "", ""),
        ("state", "CORDONED", "AVAILABLE"),
    ]


def test_a_cordoned_host_gets_no_new_nodes(operator, host, tenant_a):
    post(operator, host, "cordon")
    with pytest.raises(placement.InsufficientCapacity), transaction.atomic():
        placement.claim_gpus(
            [GpuRequest(uuid.uuid4(), tenant_a.id, "h100-sxm5-80gb", 1, "us-east-1")]
        )


def test_drain_cordons_asks_for_the_nodes_and_finishes_when_they_are_gone(
    operator, host, tenant_a, django_capture_on_commit_callbacks, caught
):
    hold(host, tenant_a, n=1)
    hold(host, tenant_a, n=2)
    with django_capture_on_commit_callbacks(execute=True):
        body = post(operator, host, "drain", {"target": "MAINTENANCE"}).json()
    assert (body["state"], body["drain_target"]) == ("CORDONED", "MAINTENANCE")
    drains = [kw for name, kw in caught if name == "host_drain_requested"]
    assert len(drains) == 1
    assert sorted(drains[0]["holder_ids"]) == [uuid.UUID(int=1), uuid.UUID(int=2)]
    assert drains[0]["target_state"] == "MAINTENANCE"

    assert body["state_reason"] == "draining to MAINTENANCE: 0 of 2 node(s) moved, 2 pending"
    placement.release_gpus(uuid.UUID(int=1))
    left = Host.objects.get(pk=host.pk)
    assert (left.state, left.state_reason) == (  # one node left; nodes counted, not GPUs
        "CORDONED",
        "draining to MAINTENANCE: 1 of 2 node(s) moved, 1 pending",
    )
    placement.release_gpus(uuid.UUID(int=2))
    host.refresh_from_db()
    assert (host.state, host.drain_target, host.state_reason) == (
        "MAINTENANCE",
        "",
        "drained to MAINTENANCE: 2 of 2 node(s) moved, none pending",
    )


def test_maintenance_with_nothing_held_is_immediate(operator, host):
    assert post(operator, host, "maintenance").json()["state"] == "MAINTENANCE"
    assert post(operator, host, "uncordon").json()["state"] == "AVAILABLE"


def test_retire_is_final_and_revokes_the_agent(operator, anonymous, host):
    token = post(operator, host, "bootstrap-token").json()["bootstrap_token"]
    reg = anonymous.post("/api/v1/agent/register", {"bootstrap_token": token}, format="json")
    credential = reg.json()["credential"]
    assert post(operator, host, "retire").json()["state"] == "RETIRED"
    host.refresh_from_db()
    assert (host.credential_hash, host.bootstrap_token_hash) == ("", "")
    agent = anonymous.__class__()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    assert agent.post("/api/v1/agent/reports", {"seq": 1}, format="json").status_code == 401
    for action in ("uncordon", "cordon", "drain", "bootstrap-token"):
        resp = post(operator, host, action)
        assert resp.status_code == 409, action
        assert resp.json()["code"] in ("invalid_host_state", "host_retired"), action


def test_a_bad_drain_target_is_a_400_naming_the_field(operator, host):
    resp = post(operator, host, "drain", {"target": "AVAILABLE"})
    assert (resp.status_code, resp.json()["field"]) == (400, "target")


def test_uncordon_refuses_a_host_that_is_not_cordoned(operator, host):
    resp = post(operator, host, "uncordon")
    assert (resp.status_code, resp.json()["code"]) == (409, "invalid_host_state")


def test_mark_healthy_closes_the_open_intervals(
    operator, host, django_capture_on_commit_callbacks, caught
):
    from django.utils import timezone

    from fleet.health import open_unhealthy

    gpu = Gpu.objects.get(host=host, index=1)
    open_unhealthy(gpu, reason="xid", at=timezone.now(), needs_operator=True, xid=79)
    resp = post(operator, host, "mark-healthy", {"gpu_uuids": ["GPU-nope"]})
    assert (resp.status_code, resp.json()["code"]) == (400, "unknown_gpu_uuid")
    with django_capture_on_commit_callbacks(execute=True):
        resp = post(operator, host, "mark-healthy", {})
    assert resp.json() == {"marked_healthy": [gpu.uuid]}
    interval = GpuHealthInterval.objects.get()
    assert interval.ended_at is not None and interval.ended_by.startswith("apikey:")
    assert Gpu.objects.get(pk=gpu.pk).health == "HEALTHY"
    assert [kw["healthy"] for name, kw in caught if name == "gpu_health_changed"] == [True]


def test_host_history_checks_scrubs_and_health_are_listed(operator, import_capture):
    host = import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b").host
    events = operator.get(f"/api/v1/fleet/hosts/{host.id}/events").json()["results"]
    assert [e["kind"] for e in events] == ["check", "imported"]  # newest first
    checks = operator.get(f"/api/v1/fleet/hosts/{host.id}/checks").json()["results"]
    assert [(c["kind"], c["status"], c["source"]) for c in checks] == [
        ("onboarding", "PASSED", "nvidia-smi -q -x report")
    ]
    assert operator.get(f"/api/v1/fleet/hosts/{host.id}/scrubs").json()["results"] == []
    assert operator.get(f"/api/v1/fleet/hosts/{host.id}/health").json()["results"] == []


def test_tokens_never_start_with_a_dash_which_the_agent_cli_would_read_as_an_option(monkeypatch):
    import secrets as stdlib_secrets

    from fleet import secrets

    drawn = iter(["-starts-with-a-dash", "fine-token"])
    monkeypatch.setattr(stdlib_secrets, "token_urlsafe", lambda n: next(drawn))
    assert secrets.new_token() == "fine-token"


def test_the_host_list_filters_by_hostname_and_tenancy(operator, make_host):
    """A fresh-user trial's ``?hostname=`` was ignored (every host listed): by hand, three
    hosts, one named, one made shared."""
    from fleet.choices import HostTenancy
    from fleet.models import Host

    make_host("h100-sxm5-80gb", gpus=8, hostname="gpu-a")
    make_host("h100-sxm5-80gb", gpus=8, hostname="gpu-b")
    shared = make_host("h100-sxm5-80gb", gpus=8, hostname="gpu-c")
    Host.objects.filter(pk=shared.pk).update(tenancy=HostTenancy.SHARED)

    def names(query: str) -> list[str]:
        resp = operator.get(f"/api/v1/fleet/hosts?{query}")
        assert resp.status_code == 200, resp.content
        return [h["hostname"] for h in resp.json()["results"]]

    assert names("hostname=gpu-b") == ["gpu-b"]
    assert names("tenancy=shared") == ["gpu-c"]
    assert names("tenancy=dedicated") == ["gpu-a", "gpu-b"]
    assert names("hostname=none-such") == []
    assert operator.get("/api/v1/fleet/hosts?tenancy=neither").status_code == 400
