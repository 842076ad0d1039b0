"""Tenant portal: clusters, node pools, nodes (and their GPUs), operations.

Every object is fetched through :func:`nvke.scoping.get_scoped_or_404` with the session's
principal; every change goes through the service the API calls, after the API's own
serializer checked the body (:func:`portal.forms.validate_with`).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.usage import cluster_usage
from catalog.models import GpuModel
from clusters import services as cluster_services
from clusters.api.serializers import ClusterCreateSerializer, ClusterUpdateSerializer
from clusters.choices import GONE_PHASES, TRANSITIONAL_PHASES, Phase
from clusters.maintenance import describe_opening, next_window_start
from clusters.models import Cluster, Operation
from clusters.versions import available_upgrades, minor, node_version_problem, runnable_versions
from fleet.choices import HostState
from fleet.models import Gpu, GpuRollup1m, Host, region_of_zone
from fleet.shared_hosts import is_shared_policy
from nodepools import services as pool_services
from nodepools.api.scale import SetSizeSerializer
from nodepools.api.serializers import NodePoolCreateSerializer, NodePoolUpdateSerializer
from nodepools.api.upgrade import UpgradeSerializer
from nodepools.choices import NodePhase
from nodepools.models import Node, NodePool
from nodepools.scaling import set_node_pool_size
from nodepools.upgrades import resume_upgrade, upgrade_nodepool
from nvke.errors import ApiError
from nvke.scoping import get_scoped_or_404, scope_queryset
from portal import cli_equivalents as cli
from portal import maintenance_form
from portal.access import require_write, tenant_page
from portal.confirm import ConfirmNameForm, disruption_of_cluster, disruption_of_pool
from portal.forms import (
    ClusterForm,
    IsolationForm,
    NodePoolForm,
    NodeUpgradeForm,
    ScaleForm,
    UpgradeForm,
)
from portal.list_filters import ClusterFilter
from portal.listing import paginate
from portal.maintenance_form import MaintenancePolicyForm, policy_text
from portal.queries import region_gpu_models

from .common import confirm_delete, is_htmx, validate_then_call

#: seconds between htmx polls of a page's live part
POLL_S = 2


def _regions() -> list[str]:
    """Regions with GPU hosts (a host's region, else the one its zone names)."""
    rows = Host.objects.exclude(state=HostState.RETIRED).values_list("region", "zone").distinct()
    return sorted({region or region_of_zone(zone) for region, zone in rows})


def pool_rows(pools) -> list[dict]:
    """Node pools with their live nodes (DELETED nodes hidden) and GPU counts: ``gpus`` whole
    GPUs held; for a shared pool (``shared`` True) ``gpu_instances``, the MIG instances its
    nodes' hosts report for them (its nodes hold instances of GPUs other tenants share, not
    GPUs: four 1g.10gb nodes on one GPU are 4 instances, not "4 GPUs")."""
    out = []
    for pool in pools:
        nodes = [n for n in pool.nodes.all() if n.phase != NodePhase.DELETED]
        shared = (pool.gpu_config or {}).get("tenancy") == "shared"
        out.append(
            {
                "pool": pool,
                "nodes": nodes,
                "ready": sum(1 for n in nodes if n.phase == NodePhase.READY),
                "shared": shared,
                "gpus": 0 if shared else sum(len(n.gpu_uuids) for n in nodes),
                "gpu_instances": sum(
                    len(g.get("mig_devices") or []) for n in nodes for g in n.gpu_layout or []
                )
                if shared
                else 0,
            }
        )
    return out


# ------------------------------------------------------------------------------ clusters


@tenant_page
def cluster_list(request: HttpRequest) -> HttpResponse:
    """Clusters of the tenant with their live phase (the table body polls every 2 s): search,
    filters (phase, region, version: values the tenant's clusters hold), sort, pages."""
    show_deleted = request.GET.get("deleted") == "1"
    clusters = scope_queryset(Cluster.objects.all(), request.principal).select_related("tenant")
    if not show_deleted:
        clusters = clusters.exclude(phase=Phase.DELETED)
    clusters = clusters.annotate(
        pools=Count("nodepools", filter=~Q(nodepools__phase=Phase.DELETED), distinct=True)
    ).order_by("-created_at")
    listing = paginate(request, ClusterFilter(request.GET, queryset=clusters))
    context = {
        "clusters": listing.page.object_list,
        "listing": listing,
        "keep": {"deleted": "1"} if show_deleted else {},
        "show_deleted": show_deleted,
        "poll_s": POLL_S,
        "transitional": TRANSITIONAL_PHASES,
    }
    if is_htmx(request) and request.GET.get("fragment") == "rows":
        return render(request, "portal/partials/cluster_rows.html", context, status=listing.status)
    return render(request, "portal/cluster_list.html", context, status=listing.status)


@tenant_page
def cluster_create(request: HttpRequest) -> HttpResponse:
    """The create-cluster form: only Kubernetes versions a new cluster can run (supported, and
    run by ``NVKE_DEFAULT_PROVIDER``) and regions with hosts."""
    if (deny := require_write(request)) is not None:
        return deny
    versions = [kv.version for kv in runnable_versions(settings.NVKE_DEFAULT_PROVIDER)]
    form = ClusterForm(request.POST or None, versions=versions, regions=_regions())
    if request.method == "POST" and form.is_valid():
        data, op = validate_then_call(
            form,
            ClusterCreateSerializer,
            form.payload(),
            cluster_services.create_cluster,
            principal=request.principal,
        )
        if op is not None:
            messages.success(request, f"Cluster {data['name']} is being created.")
            return redirect("portal:cluster-detail", op.target_id)
    typed = form.payload() if form.is_bound else {}
    equivalent = cli.cluster_create(
        typed.get("name") or "NAME",
        typed.get("kubernetes_version") or (versions[0] if versions else "VERSION"),
        typed.get("region") or "REGION",
    )
    return render(request, "portal/cluster_form.html", {"form": form, "cli": equivalent})


def _cluster_context(request: HttpRequest, cluster: Cluster) -> dict:
    """What the cluster page and its polled part show: header, actions, facts, status, node
    pools, operations (the live part is re-rendered whole every :data:`POLL_S` seconds)."""
    pools = (
        scope_queryset(NodePool.objects.filter(cluster=cluster), request.principal)
        .select_related("gpu_model")
        .prefetch_related("nodes__host")
    )
    if request.GET.get("deleted") != "1":
        pools = pools.exclude(phase=Phase.DELETED)
    operations = list(
        scope_queryset(Operation.objects.filter(cluster=cluster), request.principal)[:15]
    )
    names = {p.id: p.name for p in NodePool.objects.filter(cluster=cluster)}
    names[cluster.id] = cluster.name
    gone = cluster.phase in GONE_PHASES
    return {
        "cluster": cluster,
        "pools": pool_rows(pools),
        "operations": [(op, names.get(op.target_id, "")) for op in operations],
        "failed_operation": _last_failed(operations, cluster.id),
        "gone": gone,
        "poll_s": POLL_S,
        "upgrades": [] if gone else _upgrades(cluster),
        "kubeconfig_url": (
            reverse("clusters:cluster-kubeconfig", args=[cluster.id])
            if cluster.kubeconfig_encrypted and not gone
            else None
        ),
        "live_fragment": is_htmx(request) and request.GET.get("fragment") == "live",
    }


def _last_failed(operations: list[Operation], target_id) -> Operation | None:
    """The target's newest operation when it FAILED (what the ERROR banner explains)."""
    mine = [op for op in operations if op.target_id == target_id]
    return mine[0] if mine and mine[0].status == "FAILED" else None


@tenant_page
def cluster_detail(request: HttpRequest, cluster_id) -> HttpResponse:
    """Spec, phase, conditions, operations with progress, node pools and nodes, usage, the
    maintenance policy (edited here: ``update_cluster(maintenance_policy=...)``)."""
    cluster = get_scoped_or_404(Cluster.objects.all(), request.principal, pk=cluster_id)
    context = _cluster_context(request, cluster)
    if context["live_fragment"]:
        return render(request, "portal/partials/cluster_live.html", context)
    status = 200
    form = MaintenancePolicyForm(
        request.POST or None, initial={"policy": policy_text(cluster.maintenance_policy)}
    )
    if request.method == "POST":
        if (deny := require_write(request)) is not None:
            return deny
        if form.is_valid():
            _, op = validate_then_call(
                form,
                ClusterUpdateSerializer,
                {"maintenance_policy": form.cleaned_data["policy"]},
                cluster_services.update_cluster,
                principal=request.principal,
                cluster=cluster,
            )
            if op is not None:
                messages.success(request, f"Cluster {cluster.name}: maintenance policy saved.")
                return redirect("portal:cluster-detail", cluster.id)
        status = 400
    now = timezone.now()
    context["usage"] = cluster_usage(cluster.id, cluster.created_at, now, now).as_dict()
    context["policy_form"] = form
    context["next_window"] = _next_window(cluster, now)
    context["cli_policy"] = cli.maintenance_policy(
        cluster, cluster.maintenance_policy or maintenance_form.EXAMPLE
    )
    context["cli_upgrade"] = cli.cluster_upgrade(
        cluster, context["upgrades"][0] if context["upgrades"] else "VERSION"
    )
    return render(request, "portal/cluster_detail.html", context, status=status)


def _next_window(cluster: Cluster, now) -> str:
    """When disruptive changes may next start: ``"now"``, ``"Sat 02:00 Europe/Berlin"``."""
    policy = cluster.maintenance_policy
    if not policy:
        return "any time (no policy)"
    opens = next_window_start(policy, now)
    return "now (a window is open)" if opens == now else describe_opening(policy, opens)


def _upgrades(cluster: Cluster) -> list[str]:
    return available_upgrades(
        cluster.control_plane_version or cluster.kubernetes_version, provider=cluster.provider
    )


@tenant_page
def cluster_upgrade(request: HttpRequest, cluster_id) -> HttpResponse:
    """Confirm and start a control plane upgrade (``update_cluster``: UPGRADE_CONTROL_PLANE)."""
    cluster = get_scoped_or_404(Cluster.objects.all(), request.principal, pk=cluster_id)
    if (deny := require_write(request)) is not None:
        return deny
    form = UpgradeForm(request.POST or None, versions=_upgrades(cluster))
    if request.method == "POST" and form.is_valid():
        body = {"kubernetes_version": form.cleaned_data["kubernetes_version"]}
        _, op = validate_then_call(
            form,
            ClusterUpdateSerializer,
            body,
            cluster_services.update_cluster,
            principal=request.principal,
            cluster=cluster,
        )
        if op is not None:
            target = body["kubernetes_version"]
            messages.success(
                request, f"Cluster {cluster.name}: control plane upgrade to {target} started."
            )
            return redirect("portal:cluster-detail", cluster.id)
    target = (form.cleaned_data.get("kubernetes_version") if form.is_bound else None) or (
        _upgrades(cluster)[:1] or ["VERSION"]
    )[0]
    return render(
        request,
        "portal/cluster_upgrade.html",
        {"cluster": cluster, "form": form, "cli": cli.cluster_upgrade(cluster, target)},
    )


@tenant_page
def cluster_delete(request: HttpRequest, cluster_id) -> HttpResponse:
    """Confirm by typing the cluster's name (checked here, not only in the browser), then
    ``delete_cluster`` (202 + a DELETE_CLUSTER operation in the API)."""
    cluster = get_scoped_or_404(Cluster.objects.all(), request.principal, pk=cluster_id)
    if (deny := require_write(request)) is not None:
        return deny
    return confirm_delete(
        request,
        name=cluster.name,
        delete=lambda: cluster_services.delete_cluster(
            principal=request.principal, cluster=cluster
        ),
        done=f"Cluster {cluster.name} is being deleted.",
        back=reverse("portal:cluster-detail", args=[cluster.id]),
        page={
            "kind": "cluster",
            "disruption": disruption_of_cluster(cluster),
            "title": f"Delete cluster {cluster.name}?",
            "message": (
                "Its node pools are drained and deleted, their GPUs released and billing "
                "stops; the cluster's record and usage stay readable. This cannot be undone."
            ),
            "button": "Delete cluster",
            "cancel": reverse("portal:cluster-detail", args=[cluster.id]),
            "cli": cli.cluster_delete(cluster),
        },
    )


# ------------------------------------------------------------------------------ node pools


def _pool_form_models(cluster: Cluster, request: HttpRequest):
    models = region_gpu_models(cluster.region)
    slug = request.POST.get("gpu_model") or request.GET.get("gpu_model")
    if not slug and models:
        slug = models[0][0].slug
    return models, GpuModel.objects.filter(slug=slug).first() if slug else None


def _reservation_choices(request: HttpRequest, cluster: Cluster) -> list[tuple[str, str]]:
    """The tenant's reservations in the cluster's region that have not ended."""
    from django.db.models import Q
    from django.utils import timezone

    from reservations.models import Reservation

    now = timezone.now()
    rows = scope_queryset(
        Reservation.objects.filter(region=cluster.region, cancelled_at__isnull=True).filter(
            Q(end__isnull=True) | Q(end__gt=now)
        ),
        request.principal,
    ).filter(tenant_id=cluster.tenant_id)
    return [
        (
            str(r.id),
            f"{r.name or str(r.id)[:8]}: {r.gpus} x {r.gpu_model_id}, "
            f"{r.start:%Y-%m-%d %H:%M} to {f'{r.end:%Y-%m-%d %H:%M}' if r.end else 'open'} UTC",
        )
        for r in rows.order_by("start")[:50]
    ]


@tenant_page
def nodepool_create(request: HttpRequest, cluster_id) -> HttpResponse:
    """Add a node pool. "Check" validates and renders without creating (the API's dry run);
    the isolation inputs follow the chosen GPU model (htmx swaps them on change)."""
    cluster = get_scoped_or_404(Cluster.objects.all(), request.principal, pk=cluster_id)
    if (deny := require_write(request)) is not None:
        return deny
    models, model = _pool_form_models(cluster, request)
    data = request.POST if request.method == "POST" else None
    form = NodePoolForm(
        data,
        models=models,
        model=model,
        reservations=_reservation_choices(request, cluster),
        initial={"gpu_model": model.slug if model else "", "node_count": 1, "gpus_per_node": 1},
    )
    if request.GET.get("partial") == "isolation":
        form = NodePoolForm(None, models=models, model=model, initial=request.GET.dict())
        return render(request, "portal/partials/isolation_fields.html", {"form": form})
    # with JavaScript, choosing a GPU model swaps in that model's isolation choices
    form.fields["gpu_model"].widget.attrs.update(
        {
            "hx-get": reverse("portal:nodepool-create", args=[cluster.id]) + "?partial=isolation",
            "hx-trigger": "change",
            "hx-target": "#isolation-fields",
            "hx-swap": "outerHTML",
            "hx-include": "closest form",
        }
    )
    context = {"form": form, "cluster": cluster, "model": model, "dry_run": None}
    typed = form.payload() if form.is_bound and form.is_valid() else None
    context["cli"] = cli.nodepool_create(cluster, typed)
    if request.method == "POST" and form.is_valid():
        check = request.POST.get("action") == "check"
        body = form.payload()
        valid, result = (
            validate_then_call(
                form,
                NodePoolCreateSerializer,
                body,
                pool_services.create_nodepool,
                principal=request.principal,
                cluster=cluster,
                dry_run=check,
            )
            if body
            else (None, None)
        )
        if isinstance(result, pool_services.DryRun):
            context["dry_run"] = result
        elif valid is not None and result is not None:
            messages.success(request, f"Node pool {valid['name']} is being created.")
            return redirect("portal:nodepool-detail", cluster.id, result.target_id)
    return render(request, "portal/nodepool_form.html", context)


def _get_pool(request: HttpRequest, cluster_id, pool_id) -> NodePool:
    return get_scoped_or_404(
        NodePool.objects.filter(cluster_id=cluster_id).select_related("cluster", "gpu_model"),
        request.principal,
        pk=pool_id,
    )


def _pool_context(request: HttpRequest, pool: NodePool) -> dict:
    nodes = (
        scope_queryset(Node.objects.filter(nodepool=pool), request.principal)
        .select_related("host")
        .order_by("created_at", "name")
    )
    if request.GET.get("deleted") != "1":
        nodes = nodes.exclude(phase=NodePhase.DELETED)
    operations = list(
        scope_queryset(Operation.objects.filter(target_id=pool.id), request.principal)[:15]
    )
    return {
        "pool": pool,
        "cluster": pool.cluster,
        "nodes": list(nodes),
        "operations": [(op, pool.name) for op in operations],
        "failed_operation": _last_failed(operations, pool.id),
        "gone": pool.phase in GONE_PHASES,
        "poll_s": POLL_S,
        "live_fragment": is_htmx(request) and request.GET.get("fragment") == "live",
    }


def _node_versions(pool: NodePool) -> list[str]:
    """Kubernetes versions the pool's nodes may move to: supported and run by the cluster's
    provider, not older than what they run, within the skew the control plane allows (newest
    first)."""
    cluster = pool.cluster
    control_plane = cluster.control_plane_version or cluster.kubernetes_version
    current = pool.kubernetes_version or control_plane
    return [
        kv.version
        for kv in runnable_versions(cluster.provider)
        if minor(kv.version) >= minor(current)
        and node_version_problem(control_plane, kv.version) is None
    ]


def _pool_forms(pool: NodePool, **forms) -> dict:
    """The pool page's forms (scale, isolation, node upgrade), unbound unless given."""
    out = {
        "scale_form": ScaleForm(initial={"node_count": pool.node_count}),
        "isolation_form": IsolationForm(
            model=pool.gpu_model, initial=_isolation_initial(pool.isolation)
        ),
        "upgrade_form": NodeUpgradeForm(
            versions=_node_versions(pool),
            initial={"kubernetes_version": pool.kubernetes_version, "max_unavailable": 1},
        ),
        "dry_run": None,
        # the API refuses isolation changes of shared pools (409): the page offers none
        "isolation_changeable": not is_shared_policy(pool.isolation),
        "confirm_form": ConfirmNameForm(name=pool.name),
        "disruption": disruption_of_pool(pool),
        "cli_scale": cli.nodepool_scale(pool, pool.node_count),
        "cli_isolation": cli.nodepool_isolation(pool, pool.isolation),
        "cli_upgrade": cli.nodepool_upgrade(
            pool, pool.kubernetes_version or pool.cluster.kubernetes_version
        ),
    }
    out.update(forms)
    return out


@tenant_page
def nodepool_upgrade(request: HttpRequest, cluster_id, pool_id) -> HttpResponse:
    """``upgrade_nodepool`` (UPGRADE_NODES): Kubernetes version and/or driver, node by node."""
    pool = _get_pool(request, cluster_id, pool_id)
    if (deny := require_write(request)) is not None:
        return deny
    if request.method != "POST":
        return redirect("portal:nodepool-detail", pool.cluster_id, pool.id)
    form = NodeUpgradeForm(request.POST, versions=_node_versions(pool))
    if form.is_valid():
        _, op = validate_then_call(
            form,
            UpgradeSerializer,
            form.payload(),
            upgrade_nodepool,
            principal=request.principal,
            pool=pool,
        )
        if op is not None:
            messages.success(request, f"Node pool {pool.name}: upgrade started.")
            return redirect("portal:nodepool-detail", pool.cluster_id, pool.id)
    context = _pool_context(request, pool)
    context.update(_pool_forms(pool, upgrade_form=form))
    return render(request, "portal/nodepool_detail.html", context, status=400)


@require_POST
@tenant_page
def nodepool_resume_upgrade(request: HttpRequest, cluster_id, pool_id) -> HttpResponse:
    """Resume a paused upgrade (``force`` evicts the pods that block the drain)."""
    pool = _get_pool(request, cluster_id, pool_id)
    if (deny := require_write(request)) is not None:
        return deny
    try:
        resume_upgrade(
            principal=request.principal, pool=pool, force=request.POST.get("force") == "on"
        )
    except ApiError as exc:
        messages.error(request, f"{exc.detail} ({exc.code})")
    else:
        messages.success(request, f"Node pool {pool.name}: upgrade resumed.")
    return redirect("portal:nodepool-detail", pool.cluster_id, pool.id)


@tenant_page
def nodepool_detail(request: HttpRequest, cluster_id, pool_id) -> HttpResponse:
    """Spec and isolation, rendered GPU config, nodes with their GPUs; scale and change the
    isolation (each answers with an operation), delete."""
    pool = _get_pool(request, cluster_id, pool_id)
    context = _pool_context(request, pool)
    if is_htmx(request) and request.GET.get("fragment") == "live":
        return render(request, "portal/partials/nodepool_live.html", context)
    context.update(_pool_forms(pool))
    return render(request, "portal/nodepool_detail.html", context)


def _isolation_initial(isolation: dict) -> dict:
    initial = {"isolation_mode": isolation.get("mode", "exclusive")}
    if "mig_profile" in isolation:
        initial["mig_profile"] = isolation["mig_profile"]
    if "mig_layout" in isolation:
        initial["mig_layout"] = ", ".join(f"{k}={v}" for k, v in isolation["mig_layout"].items())
    for key in ("vgpu_profile", "replicas"):
        if key in isolation:
            initial[key] = isolation[key]
    return initial


@tenant_page
def nodepool_scale(request: HttpRequest, cluster_id, pool_id) -> HttpResponse:
    """``set_node_pool_size`` (the API's ``set-size``)."""
    pool = _get_pool(request, cluster_id, pool_id)
    if (deny := require_write(request)) is not None:
        return deny
    if request.method != "POST":
        return redirect("portal:nodepool-detail", pool.cluster_id, pool.id)
    form = ScaleForm(request.POST)
    if form.is_valid():
        data, op = validate_then_call(
            form,
            SetSizeSerializer,
            {"node_count": form.cleaned_data["node_count"]},
            set_node_pool_size,
            principal=request.principal,
            pool=pool,
        )
        if data is not None and op is not None:
            messages.success(request, f"Node pool {pool.name}: resizing to {data['node_count']}.")
            return redirect("portal:nodepool-detail", pool.cluster_id, pool.id)
    context = _pool_context(request, pool)
    context.update(_pool_forms(pool, scale_form=form))
    return render(request, "portal/nodepool_detail.html", context, status=400)


@tenant_page
def nodepool_isolation(request: HttpRequest, cluster_id, pool_id) -> HttpResponse:
    """``update_isolation``: check (dry run: which nodes are drained / repartitioned) or apply
    (an UPDATE_ISOLATION operation that rolls node by node)."""
    pool = _get_pool(request, cluster_id, pool_id)
    if (deny := require_write(request)) is not None:
        return deny
    if request.method != "POST":
        return redirect("portal:nodepool-detail", pool.cluster_id, pool.id)
    form = IsolationForm(request.POST, model=pool.gpu_model)
    check = request.POST.get("action") == "check"
    # applying re-partitions every node (drained one at a time): the pool's name is typed
    confirm_form = ConfirmNameForm(None if check else request.POST, name=pool.name)
    dry_run = None
    status = 200
    if not check and not confirm_form.is_valid():
        status = 400
    elif form.is_valid():
        isolation = form.isolation()
        _, result = (
            validate_then_call(
                form,
                NodePoolUpdateSerializer,
                {"isolation": isolation},
                pool_services.update_isolation,
                principal=request.principal,
                pool=pool,
                dry_run=check,
            )
            if isolation is not None
            else (None, None)
        )
        if isinstance(result, pool_services.DryRun):
            dry_run = result
        elif result is not None:
            messages.success(request, f"Node pool {pool.name}: isolation change started.")
            return redirect("portal:nodepool-detail", pool.cluster_id, pool.id)
    context = _pool_context(request, pool)
    context.update(
        _pool_forms(pool, isolation_form=form, dry_run=dry_run, confirm_form=confirm_form)
    )
    return render(request, "portal/nodepool_detail.html", context, status=status)


@tenant_page
def nodepool_delete(request: HttpRequest, cluster_id, pool_id) -> HttpResponse:
    """Confirm by typing the pool's name (checked here), then ``delete_nodepool``."""
    pool = _get_pool(request, cluster_id, pool_id)
    if (deny := require_write(request)) is not None:
        return deny
    disruption = disruption_of_pool(pool)
    return confirm_delete(
        request,
        name=pool.name,
        delete=lambda: pool_services.delete_nodepool(principal=request.principal, pool=pool),
        done=f"Node pool {pool.name} is being deleted.",
        back=reverse("portal:nodepool-detail", args=[pool.cluster_id, pool.id]),
        page={
            "kind": "nodepool",
            "disruption": disruption,
            "title": f"Delete node pool {pool.name}?",
            "message": (
                f"Its {disruption['nodes']} node(s) are drained and their "
                f"{'GPU instances' if disruption['gpu_instances'] else 'GPUs'} released; "
                "billing for them stops. This cannot be undone."
            ),
            "button": "Delete node pool",
            "cancel": reverse("portal:nodepool-detail", args=[pool.cluster_id, pool.id]),
            "cli": cli.nodepool_delete(pool),
        },
    )


@tenant_page
def node_detail(request: HttpRequest, cluster_id, pool_id, node_id) -> HttpResponse:
    """A node of the tenant: its host, its GPUs (health, memory, MIG devices) and their mean
    utilization over the last hour (1-minute rollups of the agent's samples)."""
    node = get_scoped_or_404(
        Node.objects.filter(cluster_id=cluster_id, nodepool_id=pool_id).select_related(
            "host", "nodepool", "cluster"
        ),
        request.principal,
        pk=node_id,
    )
    gpus = list(Gpu.objects.filter(uuid__in=node.gpu_uuids).order_by("index"))
    since = timezone.now() - timedelta(hours=1)
    util: dict[str, float | None] = {}
    for uuid in node.gpu_uuids:
        rows = GpuRollup1m.objects.filter(
            gpu_uuid=uuid, mig_gpu_instance_id__isnull=True, bucket__gte=since
        ).values_list("utilization_gpu_pct_sum", "utilization_samples")
        total = sum((s or 0.0) for s, n in rows if n)
        count = sum(n for _s, n in rows)
        util[uuid] = total / count if count else None
    layout = {g.get("gpu_uuid"): g for g in node.gpu_layout or []}
    return render(
        request,
        "portal/node_detail.html",
        {
            "node": node,
            "gpus": [(g, util.get(g.uuid), layout.get(g.uuid)) for g in gpus],
            "cluster": node.cluster,
            "pool": node.nodepool,
        },
    )
