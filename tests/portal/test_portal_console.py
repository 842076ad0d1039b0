"""Operator console: fleet overview figures, host actions, tenants and quotas, prices."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.http import HttpRequest
from django.test import Client

from tests.portal.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def section(html: str, element_id: str) -> str:
    return html.split(f'id="{element_id}"')[1].split("</table>")[0]


def test_the_overview_counts_hosts_gpus_drivers_and_shows_xids_and_the_heatmap(
    ops_client, make_host, import_capture, tenant_a
):
    from django.utils import timezone

    from catalog.models import XidCode
    from fleet.models import Gpu, GpuRollup1h, Host, XidEvent

    h1 = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-01")
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1b", hostname="sim-h100-02")
    a10g = import_capture("a10g.xml", "gpu-a10g-01", "us-east-1a").host
    Host.objects.filter(pk=a10g.pk).update(state="NOT_READY", state_reason="no report for 120 s")
    gpus = list(Gpu.objects.filter(host=h1).order_by("index"))
    Gpu.objects.filter(pk=gpus[0].pk).update(health="UNHEALTHY", health_reason="Xid 79")
    Gpu.objects.filter(pk__in=[g.pk for g in gpus[1:3]]).update(
        holder_id="11111111-1111-1111-1111-111111111111", holder_tenant=tenant_a
    )
    now = timezone.now()
    XidEvent.objects.create(host=h1, gpu_uuid=gpus[0].uuid, ts=now, xid=79, report_seq=1)
    hour = now.replace(minute=0, second=0, microsecond=0)
    # two GPUs of sim-h100-01 in this hour: (30 + 60 + 90) + (0 + 20) over 5 samples = 40 %
    for gpu, total, n in ((gpus[0], 180.0, 3), (gpus[1], 20.0, 2)):
        GpuRollup1h.objects.create(
            bucket=hour,
            host=h1,
            gpu_uuid=gpu.uuid,
            samples=n,
            utilization_samples=n,
            utilization_gpu_pct_sum=total,
        )

    html = ops_client.get("/console/").content.decode()
    hosts = section(html, "hosts-by-state")
    # us-east-1a: sim-h100-01 AVAILABLE, gpu-a10g-01 NOT_READY; us-east-1b: one AVAILABLE
    assert re.sub(r"\s+", " ", hosts).count("<strong>2</strong>") == 1
    assert '<td class="bad">1</td>' in hosts and '<td class="ok">1</td>' in hosts
    gpus_table = section(html, "gpus-by-model")
    # free = placeable (fleet/placeable.py): the UNHEALTHY GPU is unavailable, not free (it
    # read 14 free, issue 33), and the silent (NOT_READY) A10G host's GPU is unavailable too
    assert (
        'h100-sxm5-80gb</a></td><td>16</td><td>15</td><td class="bad">1</td>'
        '<td>2</td><td>0</td><td>13</td><td class="bad">1</td>' in gpus_table
    )  # held 2, in instances 0, free 13, unavailable 1
    assert '<td>0</td><td>0</td><td>0</td><td class="bad">1</td></tr>' in gpus_table  # A10G
    drivers = section(html, "drivers")
    assert '<td class="mono">515.105.01</td><td>1</td><td>1</td>' in drivers
    assert '<td class="mono">unknown</td><td>2</td><td>16</td>' in drivers
    heat = section(html, "heatmap")
    assert 'title="40.0 %">40</td>' in heat and "sim-h100-01" in heat
    xids = section(html, "xids")
    code = XidCode.objects.get(code=79)
    assert "<strong>79</strong> ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in xids
    assert f">{code.severity}</span>" in xids
    assert "gpu-a10g-01" in section(html, "not-ready")
    frag = section(html, "fragmentation")
    # sim-h100-02 is wholly free; sim-h100-01 has 5 usable GPUs (1 unhealthy, 2 held)
    assert "<td>h100-sxm5-80gb</td><td>us-east-1b</td><td>1</td><td>1</td><td>8</td>" in frag


def test_an_operator_cordons_drains_and_uncordons_a_host(ops_client, h100_host):
    from fleet.models import HostEvent
    from tenants.models import AuditEvent

    url = f"/console/hosts/{h100_host.id}"
    page = ops_client.post(url + "/cordon", {"reason": "fan noise"}, follow=True).content.decode()
    h100_host.refresh_from_db()
    assert h100_host.state == "CORDONED"
    assert '<span id="host-state"><span class="badge busy">CORDONED</span></span>' in page
    assert "sim-h100-01: cordon done, now CORDONED." in page
    assert '<span class="small" id="host-actor">(set by user:ops)</span>' in page  # who holds it
    assert HostEvent.objects.filter(host=h100_host, actor="user:ops", message="cordon: fan noise")
    event = AuditEvent.objects.get(action="host.cordon")
    assert (event.actor, event.before, event.after) == (
        "user:ops",
        {"state": "AVAILABLE"},
        {"state": "CORDONED"},
    )
    ops_client.post(url + "/drain", {"target": "MAINTENANCE", "confirm_name": "sim-h100-01"})
    h100_host.refresh_from_db()
    assert h100_host.state == "MAINTENANCE"  # nothing held: the drain ends at once
    ops_client.post(url + "/uncordon")
    h100_host.refresh_from_db()
    assert h100_host.state == "AVAILABLE"
    ops_client.post(url + "/drain", {"target": "RETIRED", "confirm_name": "sim-h100-01"})
    refused = ops_client.post(url + "/cordon", follow=True).content.decode()
    assert "(invalid_host_state)" in refused and "in state RETIRED" in refused
    assert ops_client.post(url + "/explode").status_code == 404


def test_an_operator_creates_a_tenant_whose_owner_can_log_in(ops_client):
    from tenants.models import Membership, Tenant

    response = ops_client.post(
        "/console/tenants",
        {
            "name": "initech",
            "owner_username": "peter",
            "owner_email": "peter@initech.example",
            "owner_password": "tps-report-2026",
        },
    )
    tenant = Tenant.objects.get(name="initech")
    assert response["Location"] == f"/console/tenants/{tenant.id}"
    assert Membership.objects.get(tenant=tenant).role == "owner"
    peter = Client()
    assert peter.login(request=HttpRequest(), username="peter", password="tps-report-2026")
    assert peter.get("/clusters").status_code == 200
    for taken in ("peter", "Peter"):  # a name differing only in case is the same name
        again = ops_client.post(
            "/console/tenants",
            {"name": "initech-2", "owner_username": taken, "owner_password": "x" * 8},
        ).content.decode()
        assert "a user of this name (in any letter case) exists already" in again
    assert not Tenant.objects.filter(name="initech-2").exists()
    bad_name = ops_client.post(
        "/console/tenants",
        {"name": "Initech Two", "owner_username": "milton", "owner_password": "red-stapler-2026"},
    ).content.decode()
    assert "name must be lower-case letters, digits and &#x27;-&#x27;" in bad_name
    assert 'id="id_name-error"' in bad_name
    assert Tenant.objects.count() == 1
    assert not Client().login(request=HttpRequest(), username="milton", password="red-stapler-2026")


def test_an_operator_sets_a_quota_and_the_change_is_audited(ops_client, tenant_a, catalog):
    from tenants.models import AuditEvent, Quota

    url = f"/console/tenants/{tenant_a.id}"
    response = ops_client.post(
        url, {"max_clusters": "3", "max_nodes": "10", "max_gpus": "h100-sxm5-80gb=16\n"}
    )
    assert response.status_code == 302
    quota = Quota.objects.get(tenant=tenant_a)
    assert (quota.max_clusters, quota.max_nodes, quota.max_gpus) == (
        3,
        10,
        {"h100-sxm5-80gb": 16},
    )
    assert AuditEvent.objects.get(action="quota.set").after == {
        "clusters": 3,
        "nodes": 10,
        "max_gpus": {"h100-sxm5-80gb": 16},
    }
    refused = ops_client.post(
        url, {"max_clusters": "3", "max_nodes": "10", "max_gpus": "h200=8"}
    ).content.decode()
    assert "unknown GPU model(s): h200" in refused
    assert '<code class="code">unknown_gpu_model</code>' in refused
    assert Quota.objects.get(tenant=tenant_a).max_gpus == {"h100-sxm5-80gb": 16}


def test_an_operator_publishes_price_versions(ops_client, catalog):
    from billing.models import Price

    form = {
        "gpu_model": "h100-sxm5-80gb",
        "hourly_rate": "2.50",
        "currency": "USD",
        "effective_from": "2026-11-01T00:00",
        "label": "list",
    }
    assert ops_client.post("/console/prices", form).status_code == 302
    later = dict(form, hourly_rate="3.00", effective_from="2026-11-02T11:30")
    assert ops_client.post("/console/prices", later).status_code == 302
    versions = list(Price.objects.order_by("effective").values_list("hourly_rate", "effective"))
    cut = datetime(2026, 11, 2, 11, 30, tzinfo=UTC)
    assert [(rate, r.lower, r.upper) for rate, r in versions] == [
        (Decimal("2.500000"), cut - timedelta(days=1, hours=11, minutes=30), cut),
        (Decimal("3.000000"), cut, None),
    ]
    earlier = dict(form, effective_from="2026-11-01T12:00")
    refused = ops_client.post("/console/prices", earlier).content.decode()
    assert "a later price version exists; end or remove it first" in refused
    assert 'id="id_effective_from-error"' in refused
    listing = ops_client.get("/console/prices").content.decode()
    assert "2.5 USD" in listing and "3 USD" in listing


def test_the_operator_also_sees_every_tenants_clusters_in_the_portal(
    ops_client, tenant_a, tenant_b, portal_user
):
    from clusters.models import Cluster

    for tenant, name in ((tenant_a, "alpha"), (tenant_b, "beta")):
        Cluster.objects.create(
            tenant=tenant, name=name, kubernetes_version="1.36", region="us-east-1"
        )
    html = ops_client.get("/clusters").content.decode()
    assert 'data-cluster="alpha"' in html and 'data-cluster="beta"' in html
    assert "<td>tenant-a</td>" in html and "<td>tenant-b</td>" in html
    assert Client().login(request=HttpRequest(), username="ops", password=PASSWORD)


def test_portal_demo_makes_logins_simulated_h100s_and_demo_prices(catalog, tmp_path):
    from django.core.management import call_command

    from billing.models import Price
    from fleet.models import Gpu, Host
    from tenants.models import Membership

    out = io.StringIO()
    call_command("portal_demo", "--data-dir", str(tmp_path), stdout=out)
    call_command("portal_demo", "--data-dir", str(tmp_path), stdout=out)  # idempotent
    assert "login demo exists (password unchanged)" in out.getvalue()
    hosts = Host.objects.filter(hostname__startswith="sim-h100-").order_by("hostname")
    assert [(h.hostname, h.zone, h.region, h.gpu_count) for h in hosts] == [
        ("sim-h100-01", "us-east-1a", "us-east-1", 8),
        ("sim-h100-02", "us-east-1a", "us-east-1", 8),
    ]
    assert Gpu.objects.filter(host__in=hosts).count() == 16
    # simulated hosts like seed_demo's: their agent reports a driver (nodes' rows show it)
    assert [h.driver_version for h in hosts] == ["570.172.08", "570.172.08"]
    assert {p.gpu_model_id: p.hourly_rate for p in Price.objects.all()} == {
        "h100-sxm5-80gb": Decimal("2.5"),
        "a100-sxm4-80gb": Decimal("1.8"),
        "a10g": Decimal("0.75"),
        "t4": Decimal("0.35"),
        "gb200": Decimal("6"),
        "h200-sxm-141gb": Decimal("3.2"),
        "h100-nvl-94gb": Decimal("2.3"),
    }
    demo = Membership.objects.get(user__username="demo")
    assert (demo.tenant.name, demo.role) == ("demo", "owner")
    for login, landing in (("operator", "/console/"), ("demo", "/clusters")):
        password = tmp_path / f"portal-{login}-password"
        client = Client()
        assert client.login(
            request=HttpRequest(), username=login, password=password.read_text().strip()
        )
        assert client.get("/")["Location"] == landing
    assert oct((tmp_path / "portal-demo-password").stat().st_mode)[-3:] == "600"


def test_the_tenants_page_shows_each_tenants_gpu_hours_of_the_last_30_days(
    ops_client, tenant_a, tenant_b, catalog
):
    """Two usage records of tenant A an hour apart: 3,600 + 5,400 GPU-s = 2.5 GPU-hours; a
    record 31 days old is outside the window; tenant B has none."""
    from django.utils import timezone

    from billing.models import UsageRecord
    from clusters.models import Cluster
    from nodepools.models import NodePool

    cluster = Cluster.objects.create(
        tenant=tenant_a, name="c", kubernetes_version="1.36", region="us-east-1"
    )
    pool = NodePool.objects.create(
        tenant=tenant_a,
        cluster=cluster,
        name="p",
        gpu_model_id="h100-sxm5-80gb",
        gpus_per_node=1,
        node_count=1,
    )
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    for start, seconds in (
        (hour - timedelta(hours=2), 3600),
        (hour - timedelta(hours=1), 5400),
        (hour - timedelta(days=31), 7200),
    ):
        UsageRecord.objects.create(
            tenant=tenant_a,
            cluster=cluster,
            nodepool=pool,
            gpu_model="h100-sxm5-80gb",
            start=start,
            end=start + timedelta(hours=1),
            gpu_seconds=seconds,
            allocated_seconds=seconds,
            sla_credit_gpu_seconds=0,
            computed_at=hour,
        )
    html = ops_client.get("/console/tenants").content.decode()
    row_a = html.split('data-tenant="tenant-a"')[1].split("</tr>")[0]
    row_b = html.split('data-tenant="tenant-b"')[1].split("</tr>")[0]
    assert '<td class="gpu-hours">2.500</td>' in row_a
    assert '<td class="gpu-hours">0.000</td>' in row_b


def test_an_operator_ends_one_gpus_unhealthy_interval_from_the_console_audited(
    ops_client, h100_host
):
    """The intervals table has an "End interval" button per open interval: it ends that GPU's
    interval only (the end of its SLA credit) and writes one audit event naming it."""
    from django.utils import timezone

    from fleet.health import open_unhealthy
    from fleet.models import Gpu, GpuHealthInterval
    from tenants.models import AuditEvent

    first, second = Gpu.objects.filter(host=h100_host).order_by("index")[:2]
    started = timezone.now() - timedelta(minutes=5)
    a = open_unhealthy(first, reason="xid", at=started, needs_operator=True, xid=48)
    b = open_unhealthy(second, reason="xid", at=started, needs_operator=True, xid=48)
    url = f"/console/hosts/{h100_host.id}"
    page = ops_client.get(url).content.decode()
    assert f'id="end-interval-{a.pk}"' in page and f'id="end-interval-{b.pk}"' in page
    page = ops_client.post(
        url + "/mark-healthy", {"gpu_uuid": first.uuid}, follow=True
    ).content.decode()
    assert f"Marked healthy: {first.uuid}." in page
    a, b = GpuHealthInterval.objects.get(pk=a.pk), GpuHealthInterval.objects.get(pk=b.pk)
    assert (a.ended_by, b.ended_at) == ("user:ops", None)
    event = AuditEvent.objects.get(action="host.mark_healthy")
    assert (event.actor, event.target_id) == ("user:ops", str(h100_host.pk))
    assert [i["gpu_uuid"] for i in event.after["intervals_ended"]] == [first.uuid]
    refused = ops_client.post(url + "/mark-healthy", {"gpu_uuid": "GPU-other"}, follow=True)
    assert "(unknown_gpu)" in refused.content.decode()
    assert GpuHealthInterval.objects.get(pk=b.pk).ended_at is None


def test_portal_demo_writes_its_passwords_into_nvke_data_dir(catalog, tmp_path, monkeypatch):
    """``make run`` keeps its data in ``$NVKE_DATA_DIR``; portal_demo wrote the passwords to
    ./.nvke whatever that said. Without ``--data-dir`` it now follows the variable."""
    from django.core.management import call_command

    data_dir = tmp_path / "data"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("NVKE_DATA_DIR", str(data_dir))
    call_command("portal_demo", "--password", "violet-anchor-harbour-42", stdout=io.StringIO())
    assert sorted(p.name for p in data_dir.iterdir()) == [
        "portal-demo-password",
        "portal-operator-password",
    ]
    assert (data_dir / "portal-demo-password").read_text().strip() == "violet-anchor-harbour-42"
    assert oct((data_dir / "portal-demo-password").stat().st_mode & 0o777) == "0o600"
    assert not (cwd / ".nvke").exists()
    # --data-dir still wins over the variable
    other = tmp_path / "other"
    call_command("portal_demo", "--data-dir", str(other), stdout=io.StringIO())
    assert not (other / "portal-demo-password").exists()  # logins exist: files not rewritten
    assert other.is_dir()


def test_the_control_planes_page_lists_each_hosted_control_plane_as_observed(ops_client, tenant_a):
    from clusters.models import Cluster, HostedControlPlane

    cluster = Cluster.objects.create(
        tenant=tenant_a, name="llm", kubernetes_version="1.37", region="us-east-1",
        provider="hosted",
    )  # fmt: skip
    HostedControlPlane.objects.create(
        cluster=cluster, version="1.37", port=16423, pki_encrypted="x", ca_cert="-",
        state="restarting", ready=False, running_version="1.36.3", restarts=2,
        rss_bytes=437 * 2**20,
        message="kube-apiserver exited (killed by SIGKILL); restarting in 2 s (restart 2)",
    )  # fmt: skip
    html = ops_client.get("/console/control-planes").content.decode()
    row = section(html, "control-planes")
    assert "llm" in row and "tenant-a" in row
    assert "https://127.0.0.1:16423" in row
    assert "(runs 1.36.3)" in row and "restarting" in row and "not ready" in row
    assert "437 MiB" in row
    assert "killed by SIGKILL" in row
