"""The nvkectl tour of docs/tenant/nvkectl.md, end to end: the real ``nvkectl`` console
script (a separate process) against Django's live server with a real Celery worker. Every
command of the page's block runs here, in its order (checked), with assertions between them.
The GPU host is the one A10G host of ``make run``'s demo data, imported from the same real
capture."""

from __future__ import annotations

import csv
import io
import json
import shlex
import stat
from datetime import timedelta
from decimal import Decimal

import pytest
import yaml
from django.utils import timezone

from tests.docs_blocks import marked_block

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def readme_tour(server: str, key: str) -> list[list[str]]:
    """The ``nvkectl`` command lines of the tour block of docs/tenant/nvkectl.md, variables
    filled in."""
    block = marked_block("nvkectl-tour")
    lines = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["nvkectl"]:
            subs = {"$NVKE": server, "$(cat .nvke/demo-tenant-api-key)": key}
            lines.append([subs.get(w, w) for w in words[1:]])
    return lines


def test_the_readme_tour(live_server, worker, import_capture, tmp_path, nvkectl):
    from billing.aggregation import aggregate_usage
    from billing.models import LedgerEntry
    from billing.prices import set_price
    from tenants.services import create_api_key, create_tenant

    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")  # as make run's demo host
    tenant = create_tenant(name="acme")
    # 3,600 USD per GPU-hour: one USD per GPU-second, so the few seconds the tour holds the
    # GPU cost a figure that cannot round to 0.00
    set_price(
        gpu_model="a10g",
        hourly_rate=Decimal("3600"),
        effective_from=timezone.now() - timedelta(days=1),
        label="list",
    )
    key = create_api_key(tenant=tenant, name="cli", role="owner")[1]

    # contexts live in a file only its owner can read
    nvkectl("config", "set-context", "demo", "--server", live_server.url, "--api-key", key)
    mode = stat.S_IMODE((tmp_path / "nvkectl.yaml").stat().st_mode)
    assert mode == 0o600
    assert "demo" in nvkectl("config", "get-contexts").stdout

    # no context of that name: a clear line, exit 2
    missing = nvkectl("--context", "nope", "clusters", "list", expect=2)
    assert missing.stderr.strip().startswith("error: no context named 'nope'")

    created = nvkectl(
        "clusters", "create", "train", "-k", "1.36", "-r", "us-east-1", "--wait"
    ).stdout
    assert created.strip().splitlines()[-1].startswith("CREATE_CLUSTER ")
    assert created.strip().endswith(" DONE")
    assert "train" in nvkectl("clusters", "list").stdout
    (cluster,) = json.loads(nvkectl("clusters", "list", "-o", "json").stdout)
    assert (cluster["name"], cluster["phase"], cluster["kubernetes_version"]) == (
        "train",
        "RUNNING",
        "1.36",
    )

    # the same name again: the problem+json as one line with its code, exit 1
    dup = nvkectl("clusters", "create", "train", "-k", "1.36", "-r", "us-east-1", expect=1)
    assert dup.stderr.strip() == (
        "error: a cluster named 'train' already exists (duplicate_cluster_name, HTTP 409)"
    )
    bad = nvkectl(
        "nodepools",
        "create",
        "train",
        "p",
        "--gpu-model",
        "t4",
        "--gpus-per-node",
        "1",
        "--nodes",
        "1",
        "--mig-profile",
        "1g.10gb",
        expect=1,
    )
    assert "HTTP 400" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1

    nvkectl(
        "nodepools",
        "create",
        "train",
        "a10g",
        "--gpu-model",
        "a10g",
        "--gpus-per-node",
        "1",
        "--nodes",
        "1",
        "--wait",
    )
    planned = nvkectl("nodepools", "scale", "train", "a10g", "--nodes", "0", "--dry-run")
    pool = json.loads(nvkectl("nodepools", "get", "train", "a10g", "-o", "json").stdout)
    (only,) = [n["name"] for n in pool["nodes"] if n["phase"] == "READY"]
    assert planned.stdout.splitlines() == [
        "node count: 1 -> 0",
        f"  would drain and remove {only} (1 GPU(s), newest)",
    ]
    assert pool["node_count"] == 1  # the dry run changed nothing
    nvkectl("nodepools", "scale", "train", "a10g", "--nodes", "0", "--wait")
    pool = json.loads(nvkectl("nodepools", "get", "train", "a10g", "-o", "json").stdout)
    assert (pool["node_count"], [n for n in pool["nodes"] if n["phase"] == "READY"]) == (0, [])
    nvkectl("nodepools", "scale", "train", "a10g", "--nodes", "1", "--wait")
    pool = json.loads(nvkectl("nodepools", "get", "train", "a10g", "-o", "json").stdout)
    assert (pool["phase"], pool["node_count"]) == ("RUNNING", 1)
    assert sum(1 for n in pool["nodes"] if n["phase"] == "READY") == 1
    upgraded = nvkectl("clusters", "upgrade", "train", "-k", "1.37", "--wait").stdout
    assert upgraded.strip().splitlines()[-1].startswith("UPGRADE_CONTROL_PLANE ")
    got = json.loads(nvkectl("clusters", "get", "train", "-o", "json").stdout)
    assert (got["control_plane_version"], got["phase"]) == ("1.37", "RUNNING")
    rolled = nvkectl("nodepools", "upgrade", "train", "a10g", "-k", "1.37", "--wait").stdout
    assert rolled.strip().splitlines()[-1].startswith("UPGRADE_NODES ")
    pool = json.loads(nvkectl("nodepools", "get", "train", "a10g", "-o", "json").stdout)
    assert (pool["kubernetes_version"], pool["phase"]) == ("1.37", "RUNNING")
    # the table names each node's versions: the kubelet's 1.37 and the driver its host reports
    (ready,) = [n for n in pool["nodes"] if n["phase"] == "READY"]
    from fleet.models import Host

    driver = Host.objects.get(hostname=ready["host"]).driver_version
    assert driver  # the simulated host's agent reported one
    table = nvkectl("nodepools", "get", "train", "a10g").stdout.splitlines()
    header = table.index(
        next(line for line in table if line.startswith("NAME ") and "DRIVER_VERSION" in line)
    )
    (row,) = [line.split() for line in table[header + 1 :] if line.startswith(ready["name"])]
    assert row[:2] == [ready["name"], "READY"] and row[4:6] == ["1.37", driver]
    listed = list(
        csv.DictReader(io.StringIO(nvkectl("nodepools", "list", "train", "-o", "csv").stdout))
    )
    assert [(r["name"], r["gpu_model"], r["node_count"]) for r in listed] == [("a10g", "a10g", "1")]
    # what each node gets: one whole A10G
    assert [(r["isolation"], r["resources_per_node"]) for r in listed] == [
        ("exclusive", "nvidia.com/gpu=1")
    ]

    # credentials merge beside what the kubeconfig already holds
    kube = tmp_path / "kube" / "config"
    kube.parent.mkdir()
    kube.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "other", "cluster": {"server": "https://other:6443"}}],
                "users": [{"name": "other", "user": {"token": "t"}}],
                "contexts": [{"name": "other", "context": {"cluster": "other", "user": "other"}}],
                "current-context": "other",
            }
        )
    )
    said = nvkectl("get-credentials", "train").stdout
    assert "nvke_acme_us-east-1_train" in said
    merged = yaml.safe_load(kube.read_text())
    assert [c["name"] for c in merged["contexts"]] == ["other", "nvke_acme_us-east-1_train"]
    assert merged["current-context"] == "nvke_acme_us-east-1_train"
    assert stat.S_IMODE(kube.stat().st_mode) == 0o600
    nvkectl("get-credentials", "train")  # again: replaced, not duplicated
    assert len(yaml.safe_load(kube.read_text())["contexts"]) == 2

    nvkectl("nodepools", "delete", "train", "a10g", "--wait")
    said = nvkectl("clusters", "delete", "train", "--wait").stdout
    # the context get-credentials merged goes with the cluster; the other one stays
    assert f"context nvke_acme_us-east-1_train removed from {kube.absolute()}" in said
    left = yaml.safe_load(kube.read_text())
    assert [
        [e["name"] for e in left[section]] for section in ("clusters", "users", "contexts")
    ] == [["other"], ["other"], ["other"]]
    assert left["current-context"] == ""
    assert (
        json.loads(nvkectl("clusters", "get", cluster["id"], "-o", "json").stdout)["phase"]
        == "DELETED"
    )
    # the API hides DELETED clusters from its list; --show-deleted asks it for them
    assert json.loads(nvkectl("clusters", "list", "-o", "json").stdout) == []
    shown = json.loads(nvkectl("clusters", "list", "--show-deleted", "-o", "json").stdout)
    assert [(c["name"], c["phase"]) for c in shown] == [("train", "DELETED")]

    # usage: the ledger's GPU-seconds (the GPU held twice: before and after the scale to 0,
    # each from ready to release), as GPU-hours
    entries = list(LedgerEntry.objects.filter(tenant=tenant))
    assert len(entries) == 2
    seconds = sum(
        (e.period.upper - e.period.lower).total_seconds() * float(e.billable_fraction)
        for e in entries
    )
    start = min(e.period.lower for e in entries)
    end = max(e.period.upper for e in entries)
    aggregate_usage(tenant.id, start, end)
    usage = json.loads(nvkectl("usage", "--group-by", "cluster", "-o", "json").stdout)
    (row,) = usage["results"]
    assert row["cluster_name"] == "train"
    assert abs(Decimal(row["gpu_hours"]) - Decimal(seconds / 3600)) < Decimal("0.001")
    # its cost as the invoice rates it: 3,600 USD per GPU-hour = 1 USD per GPU-second (two
    # ledger rows, each line rounded to the cent)
    assert abs(Decimal(row["cost"]["USD"]) - Decimal(str(seconds))) <= Decimal("0.02")
    table = nvkectl("usage", "--group-by", "cluster").stdout
    assert "CLUSTER_NAME" in table and "train" in table and f"{row['cost']['USD']} USD" in table
    usage_csv = nvkectl("usage", "--group-by", "cluster", "-o", "csv").stdout.splitlines()
    assert usage_csv[0] == (
        "cluster_name,gpu_hours,sla_credit_gpu_hours,billable_gpu_hours,covered,cost"
    )
    assert usage_csv[1].startswith("train,")
    assert usage_csv[1].endswith(f",{row['cost']['USD']} USD")

    assert "NUMBER" in nvkectl("invoices").stdout
    invoices = nvkectl("invoices", "-o", "csv").stdout.splitlines()
    assert invoices == ["number,period_label,status,currency,usage_amount,credit_amount,total"]

    # every command of the page's block ran above, in the page's order
    tour = readme_tour(live_server.url, key)
    assert len(tour) >= 10
    ran = iter(nvkectl.history)
    for command in tour:
        assert any(done == command for done in ran), f"docs command not run: {command}"


def test_the_checkpoint_flow_from_nvkectl(live_server, owner, make_host, tenant_a, nvkectl):
    """A tenant attaches a disruption hook, lists the request a planned drain made and
    acknowledges it, all with nvkectl (a fresh-user trial had to use curl for each): the
    request is acknowledged through the API and the drain goes on at its next look."""
    from django.utils import timezone

    from nodepools import disruption
    from nodepools.models import DisruptionRequest, Node, NodePool
    from tenants.services import create_api_key
    from tests.helpers import running_h100_pool
    from tests.nodepools.test_checkpoints import Recording

    running_h100_pool(owner, make_host, hosts=1, nodes=1)
    key = create_api_key(tenant=tenant_a, name="ctl", role="owner")[1]
    nvkectl("config", "set-context", "t", "--server", live_server.url, "--api-key", key)

    assert "no disruption hook" in nvkectl("nodepools", "disruption-hook", "c1", "h100").stdout
    said = nvkectl("nodepools", "disruption-hook", "c1", "h100", "--deadline", "300").stdout
    assert "wait up to 300 s for a checkpoint ack" in said
    pool = NodePool.objects.get(name="h100")
    assert pool.disruption_hook == {"checkpoint_deadline_s": 300}
    too_long = nvkectl(
        "nodepools", "disruption-hook", "c1", "h100", "--deadline", "99999", expect=1
    )
    assert "checkpoint_deadline_s" in too_long.stderr

    # a planned drain (scale-down's policy) asks first: one request, waiting
    (node,) = Node.objects.filter(nodepool=pool)
    held = disruption.drain(
        node, disruption.policy_for("scale-down"), Recording(pool), timezone.now()
    )
    assert held.gated
    (request,) = DisruptionRequest.objects.filter(nodepool=pool)
    listed = json.loads(
        nvkectl("nodepools", "disruption-requests", "c1", "h100", "-o", "json").stdout
    )
    assert [(r["id"], r["state"], r["nodes"]) for r in listed] == [
        (str(request.id), "waiting", [node.name])
    ]
    table = nvkectl("nodepools", "disruption-requests", "c1", "h100").stdout
    assert str(request.id) in table and "waiting" in table and node.name in table

    said = nvkectl("nodepools", "ack", "c1", "h100", str(request.id)).stdout
    assert f"disruption request {request.id}: acknowledged" in said
    request.refresh_from_db()
    assert (request.acknowledged_via, request.acknowledged_by.startswith("apikey:")) == (
        "api",
        True,
    )
    node.refresh_from_db()
    assert not disruption.drain(
        node, disruption.policy_for("scale-down"), Recording(pool), timezone.now()
    ).gated  # the drain goes on

    assert (
        "no disruption hook"
        in nvkectl("nodepools", "disruption-hook", "c1", "h100", "--remove").stdout
    )
    pool.refresh_from_db()
    assert pool.disruption_hook == {}
