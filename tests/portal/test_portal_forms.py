"""Create-cluster and node pool forms: the pickers offer only valid choices, and every refusal
of the API's validation shows next to the field it names, with its stable code."""

from __future__ import annotations

import re

import pytest

from tests.helpers import drive_cluster, drive_pool

pytestmark = pytest.mark.django_db

H100_PROFILES = "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"


def error_of(html: str, field: str) -> tuple[str, str] | None:
    """(message, code) shown next to form field ``field``, or None."""
    match = re.search(
        rf'<div class="error" role="alert" id="id_{field}-error">\s*<span>(.*?)</span>\s*'
        r'(?:<code class="code">(.*?)</code>)?',
        html,
        re.S,
    )
    return (match.group(1), match.group(2)) if match else None


def options(html: str, field: str) -> list[str]:
    select = re.search(rf'<select name="{field}"[^>]*>(.*?)</select>', html, re.S)
    assert select, field
    return re.findall(r'<option value="([^"]*)"', select.group(1))


@pytest.fixture
def cluster(alice_client, h100_host, make_host):
    """Tenant A's running cluster ``llm`` in us-east-1 (an A10G host sits in us-west-2)."""
    make_host("a10g", gpus=4, zone="us-west-2a", hostname="sim-a10g-01")
    response = alice_client.post(
        "/clusters/new", {"name": "llm", "kubernetes_version": "1.36", "region": "us-east-1"}
    )
    assert response.status_code == 302
    from clusters.models import Cluster

    cluster = Cluster.objects.get(name="llm")
    assert response["Location"] == f"/clusters/{cluster.id}"
    drive_cluster(cluster.id)
    return cluster


def pool_form(**overrides) -> dict:
    data = {
        "name": "mig",
        "gpu_model": "h100-sxm5-80gb",
        "gpus_per_node": "1",
        "node_count": "1",
        "isolation_mode": "mig",
        "mig_profile": "",
        "mig_layout": "",
        "action": "create",
    }
    data.update(overrides)
    return data


# ----------------------------------------------------------------------------- clusters


def test_the_cluster_form_offers_supported_versions_and_regions_with_hosts(
    alice_client, h100_host, make_host
):
    make_host("a10g", gpus=4, zone="us-west-2a")
    html = alice_client.get("/clusters/new").content.decode()
    assert options(html, "region") == ["us-east-1", "us-west-2"]
    assert "1.36" in options(html, "kubernetes_version")


@pytest.mark.parametrize(
    ("provider", "offered"),
    [("hosted", ["1.37", "1.36"]), ("simulated", ["1.37", "1.36", "1.35"])],
)
def test_the_cluster_form_offers_only_versions_the_provider_of_new_clusters_runs(
    alice_client, h100_host, settings, provider, offered
):
    """The catalog supports 1.35 to 1.37 today; the hosted provider runs the minors NVKE
    builds binaries of, 1.36 and 1.37 (issue 33: the form offered 1.35, which never ran)."""
    settings.NVKE_DEFAULT_PROVIDER = provider
    html = alice_client.get("/clusters/new").content.decode()
    assert options(html, "kubernetes_version") == offered


def test_cluster_refusals_show_next_to_their_fields(alice_client, cluster):
    from clusters.models import Cluster

    bad_name = alice_client.post(
        "/clusters/new", {"name": "LLM!", "kubernetes_version": "1.36", "region": "us-east-1"}
    ).content.decode()
    assert error_of(bad_name, "name") == (
        "name must be a DNS-1123 label: lower-case letters, digits and &#x27;-&#x27;, "
        "starting with a letter",
        "invalid_field",
    )
    mars = alice_client.post(
        "/clusters/new", {"name": "x", "kubernetes_version": "1.36", "region": "mars-1"}
    ).content.decode()
    assert error_of(mars, "region") == (
        "region &#x27;mars-1&#x27; has no GPU hosts",
        "unknown_region",
    )
    old = alice_client.post(
        "/clusters/new", {"name": "x", "kubernetes_version": "1.20", "region": "us-east-1"}
    ).content.decode()
    message, code = error_of(old, "kubernetes_version")
    assert code == "unsupported_kubernetes_version" and "1.36" in message
    taken = alice_client.post(
        "/clusters/new", {"name": "llm", "kubernetes_version": "1.36", "region": "us-east-1"}
    ).content.decode()
    assert error_of(taken, "name") == (
        "a cluster named &#x27;llm&#x27; already exists",
        "duplicate_cluster_name",
    )
    assert Cluster.objects.count() == 1


# ----------------------------------------------------------------------------- node pools


def test_the_gpu_model_picker_offers_only_models_with_hosts_in_the_clusters_region(
    alice_client, cluster
):
    html = alice_client.get(f"/clusters/{cluster.id}/nodepools/new").content.decode()
    assert options(html, "gpu_model") == ["h100-sxm5-80gb"]
    assert "H100-SXM5-80GB (h100-sxm5-80gb): 8 of 8 GPUs free, up to 8 per node" in html
    assert options(html, "mig_profile") == ["", *H100_PROFILES.split(", ")]


def test_the_gpu_model_picker_counts_shared_hosts_apart(alice_client, cluster, make_host):
    """A fresh-user trial read "H100: 3 of 24 GPUs free" with a shared host's 8 GPUs in the
    24 a dedicated pool never gets. By hand: dedicated sim-h100-01 (8, all free) + a second
    host of 8 made shared -> "8 of 8 GPUs free ... ; + 8 GPUs on 1 shared host(s)"."""
    from fleet.choices import HostTenancy
    from fleet.models import Host

    shared = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-shared")
    Host.objects.filter(pk=shared.pk).update(tenancy=HostTenancy.SHARED)
    html = alice_client.get(f"/clusters/{cluster.id}/nodepools/new").content.decode()
    assert (
        "H100-SXM5-80GB (h100-sxm5-80gb): 8 of 8 GPUs free, up to 8 per node; "
        "+ 8 GPUs on 1 shared host(s)"
    ) in html


def test_the_isolation_choices_follow_the_gpu_model(alice_client, cluster):
    """The htmx partial behind the GPU model picker: no MIG on an A10G, MIG on an H100."""
    url = f"/clusters/{cluster.id}/nodepools/new?partial=isolation"
    a10g = alice_client.get(url + "&gpu_model=a10g", HTTP_HX_REQUEST="true").content.decode()
    assert a10g.startswith('<fieldset id="isolation-fields"')
    assert options(a10g, "isolation_mode") == ["exclusive", "time-slicing", "mps"]
    h100 = alice_client.get(url + "&gpu_model=h100-sxm5-80gb").content.decode()
    # (the catalog lists vGPU types of neither model, so "vgpu" is offered for neither)
    assert options(h100, "isolation_mode") == ["exclusive", "mig", "time-slicing", "mps"]
    assert "{0,4}:4" in h100  # 3g.40gb's placements, from the real -lgipp capture


def test_a_mig_layout_that_does_not_fit_is_explained_next_to_the_layout_field(
    alice_client, cluster
):
    from nodepools.models import NodePool

    response = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new", pool_form(mig_layout="3g.40gb=2, 1g.10gb=1")
    )
    assert response.status_code == 200
    message, code = error_of(response.content.decode(), "mig_layout")
    assert code == "mig_layout_does_not_fit"
    assert message.startswith(
        "this layout does not fit one h100-sxm5-80gb: the layout needs 9 memory slices; "
        "h100-sxm5-80gb has 8"
    )
    assert not NodePool.objects.exists()


def test_a_profile_of_another_gpu_model_is_refused_with_the_valid_ones(alice_client, cluster):
    html = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new", pool_form(mig_profile="1g.18gb")
    ).content.decode()
    assert error_of(html, "mig_profile") == (
        f"MIG profile &#x27;1g.18gb&#x27; does not exist on h100-sxm5-80gb; valid profiles: "
        f"{H100_PROFILES}",
        "unknown_mig_profile",
    )


def test_mig_on_a_gpu_without_mig_is_refused_next_to_the_isolation_picker(
    alice_client, cluster, make_host
):
    from clusters.models import Cluster

    make_host("a10g", gpus=4, zone="us-east-1b", hostname="sim-a10g-east")
    html = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new",
        pool_form(gpu_model="a10g", isolation_mode="mig", mig_profile="1g.10gb"),
    ).content.decode()
    message, code = error_of(html, "isolation_mode")
    assert code == "mig_not_supported"
    assert message.startswith("A10G does not support MIG")
    assert Cluster.objects.get(pk=cluster.pk).nodepools.count() == 0


def test_a_layout_the_form_cannot_read_is_refused_before_the_api(alice_client, cluster):
    html = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new", pool_form(mig_layout="3g.40gb=two")
    ).content.decode()
    assert error_of(html, "mig_layout")[1] == "invalid_isolation"


def test_a_missing_size_is_refused_by_the_apis_serializer(alice_client, cluster):
    html = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new", pool_form(gpus_per_node="")
    ).content.decode()
    assert error_of(html, "gpus_per_node") == ("This field is required.", "required_field")


@pytest.mark.parametrize("count", ["\u0661", "\uff13"])  # Arabic-Indic 1, fullwidth 3
def test_a_node_count_in_other_than_ascii_digits_is_a_form_error(alice_client, cluster, count):
    """Found by the hostile-tenant probe: Django's int() read an Arabic-Indic one as 1 and the
    Check passed, where the README promises ASCII digits only."""
    from nodepools.models import NodePool

    html = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new",
        pool_form(isolation_mode="exclusive", gpus_per_node="1", node_count=count),
    ).content.decode()
    assert error_of(html, "node_count") == ("use ASCII digits (0-9)", "invalid_number")
    assert not NodePool.objects.exists()


def test_the_quota_refusal_names_the_limit_next_to_the_node_count(alice_client, cluster, tenant_a):
    from tenants.quotas import set_limits

    set_limits(tenant_a, max_gpus={"h100-sxm5-80gb": 4})
    html = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new",
        pool_form(isolation_mode="exclusive", gpus_per_node="2", node_count="3"),
    ).content.decode()
    assert error_of(html, "node_count") == (
        "quota exceeded for gpus.h100-sxm5-80gb: limit 4, reserved 0, requested 6",
        "quota_exceeded",
    )


def test_check_renders_the_layout_and_creates_nothing(alice_client, cluster):
    """3g.40gb ({0,4}:4) takes memory slices 0-3, 2g.20gb ({0,2,4}:2) the first free even
    start 4, 1g.10gb ({0..6}:1) slice 6: the MIG placement table of H100-SXM5-80GB."""
    from clusters.models import Operation
    from nodepools.models import NodePool

    html = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new",
        pool_form(mig_layout="3g.40gb=1, 2g.20gb=1, 1g.10gb=1", gpus_per_node="2", action="check"),
    ).content.decode()
    assert 'id="dry-run"' in html
    assert (
        "3g.40gb @ slice 0 (size 4), 2g.20gb @ slice 4 (size 2), 1g.10gb @ slice 6 (size 1)" in html
    )
    for resource in ("nvidia.com/mig-3g.40gb: 2", "nvidia.com/mig-2g.20gb: 2"):
        assert resource in html
    assert "nvidia.com/mig-1g.10gb: 2" in html
    assert not NodePool.objects.exists()
    assert list(Operation.objects.values_list("type", flat=True)) == ["CREATE_CLUSTER"]


def test_a_valid_pool_is_created_and_its_page_shows_nodes_gpus_and_mig_devices(
    alice_client, cluster, h100_host
):
    from nodepools.models import NodePool
    from tenants.models import AuditEvent

    response = alice_client.post(
        f"/clusters/{cluster.id}/nodepools/new", pool_form(mig_profile="1g.10gb")
    )
    pool = NodePool.objects.get(name="mig")
    assert response.status_code == 302
    assert response["Location"] == f"/clusters/{cluster.id}/nodepools/{pool.id}"
    assert pool.isolation == {"mode": "mig", "mig_profile": "1g.10gb"}
    assert AuditEvent.objects.filter(action="nodepool.create", actor="user:alice").count() == 1
    drive_pool(pool.id)
    (node,) = pool.nodes.all()
    html = alice_client.get(response["Location"]).content.decode()
    assert '<span id="pool-phase"><span class="badge ok">RUNNING</span></span>' in html
    assert f'data-node="{node.name}"' in html and node.gpu_uuids[0] in html
    assert "1g.10gb, " * 6 + "1g.10gb" in html  # 7 instances of 1g.10gb on the GPU
    assert "nvidia.com/gpu: 7" in html
    gpu_page = alice_client.get(f"/clusters/{cluster.id}/nodepools/{pool.id}/nodes/{node.id}")
    assert node.gpu_uuids[0] in gpu_page.content.decode()
    assert "sim-h100-01" in gpu_page.content.decode()


@pytest.fixture
def running_pool(alice_client, cluster):
    alice_client.post(f"/clusters/{cluster.id}/nodepools/new", pool_form(mig_profile="1g.10gb"))
    from nodepools.models import NodePool

    pool = NodePool.objects.get(name="mig")
    drive_pool(pool.id)
    return pool


def test_scaling_takes_the_new_size_or_shows_the_quota_refusal(
    alice_client, running_pool, tenant_a
):
    from clusters.models import Operation
    from tenants.quotas import set_limits

    url = f"/clusters/{running_pool.cluster_id}/nodepools/{running_pool.id}/scale"
    assert alice_client.post(url, {"node_count": "3"}).status_code == 302
    running_pool.refresh_from_db()
    assert running_pool.node_count == 3
    assert Operation.objects.filter(target_id=running_pool.id, type="SET_NODE_POOL_SIZE").count()
    drive_pool(running_pool.id)  # one operation at a time per cluster
    set_limits(tenant_a, max_nodes=4)
    refused = alice_client.post(url, {"node_count": "5"})
    assert refused.status_code == 400
    assert error_of(refused.content.decode(), "node_count") == (
        "quota exceeded for nodes: limit 4, reserved 3, requested 2",
        "quota_exceeded",
    )
    running_pool.refresh_from_db()
    assert running_pool.node_count == 3


def test_an_isolation_change_is_checked_then_applied(alice_client, running_pool):
    from nodepools.models import NodePool

    url = f"/clusters/{running_pool.cluster_id}/nodepools/{running_pool.id}/isolation"
    node = running_pool.nodes.get()
    check = alice_client.post(
        url, {"isolation_mode": "mig", "mig_profile": "2g.20gb", "action": "check"}
    ).content.decode()
    assert f"1 drained, 1 repartitioned, one at a time: {node.name} (drain, repartition)" in check
    assert NodePool.objects.get(pk=running_pool.pk).isolation["mig_profile"] == "1g.10gb"
    same = alice_client.post(
        url,
        {
            "isolation_mode": "mig",
            "mig_profile": "1g.10gb",
            "action": "apply",
            "confirm_name": "mig",
        },
    ).content.decode()
    assert "the node pool already has this isolation" in same and "isolation_unchanged" in same
    body = {"isolation_mode": "mig", "mig_profile": "2g.20gb", "action": "apply"}
    # applying without typing the pool's name is refused by the server (400), nothing changes
    refused = alice_client.post(url, body)
    assert refused.status_code == 400 and "type the name exactly (mig)" in refused.content.decode()
    assert NodePool.objects.get(pk=running_pool.pk).isolation["mig_profile"] == "1g.10gb"
    applied = alice_client.post(url, {**body, "confirm_name": "mig"})
    assert applied.status_code == 302
    assert NodePool.objects.get(pk=running_pool.pk).isolation == {
        "mode": "mig",
        "mig_profile": "2g.20gb",
    }


def test_deleting_asks_first_then_starts_the_deletion(alice_client, running_pool, cluster):
    from clusters.models import Cluster
    from nodepools.models import NodePool

    url = f"/clusters/{cluster.id}/nodepools/{running_pool.id}/delete"
    confirm = alice_client.get(url).content.decode()
    assert "Delete node pool mig?" in confirm and "cannot be undone" in confirm
    assert NodePool.objects.get(pk=running_pool.pk).phase == "RUNNING"
    assert alice_client.post(url, {"confirm_name": "mig"}).status_code == 302
    assert NodePool.objects.get(pk=running_pool.pk).phase == "DELETING"
    assert (
        alice_client.post(f"/clusters/{cluster.id}/delete", {"confirm_name": "llm"}).status_code
        == 302
    )
    assert Cluster.objects.get(pk=cluster.pk).phase == "DELETING"


def test_the_cluster_list_polls_its_rows(alice_client, cluster):
    html = alice_client.get("/clusters").content.decode()
    assert 'hx-get="/clusters?page=1&amp;fragment=rows" hx-trigger="every 2s"' in html
    rows = alice_client.get("/clusters?fragment=rows", HTTP_HX_REQUEST="true").content.decode()
    assert rows.startswith('<tbody id="cluster-rows"')
    assert '<tr data-cluster="llm">' in rows and "RUNNING" in rows


def test_the_control_plane_upgrade_offers_the_next_minor_and_starts_an_operation(
    alice_client, cluster
):
    """1.36 -> 1.37: supported on the catalog's snapshot day, one minor at a time."""
    from clusters.models import Cluster, Operation

    detail = alice_client.get(f"/clusters/{cluster.id}").content.decode()
    assert "upgrade available: 1.37" in detail
    page = alice_client.get(f"/clusters/{cluster.id}/upgrade").content.decode()
    assert options(page, "kubernetes_version") == ["1.37"]
    skip = alice_client.post(f"/clusters/{cluster.id}/upgrade", {"kubernetes_version": "1.39"})
    message, code = error_of(skip.content.decode(), "kubernetes_version")
    assert code == "unsupported_kubernetes_version" and "1.39" in message
    assert Cluster.objects.get(pk=cluster.pk).kubernetes_version == "1.36"
    done = alice_client.post(f"/clusters/{cluster.id}/upgrade", {"kubernetes_version": "1.37"})
    assert done.status_code == 302
    assert Cluster.objects.get(pk=cluster.pk).kubernetes_version == "1.37"
    op = Operation.objects.get(target_id=cluster.id, type="UPGRADE_CONTROL_PLANE")
    assert op.requested_by == "user:alice"


def test_node_upgrades_offer_versions_within_the_skew_and_start_a_rollout(
    alice_client, running_pool
):
    """Nodes on 1.36 under a 1.36 control plane: only 1.36 is offered (never newer than the
    control plane); the driver alone can be upgraded; a driver branch the catalog does not know
    (R450) is refused next to the driver field."""
    from clusters.models import Operation
    from nodepools.models import NodePool

    url = f"/clusters/{running_pool.cluster_id}/nodepools/{running_pool.id}"
    page = alice_client.get(url).content.decode()
    assert options(page, "kubernetes_version") == ["1.36"]
    same = alice_client.post(url + "/upgrade", {"kubernetes_version": "1.36"})
    assert same.status_code == 400
    assert error_of(same.content.decode(), "kubernetes_version") == (
        "the pool already runs these versions",
        "nothing_to_upgrade",
    )
    newer = alice_client.post(url + "/upgrade", {"kubernetes_version": "1.37"})
    assert error_of(newer.content.decode(), "kubernetes_version")[1] == "version_skew"
    old = alice_client.post(url + "/upgrade", {"driver_version": "450.80.02"})
    assert error_of(old.content.decode(), "driver_version")[1] == "unknown_driver_branch"
    started = alice_client.post(
        url + "/upgrade", {"driver_version": "580.95.05", "max_unavailable": "1"}
    )
    assert started.status_code == 302
    pool = NodePool.objects.get(pk=running_pool.pk)
    assert pool.driver_version == "580.95.05" and pool.upgrade["state"] == "rolling"
    assert Operation.objects.filter(target_id=pool.id, type="UPGRADE_NODES").count() == 1
    not_paused = alice_client.post(url + "/resume-upgrade", follow=True).content.decode()
    assert "no paused upgrade on this node pool (upgrade_not_paused)" in not_paused
