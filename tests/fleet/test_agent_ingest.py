"""Agent registration and report ingestion through the HTTP API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from rest_framework.test import APIClient

from tests.conftest import capture

pytestmark = pytest.mark.django_db

A10G = "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"


@pytest.fixture
def agent(operator, anonymous, catalog):
    host = operator.post(
        "/api/v1/fleet/hosts",
        {"hostname": "h1", "zone": "us-east-1a", "nvidia_smi_xml": capture("a10g.xml")},
        format="json",
    ).json()
    reg = anonymous.post(
        "/api/v1/agent/register", {"bootstrap_token": host["bootstrap_token"]}, format="json"
    ).json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {reg['credential']}")
    return client, reg["host_id"]


def report(client, host_id, seq, samples, **extra):
    body = {"host_id": host_id, "seq": seq, "samples": samples, **extra}
    return client.post("/api/v1/agent/reports", body, format="json")


def sample(ts, uuid=A10G, util=50.0):
    return {"ts": ts.isoformat(), "gpu_uuid": uuid, "utilization_gpu_pct": util, "power_mw": 25580}


def stored():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT gpu_uuid, ts, utilization_gpu_pct, power_mw FROM fleet_gpusample ORDER BY ts"
        )
        return cursor.fetchall()


def test_reports_are_idempotent_on_host_and_seq(agent):
    client, host_id = agent
    now = datetime.now(UTC).replace(microsecond=0)
    first = report(client, host_id, 1, [sample(now), sample(now + timedelta(seconds=10))])
    assert first.status_code == 200
    assert first.json() == {
        "seq": 1,
        "duplicate": False,
        "samples_stored": 2,
        "samples_rejected": 0,
        "samples_deduplicated": 0,
        "rejections": {},
        "commands": [],
    }
    again = report(client, host_id, 1, [sample(now), sample(now + timedelta(seconds=10))])
    assert again.json() == {
        "seq": 1,
        "duplicate": True,
        "samples_stored": 2,
        "samples_rejected": 0,
        "samples_deduplicated": 0,
        "rejections": {},
        "commands": [],
    }
    assert stored() == [
        (A10G, now, 50.0, 25580),
        (A10G, now + timedelta(seconds=10), 50.0, 25580),
    ]


def test_samples_of_other_gpus_or_far_off_clocks_are_rejected(agent):
    client, host_id = agent
    now = datetime.now(UTC)
    resp = report(
        client,
        host_id,
        1,
        [
            sample(now),
            sample(now, uuid="GPU-00000000-0000-0000-0000-000000000000"),
            sample(now + timedelta(days=2)),
            sample(now - timedelta(days=400)),
        ],
    )
    assert resp.json()["samples_stored"] == 1
    assert resp.json()["samples_rejected"] == 3
    assert len(stored()) == 1


def test_na_utilization_is_stored_as_null(agent):
    client, host_id = agent
    now = datetime.now(UTC).replace(microsecond=0)
    report(client, host_id, 1, [sample(now, util=None)])
    assert stored() == [(A10G, now, None, 25580)]


def test_an_agent_seeing_fewer_gpus_flags_the_host_without_shrinking_it(agent, operator):
    client, host_id = agent
    report(client, host_id, 1, [], inventory={"gpus": []}, driver_version="550.54.15")
    host = operator.get(f"/api/v1/fleet/hosts/{host_id}").json()
    assert host["gpu_count"] == 1 and len(host["gpus"]) == 1
    assert host["warnings"] == [f"agent inventory: GPU(s) not reported: {A10G}"]
    assert host["driver_version"] == "550.54.15"
    assert host["last_report_seq"] == 1


def test_bad_credentials_and_bad_bodies(agent, anonymous):
    client, host_id = agent
    resp = anonymous.post("/api/v1/agent/reports", {"seq": 1}, format="json")
    assert resp.status_code == 401
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer not-a-credential")
    assert bad.post("/api/v1/agent/reports", {"seq": 1}, format="json").status_code == 401
    resp = report(client, host_id, 0, [])
    assert (resp.status_code, resp.json()["code"], resp.json()["field"]) == (
        400,
        "invalid_report",
        "seq",
    )
    resp = report(client, host_id, 2, [{"ts": "noon", "gpu_uuid": A10G}])
    assert resp.json()["field"] == "samples[0].ts"


def test_samples_land_in_daily_partitions(agent):
    client, host_id = agent
    now = datetime.now(UTC)
    report(client, host_id, 1, [sample(now)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM fleet_gpusample")
        (partition,) = cursor.fetchone()
    assert partition == f"fleet_gpusample_p{now:%Y%m%d}"


# --- what real fleets send ----------------------------------------------------------------------

A100 = "GPU-513536b6-7d19-9063-b049-1e69664bb298"


@pytest.fixture
def a100_agent(operator, anonymous, catalog):
    """The A100 capture (MIG on, GIs 3-6) imported and its agent registered."""
    host = operator.post(
        "/api/v1/fleet/hosts",
        {
            "hostname": "h-a100",
            "zone": "us-east-1a",
            "nvidia_smi_xml": capture("a100-sxm4-v12.xml"),
        },
        format="json",
    ).json()
    reg = anonymous.post(
        "/api/v1/agent/register", {"bootstrap_token": host["bootstrap_token"]}, format="json"
    ).json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {reg['credential']}")
    return client, reg["host_id"]


def rows(
    sql="SELECT gpu_uuid, mig_gpu_instance_id, ts, utilization_gpu_pct, memory_used_bytes "
    "FROM fleet_gpusample ORDER BY gpu_uuid, mig_gpu_instance_id NULLS FIRST, ts",
):
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def test_a_gpu_listed_once_per_mig_instance_is_stored_once(a100_agent):
    client, host_id = a100_agent
    now = datetime.now(UTC).replace(microsecond=0)
    gpu = {
        "ts": now.isoformat(),
        "gpu_uuid": A100,
        "utilization_gpu_pct": None,
        "memory_used_bytes": 50 * 2**20,
    }
    migs = [
        {
            "ts": now.isoformat(),
            "gpu_uuid": A100,
            "mig_gpu_instance_id": gi,
            "memory_used_bytes": 12 * 2**20,
        }
        for gi in (3, 4, 5, 6)
    ]
    # the physical GPU comes once per MIG instance (4 times), as some exporters print it
    body = report(client, host_id, 1, [gpu, migs[0], gpu, migs[1], gpu, migs[2], gpu, migs[3]])
    assert body.json()["samples_stored"] == 5
    assert body.json()["samples_deduplicated"] == 3
    assert rows() == [
        (A100, None, now, None, 50 * 2**20),
        *[(A100, gi, now, None, 12 * 2**20) for gi in (3, 4, 5, 6)],
    ]


def test_a_sample_keyed_by_a_mig_device_uuid_is_stored_under_its_gpu(a100_agent, operator):
    client, host_id = a100_agent
    mig_uuid = "MIG-11111111-2222-3333-4444-555555555555"
    inventory = {
        "gpus": [
            {
                "uuid": A100,
                "index": 0,
                "mig_mode": "enabled",
                "mig_devices": [{"uuid": mig_uuid, "gpu_instance_id": 5, "compute_instance_id": 0}],
            }
        ]
    }
    report(client, host_id, 1, [], inventory=inventory)
    now = datetime.now(UTC).replace(microsecond=0)
    resp = report(
        client, host_id, 2, [{"ts": now.isoformat(), "gpu_uuid": mig_uuid, "memory_used_bytes": 7}]
    )
    assert resp.json()["samples_stored"] == 1
    assert rows() == [(A100, 5, now, None, 7)]


def test_rejected_samples_are_counted_by_reason(agent):
    client, host_id = agent
    now = datetime.now(UTC)
    resp = report(
        client,
        host_id,
        1,
        [
            sample(now),
            sample(now, uuid="GPU-00000000-0000-0000-0000-000000000000"),
            sample(now + timedelta(minutes=6)),  # > NVKE_SAMPLE_MAX_FUTURE_S (300 s) ahead
            sample(now + timedelta(minutes=4)),  # within it: kept
            sample(now - timedelta(days=15)),  # older than the 14-day retention
        ],
    )
    assert resp.json()["rejections"] == {
        "unknown_gpu": 1,
        "ts_in_future": 1,
        "ts_older_than_retention": 1,
    }
    assert (resp.json()["samples_stored"], resp.json()["samples_rejected"]) == (2, 3)
    from fleet.models import AgentReport

    assert AgentReport.objects.get().rejections == resp.json()["rejections"]


def test_a_gpu_missing_from_the_inventory_is_flagged_until_it_comes_back(
    agent, operator, tenant_a, django_capture_on_commit_callbacks
):
    from fleet.models import Gpu, GpuHealthInterval

    client, host_id = agent
    with django_capture_on_commit_callbacks(execute=True):
        report(client, host_id, 1, [], inventory={"gpus": []})
    gpu = Gpu.objects.get(uuid=A10G)
    assert gpu.missing_since is not None and gpu.health == "UNHEALTHY"
    host = operator.get(f"/api/v1/fleet/hosts/{host_id}").json()
    assert (host["gpu_count"], len(host["gpus"])) == (1, 1)  # never shrunk
    # not placeable while missing
    import uuid as uuidlib

    from django.db import transaction

    from fleet import placement

    with pytest.raises(placement.InsufficientCapacity), transaction.atomic():
        placement.claim_gpus(
            [placement.GpuRequest(uuidlib.uuid4(), tenant_a.id, "a10g", 1, "us-east-1")]
        )
    report(client, host_id, 2, [], inventory={"gpus": [{"uuid": A10G, "index": 0}]})
    gpu.refresh_from_db()
    assert (gpu.missing_since, gpu.health) == (None, "HEALTHY")
    interval = GpuHealthInterval.objects.get()
    assert (interval.reason, interval.needs_operator, interval.ended_by) == (
        "gpu_missing",
        False,
        "listed by the agent again",
    )
    assert operator.get(f"/api/v1/fleet/hosts/{host_id}").json()["warnings"] == []


def test_an_agent_clock_far_off_is_a_host_warning(agent, operator):
    client, host_id = agent
    sent_at = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    report(client, host_id, 1, [], sent_at=sent_at)
    (warning,) = operator.get(f"/api/v1/fleet/hosts/{host_id}").json()["warnings"]
    assert warning.startswith("agent clock: about 600 s ahead of the server's")
    assert "re-dated by -600 s" in warning
    report(client, host_id, 2, [], sent_at=datetime.now(UTC).isoformat())
    assert operator.get(f"/api/v1/fleet/hosts/{host_id}").json()["warnings"] == []


def xid(ts, code, uuid=A10G):
    return {
        "ts": ts.isoformat(),
        "gpu_uuid": uuid,
        "type": "xid",
        "xid": code,
        "message": f"Xid {code}",
    }


def test_xids_map_to_the_catalogs_action(agent, operator, django_capture_on_commit_callbacks):
    from fleet import signals
    from fleet.models import GpuHealthInterval, HostEvent

    seen = []

    def receiver(sender, **kwargs):
        seen.append({k: kwargs[k] for k in ("gpu_uuid", "healthy", "reason", "xid", "action")})

    signals.gpu_health_changed.connect(receiver)
    try:
        client, host_id = agent
        now = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=10)
        with django_capture_on_commit_callbacks(execute=True):
            report(client, host_id, 1, [], events=[xid(now, 13)])  # RESTART_APP: log only
        assert seen == []
        assert HostEvent.objects.filter(kind="xid").get().message.startswith("Xid 13")
        with django_capture_on_commit_callbacks(execute=True):
            report(client, host_id, 2, [], events=[xid(now + timedelta(seconds=1), 79)])
    finally:
        signals.gpu_health_changed.disconnect(receiver)
    # 79: fallen off the bus, NVIDIA immediate action RESTART_BM: unhealthy and host cordoned
    assert seen == [
        {"gpu_uuid": A10G, "healthy": False, "reason": "xid", "xid": 79, "action": "RESTART_BM"}
    ]
    interval = GpuHealthInterval.objects.get()
    assert (interval.started_at, interval.needs_operator) == (now + timedelta(seconds=1), True)
    host = operator.get(f"/api/v1/fleet/hosts/{host_id}").json()
    assert host["state"] == "CORDONED"
    assert host["state_reason"].endswith(f"on {A10G}: RESTART_BM")


def test_an_xid_the_catalog_does_not_know_marks_the_gpu_unhealthy(agent):
    from fleet.models import GpuHealthInterval

    client, host_id = agent
    report(client, host_id, 1, [], events=[xid(datetime.now(UTC), 999)])
    interval = GpuHealthInterval.objects.get()
    assert (interval.xid, interval.action, interval.needs_operator) == (999, "UNKNOWN_XID", True)


def test_a_full_batch_of_xids_costs_the_same_queries_as_a_few_and_means_the_same(agent, operator):
    """1,000 events (the per-report maximum) of four codes on the host's one GPU: every one is
    logged, the GPU gets ONE interval (its first critical Xid, 48 DBE at t+1), the later other
    critical codes (79, 999) one "also" line each, the host is cordoned once by 79 (RESTART_BM).
    Worked by hand: events i = 0..999 at t+i s with code [13, 48, 79, 999][i % 4]. A probe
    found the old per-event path ~30 ms an event (a 1,000-event report timed the worker out);
    the number of queries must not grow with the batch."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.models import GpuHealthInterval, HostEvent

    client, host_id = agent
    t = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    codes = [13, 48, 79, 999]

    def batch(n, offset):
        return [xid(t + timedelta(seconds=offset + i), codes[i % 4]) for i in range(n)]

    with CaptureQueriesContext(connection) as few:
        assert report(client, host_id, 1, [], events=batch(8, 0)).status_code == 200
    GpuHealthInterval.objects.all().delete()
    HostEvent.objects.all().delete()
    operator.post(f"/api/v1/fleet/hosts/{host_id}/uncordon")
    with CaptureQueriesContext(connection) as full:
        response = report(client, host_id, 2, [], events=batch(1000, 10))
    assert response.status_code == 200, response.json()
    assert len(full.captured_queries) <= len(few.captured_queries) + 2
    assert HostEvent.objects.filter(kind="xid").count() == 1000
    interval = GpuHealthInterval.objects.get()
    assert (interval.xid, interval.started_at) == (48, t + timedelta(seconds=11))
    also = sorted(
        HostEvent.objects.filter(kind="state", message__contains="also").values_list(
            "data__xid", flat=True
        )
    )
    assert also == [79, 999]
    host = operator.get(f"/api/v1/fleet/hosts/{host_id}").json()
    assert host["state"] == "CORDONED"
    assert host["state_reason"] == f"Xid 79 {_mnemonic(79)} on {A10G}: RESTART_BM"


def _mnemonic(code):
    from catalog.services import get_xid_code

    return get_xid_code(code).mnemonic


def MIG(gi, start, size):
    return {"uuid": None, "gpu_instance_id": gi, "placement_start": start, "placement_size": size}


@pytest.mark.parametrize(
    ("inventory", "field", "code"),
    [
        (
            {"gpus": [{"uuid": ["not", "a", "string"]}]},
            "inventory.gpus[0].uuid",
            "invalid_gpu_uuid",
        ),
        (
            {"gpus": [{"uuid": A10G, "health": "HEALTHY", "attributes": [1], "mig_devices": "x"}]},
            "inventory.gpus[0].mig_devices",
            "invalid_type",
        ),
        ({"gpus": "all of them"}, "inventory.gpus", "invalid_type"),
        (
            {"gpus": [{"uuid": A10G}], "topology": {"links": "NV18"}},
            "inventory.topology.links",
            "invalid_type",
        ),
        (["not", "an", "object"], "inventory", "invalid_type"),
        (
            {"gpus": [{"uuid": A10G, "mig_devices": [{"uuid": None, "gpu_instance_id": "1"}]}]},
            "inventory.gpus[0].mig_devices[0].gpu_instance_id",
            "invalid_type",
        ),
        ({"gpus": [{"uuid": "GPU-" + "f" * 5000}]}, "inventory.gpus[0].uuid", "invalid_gpu_uuid"),
        # found by the hostile-agent probe: stored verbatim before
        (
            {"gpus": [{"uuid": A10G, "mig_devices": [{"uuid": None, "profile": {"a": [1]}}]}]},
            "inventory.gpus[0].mig_devices[0].profile",
            "invalid_type",
        ),
        (
            {"gpus": [{"uuid": A10G, "mig_devices": [{"uuid": None, "placement_start": "x"}]}]},
            "inventory.gpus[0].mig_devices[0].placement_start",
            "invalid_type",
        ),
        (
            {"gpus": [{"uuid": A10G, "mig_devices": [{"uuid": None, "placement_size": 9}]}]},
            "inventory.gpus[0].mig_devices[0].placement_size",
            "number_out_of_range",
        ),
        # found by the re-probe: devices that cannot exist together were stored
        (
            {"gpus": [{"uuid": A10G, "mig_devices": [MIG(3, 7, 2)]}]},
            "inventory.gpus[0].mig_devices[0].placement_size",
            "number_out_of_range",
        ),
        (
            {"gpus": [{"uuid": A10G, "mig_devices": [MIG(1, 0, 4), MIG(2, 2, 2)]}]},
            "inventory.gpus[0].mig_devices[1].placement_start",
            "overlapping_mig_devices",
        ),
        (
            {"gpus": [{"uuid": A10G, "mig_devices": [MIG(3, 0, 1), MIG(3, 4, 1)]}]},
            "inventory.gpus[0].mig_devices[1].placement_start",
            "invalid_value",
        ),
        (
            {"gpus": [{"uuid": A10G, "mig_mode": "disabled", "mig_devices": [MIG(1, 0, 1)]}]},
            "inventory.gpus[0].mig_devices",
            "invalid_value",
        ),
        (
            {"gpus": [{"uuid": A10G, "mig_devices": [{"uuid": None, "gpu_instance_id": -1}]}]},
            "inventory.gpus[0].mig_devices[0].gpu_instance_id",
            "number_out_of_range",
        ),
        (
            {"gpus": [{"uuid": A10G, "attributes": {"serial": 7}}]},
            "inventory.gpus[0].attributes.serial",
            "invalid_type",
        ),
        # found by the re-probe: any health value was stored and read by the checks (a string
        # "yes" is not `True`: a GPU needing a reset would have passed)
        (
            {"gpus": [{"uuid": A10G, "health": {"reset_required": "yes"}}]},
            "inventory.gpus[0].health.reset_required",
            "invalid_type",
        ),
        (
            {"gpus": [{"uuid": A10G, "health": {"remapped_rows_pending": 1}}]},
            "inventory.gpus[0].health.remapped_rows_pending",
            "invalid_type",
        ),
        (
            {"gpus": [{"uuid": A10G, "health": {"ecc_volatile_uncorrected": -3}}]},
            "inventory.gpus[0].health.ecc_volatile_uncorrected",
            "number_out_of_range",
        ),
        (
            {"gpus": [{"uuid": A10G, "health": {"retired_pages_dbe": 2.5}}]},
            "inventory.gpus[0].health.retired_pages_dbe",
            "invalid_type",
        ),
        (
            {"gpus": [{"uuid": A10G, "health": {"mig_mode_pending": "ENABLED"}}]},
            "inventory.gpus[0].health.mig_mode_pending",
            "invalid_type",
        ),
        (
            {"gpus": [{"uuid": A10G, "health": {"gpu_recovery_action": 5}}]},
            "inventory.gpus[0].health.gpu_recovery_action",
            "number_out_of_range",
        ),
        (
            {"gpus": [{"uuid": A10G, "health": {"status": "HEALTHY"}}]},
            "inventory.gpus[0].health.status",
            "unknown_health_fact",
        ),
        (
            {"gpus": [{"uuid": A10G, "health": "HEALTHY"}]},
            "inventory.gpus[0].health",
            "invalid_type",
        ),
    ],
)
def test_a_malformed_inventory_is_refused_whole_and_the_next_good_report_is_accepted(
    agent, inventory, field, code
):
    from fleet.models import AgentReport, Gpu

    client, host_id = agent
    before = list(Gpu.objects.values_list("uuid", "mig_devices", "attributes", "health_counters"))
    bad = report(client, host_id, 1, [], inventory=inventory)
    assert bad.status_code == 400, bad.content
    assert (bad.json()["field"], bad.json()["code"]) == (field, code)
    # refused whole: no report row, no GPU changed
    assert not AgentReport.objects.exists()
    assert (
        list(Gpu.objects.values_list("uuid", "mig_devices", "attributes", "health_counters"))
        == before
    )
    good = report(client, host_id, 2, [], inventory={"gpus": [{"uuid": A10G, "mig_mode": None}]})
    assert good.status_code == 200, good.content
    assert good.json()["seq"] == 2
    assert AgentReport.objects.get().seq == 2


def test_the_agents_topology_sets_the_nvlink_islands(make_host, anonymous, operator):
    from fleet.models import Gpu
    from fleet.services import reissue_bootstrap_token

    host = make_host("h100-nvl-94gb", gpus=2, hostname="nvl")
    token = reissue_bootstrap_token(host)
    reg = anonymous.post("/api/v1/agent/register", {"bootstrap_token": token}, format="json")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {reg.json()['credential']}")
    uuids = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    inventory = {
        "gpus": [{"uuid": u, "index": i} for i, u in enumerate(uuids)],
        "topology": {"links": [["X", "NV12"], ["NV12", "X"]]},
    }
    report(client, str(host.id), 1, [], inventory=inventory)
    body = operator.get(f"/api/v1/fleet/hosts/{host.id}").json()
    assert body["topology"]["source"] == "nvml"
    assert body["topology"]["islands"] == [[0, 1]]
    assert list(Gpu.objects.filter(host=host).values_list("nvlink_island", flat=True)) == [0, 0]


def test_a_sample_resent_under_a_new_seq_is_stored_once(agent):
    """Samples are unique per (GPU, MIG GI, ts): a second report (new seq) carrying the same
    sample beside a new one stores only the new one and says so in its acknowledgement."""
    client, host_id = agent
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    first = report(client, host_id, 1, [sample(t0, util=10.0)]).json()
    assert (first["samples_stored"], first["samples_deduplicated"]) == (1, 0)
    again = report(client, host_id, 2, [sample(t0, util=99.0), sample(t0 + timedelta(seconds=1))])
    assert again.status_code == 200, again.content
    assert (again.json()["samples_stored"], again.json()["samples_deduplicated"]) == (1, 1)
    assert [(u, ts, util) for u, ts, util, _p in stored()] == [
        (A10G, t0, 10.0),  # the first copy stays
        (A10G, t0 + timedelta(seconds=1), 50.0),
    ]
    from fleet.models import AgentReport

    assert list(
        AgentReport.objects.order_by("seq").values_list(
            "seq", "samples_stored", "samples_deduplicated"
        )
    ) == [(1, 1, 0), (2, 1, 1)]
    # the duplicate answer of seq 2 repeats those counts
    assert report(client, host_id, 2, []).json()["samples_deduplicated"] == 1


def test_every_health_fact_the_agent_sends_is_stored_as_sent(agent):
    """What the agent's NVML source sends for a GPU (nvke_agent.sources.nvml._health, all 13
    keys) is accepted and stored verbatim in Gpu.health_counters."""
    from fleet.models import Gpu

    client, host_id = agent
    health = {
        "reset_required": None,
        "drain_and_reset_recommended": False,
        "ecc_volatile_uncorrected": 0,
        "ecc_aggregate_uncorrected": 2,
        "retired_pages_sbe": 0,
        "retired_pages_dbe": 1,
        "retired_pages_pending": False,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "mig_mode_pending": None,
        "gpu_recovery_action": 0,
    }
    resp = report(client, host_id, 1, [], inventory={"gpus": [{"uuid": A10G, "health": health}]})
    assert resp.status_code == 200, resp.content
    assert Gpu.objects.get(uuid=A10G).health_counters == health
