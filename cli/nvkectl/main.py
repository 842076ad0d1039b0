"""nvkectl: contexts, clusters, node pools, reservations, credentials, usage and invoices.

Exit codes: 0 done; 1 the API refused (problem+json, printed as one line with its code) or an
operation followed with ``--wait`` failed; 2 usage or configuration error.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from . import config, kubeconfig
from . import pools as pools_cli
from . import reservations as reservations_cli
from . import usage as usage_cli
from .api import ApiError, Client
from .output import Format, emit
from .waiting import follow

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__.split("\n")[0])
config_app = typer.Typer(no_args_is_help=True, help="Contexts: server URL and API key.")
clusters_app = typer.Typer(no_args_is_help=True, help="Kubernetes clusters.")
pools_app = typer.Typer(no_args_is_help=True, help="GPU node pools of a cluster.")
app.add_typer(config_app, name="config")
app.add_typer(clusters_app, name="clusters")
app.add_typer(pools_app, name="nodepools")
app.add_typer(reservations_cli.app, name="reservations")

# soft_wrap: a message is one line however narrow the terminal, and off a terminal (where rich
# assumes 80 columns) a long kubeconfig path is never broken in two
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

Output = Annotated[Format, typer.Option("--output", "-o", help="table, json or csv")]
Wait = Annotated[bool, typer.Option("--wait", help="follow the operation until it finishes")]
Timeout = Annotated[float, typer.Option("--timeout", help="seconds --wait waits at most")]

CLUSTER_COLUMNS = ["name", "id", "phase", "kubernetes_version", "region", "provider"]
VERSION_COLUMNS = ["version", "released", "end_of_life"]
POOL_COLUMNS = [
    "name",
    "id",
    "phase",
    "gpu_model",
    "gpus_per_node",
    "node_count",
    "isolation",
    "resources_per_node",
    "driver",
]
#: ``nodepools get``'s second table: each node with the versions it runs (the kubelet's and
#: the driver its host's agent reports), as the portal's node rows show them
NODE_COLUMNS = [
    "name",
    "phase",
    "host",
    "zone",
    "kubernetes_version",
    "driver_version",
    "disruption",
]


@app.callback()
def main(
    ctx: typer.Context,
    context: Annotated[
        str | None, typer.Option("--context", help="context to use (default: current)")
    ] = None,
) -> None:
    ctx.obj = {"context": context}


def _client(ctx: typer.Context) -> Client:
    return Client.for_context(ctx.obj["context"])


def _accepted(client: Client, op: dict[str, Any], wait: bool, timeout: float) -> None:
    if wait:
        op = follow(client, op, timeout=timeout)
    out.print(f"{op['type']} {op['id']} {op['status']}")


def _cluster(client: Client, ref: str) -> dict[str, Any]:
    """A cluster by name (not DELETED) or id."""
    try:
        return client.json("GET", f"clusters/{uuid.UUID(ref)}")
    except ValueError:
        pass
    for cluster in client.list_all("clusters"):
        if cluster["name"] == ref and cluster["phase"] != "DELETED":
            return cluster
    raise ApiError(404, "not_found", f"no cluster named {ref!r}")


def _pool(client: Client, cluster: dict[str, Any], ref: str) -> dict[str, Any]:
    for pool in client.list_all(f"clusters/{cluster['id']}/nodepools"):
        if ref in (pool["name"], pool["id"]) and pool["phase"] != "DELETED":
            return pool
    raise ApiError(404, "not_found", f"no node pool {ref!r} in cluster {cluster['name']!r}")


# ------------------------------------------------------------------ config
@config_app.command("set-context")
def set_context(
    name: str,
    server: Annotated[str, typer.Option(help="NVKE URL, e.g. https://nvke.example.com")],
    api_key: Annotated[str, typer.Option(help="API key `<prefix>.<secret>`")],
) -> None:
    """Add or replace a context (the file is created 0600)."""
    config.set_context(name, server=server, api_key=api_key)
    out.print(f"context {name} saved in {config.config_path()}")


@config_app.command("use-context")
def use_context(name: str) -> None:
    """Make a context the current one."""
    config.use_context(name)
    out.print(f"current context: {name}")


@config_app.command("get-contexts")
def get_contexts(output: Output = Format.table) -> None:
    """List contexts (keys are not shown)."""
    data = config.load()
    rows = [
        {"current": "*" if n == data["current-context"] else "", "name": n, "server": c["server"]}
        for n, c in data["contexts"].items()
    ]
    emit(rows, ["current", "name", "server"], output)


# ------------------------------------------------------------------ clusters
@clusters_app.command("versions")
def clusters_versions(ctx: typer.Context, output: Output = Format.table) -> None:
    """Kubernetes versions a new cluster can run here (the catalog's ``runnable`` ones:
    supported, and run by the installation's provider), newest first."""
    rows = _client(ctx).list_all("catalog/kubernetes-versions")
    emit([r for r in rows if r.get("runnable")], VERSION_COLUMNS, output)


@clusters_app.command("create")
def clusters_create(
    ctx: typer.Context,
    name: str,
    kubernetes_version: Annotated[
        str,
        typer.Option(
            "--kubernetes-version",
            "-k",
            help="one of `nvkectl clusters versions` (others are refused, listing those)",
        ),
    ],
    region: Annotated[str, typer.Option("--region", "-r")],
    wait: Wait = False,
    timeout: Timeout = 600,
) -> None:
    """Create a cluster (202: an Operation; --wait follows it)."""
    client = _client(ctx)
    body = {"name": name, "kubernetes_version": kubernetes_version, "region": region}
    _accepted(client, client.json("POST", "clusters", json=body), wait, timeout)


@clusters_app.command("list")
def clusters_list(
    ctx: typer.Context,
    output: Output = Format.table,
    show_deleted: Annotated[
        bool, typer.Option("--show-deleted", help="also list DELETED clusters (kept for history)")
    ] = False,
) -> None:
    """Clusters of your tenant (DELETED ones only with --show-deleted, as in the API and the
    portal)."""
    params = {"show_deleted": "true"} if show_deleted else {}
    emit(_client(ctx).list_all("clusters", **params), CLUSTER_COLUMNS, output)


@clusters_app.command("get")
def clusters_get(ctx: typer.Context, cluster: str, output: Output = Format.table) -> None:
    """One cluster, by name or id."""
    found = _cluster(_client(ctx), cluster)
    emit([found], CLUSTER_COLUMNS, output, raw=found)


@clusters_app.command("upgrade")
def clusters_upgrade(
    ctx: typer.Context,
    cluster: str,
    kubernetes_version: Annotated[str, typer.Option("--kubernetes-version", "-k")],
    wait: Wait = False,
    timeout: Timeout = 600,
) -> None:
    """Upgrade the control plane one minor version."""
    client = _client(ctx)
    found = _cluster(client, cluster)
    op = client.json(
        "PATCH", f"clusters/{found['id']}", json={"kubernetes_version": kubernetes_version}
    )
    _accepted(client, op, wait, timeout)


@clusters_app.command("delete")
def clusters_delete(
    ctx: typer.Context, cluster: str, wait: Wait = False, timeout: Timeout = 600
) -> None:
    """Delete a cluster and its node pools; the kubeconfig context get-credentials merged for
    it is removed once the deletion is accepted."""
    client = _client(ctx)
    found = _cluster(client, cluster)
    op = client.json("DELETE", f"clusters/{found['id']}")
    merged = config.forget_merged(found["id"])
    if merged and kubeconfig.remove_from(Path(merged["kubeconfig"]), merged["context"]):
        out.print(f"context {merged['context']} removed from {merged['kubeconfig']}")
    _accepted(client, op, wait, timeout)


# ------------------------------------------------------------------ node pools
@pools_app.command("create")
def pools_create(
    ctx: typer.Context,
    cluster: str,
    name: str,
    gpu_model: Annotated[str | None, typer.Option(help="catalog slug, e.g. h100-sxm5-80gb")] = None,
    gpus_per_node: Annotated[int | None, typer.Option()] = None,
    nodes: Annotated[int | None, typer.Option(help="node count")] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="YAML/JSON with the API's fields; flags override"),
    ] = None,
    isolation_mode: Annotated[
        str | None,
        typer.Option("--isolation", help="exclusive | mig | vgpu | time-slicing | mps"),
    ] = None,
    mig_profile: Annotated[
        str | None, typer.Option(help="one MIG profile on every GPU, e.g. 1g.10gb")
    ] = None,
    mig_layout: Annotated[
        str | None, typer.Option(help="per-GPU MIG layout, e.g. 3g.40gb=1,1g.10gb=2")
    ] = None,
    vgpu_profile: Annotated[
        str | None, typer.Option(help="one vGPU type on every GPU, e.g. A10-4Q")
    ] = None,
    vgpu_layout: Annotated[
        str | None, typer.Option(help="vGPU types and counts per GPU, e.g. A10-4Q=3,A10-6Q=2")
    ] = None,
    replicas: Annotated[
        int | None, typer.Option(help="time-slicing / MPS replicas per GPU")
    ] = None,
    tenancy: Annotated[
        str | None, typer.Option(help="dedicated | shared (MIG instances on shared hosts)")
    ] = None,
    driver_version: Annotated[
        str | None,
        typer.Option(
            help="driver branch (R580) or release (580.95.05) to pin; omit: no pin, each node "
            "runs its host's driver (a host's driver is one for all its nodes)"
        ),
    ] = None,
    cuda_version: Annotated[str | None, typer.Option(help="CUDA the workloads need")] = None,
    reservation: Annotated[
        str | None, typer.Option(help="id of your reservation the pool draws from")
    ] = None,
    same_nvlink_domain: Annotated[
        bool, typer.Option("--same-nvlink-domain", help="every node in one NVLink domain")
    ] = False,
    gpu_publishing: Annotated[
        str | None,
        typer.Option(help="device-plugin (nvidia.com/gpu on each Node) | dra (ResourceSlices)"),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="create nothing: print capacity, quota left and cost"),
    ] = False,
    output: Output = Format.table,
    wait: Wait = False,
    timeout: Timeout = 600,
) -> None:
    """Add a GPU node pool: every field the API takes, as flags or in -f pool.yaml."""
    client = _client(ctx)
    found = _cluster(client, cluster)
    try:
        body = pools_cli.pool_body(
            name=name,
            file=file,
            gpu_model=gpu_model,
            gpus_per_node=gpus_per_node,
            nodes=nodes,
            mode=isolation_mode,
            mig_profile=mig_profile,
            mig_layout=mig_layout,
            vgpu_profile=vgpu_profile,
            vgpu_layout=vgpu_layout,
            replicas=replicas,
            tenancy=tenancy,
            driver_version=driver_version,
            cuda_version=cuda_version,
            reservation=reservation,
            same_nvlink_domain=same_nvlink_domain,
            gpu_publishing=gpu_publishing,
        )
    except (OSError, ValueError) as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from exc
    path = f"clusters/{found['id']}/nodepools"
    if dry_run:
        answer = client.json("POST", path, params={"dry_run": "true"}, json=body)
        if output is Format.json:
            emit([], [], output, raw=answer)
        else:
            reservations_cli.print_dry_run(answer)
        return
    _accepted(client, client.json("POST", path, json=body), wait, timeout)


@pools_app.command("list")
def pools_list(
    ctx: typer.Context,
    cluster: str,
    output: Output = Format.table,
    show_deleted: Annotated[
        bool, typer.Option("--show-deleted", help="also list DELETED node pools (kept for history)")
    ] = False,
) -> None:
    """Node pools of a cluster (DELETED ones only with --show-deleted)."""
    client = _client(ctx)
    found = _cluster(client, cluster)
    params = {"show_deleted": "true"} if show_deleted else {}
    pools = client.list_all(f"clusters/{found['id']}/nodepools", **params)
    emit([pools_cli.pool_row(p) for p in pools], POOL_COLUMNS, output, raw=pools)


@pools_app.command("get")
def pools_get(ctx: typer.Context, cluster: str, pool: str, output: Output = Format.table) -> None:
    """One node pool, by name or id; as a table, then its nodes with their Kubernetes and
    driver versions."""
    client = _client(ctx)
    found = _pool(client, _cluster(client, cluster), pool)
    emit([pools_cli.pool_row(found)], POOL_COLUMNS, output, raw=found)
    if output is Format.table and found.get("nodes"):
        emit(found["nodes"], NODE_COLUMNS, output)


@pools_app.command("scale")
def pools_scale(
    ctx: typer.Context,
    cluster: str,
    pool: str,
    nodes: Annotated[int, typer.Option(help="new node count")],
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="change nothing: print the nodes it would remove or provision"
        ),
    ] = False,
    output: Output = Format.table,
    wait: Wait = False,
    timeout: Timeout = 600,
) -> None:
    """Set the node count (a scale-down removes unhealthy nodes first, then the newest)."""
    client = _client(ctx)
    found = _pool(client, _cluster(client, cluster), pool)
    path = f"clusters/{found['cluster_id']}/nodepools/{found['id']}/set-size"
    if dry_run:
        answer = client.json("POST", path, params={"dry_run": "true"}, json={"node_count": nodes})
        if output is Format.json:
            emit([], [], output, raw=answer)
        else:
            for line in pools_cli.resize_dry_run_lines(answer):
                typer.echo(line)
            if answer.get("capacity"):
                reservations_cli.print_dry_run(answer)
        return
    _accepted(client, client.json("POST", path, json={"node_count": nodes}), wait, timeout)


@pools_app.command("upgrade")
def pools_upgrade(
    ctx: typer.Context,
    cluster: str,
    pool: str,
    kubernetes_version: Annotated[str | None, typer.Option("--kubernetes-version", "-k")] = None,
    driver_version: Annotated[
        str | None,
        typer.Option(
            "--driver-version",
            help="driver branch (R580) or release (580.95.05); refused while another pool's "
            "node shares a host with this pool's nodes (a host's driver is one for all)",
        ),
    ] = None,
    wait: Wait = False,
    timeout: Timeout = 600,
) -> None:
    """Roll the nodes to a Kubernetes version and/or NVIDIA driver."""
    client = _client(ctx)
    found = _pool(client, _cluster(client, cluster), pool)
    body = {
        k: v
        for k, v in (("kubernetes_version", kubernetes_version), ("driver_version", driver_version))
        if v
    }
    path = f"clusters/{found['cluster_id']}/nodepools/{found['id']}/upgrade"
    _accepted(client, client.json("POST", path, json=body), wait, timeout)


REQUEST_COLUMNS = ["id", "state", "reason", "nodes", "deadline", "acknowledged_via"]


@pools_app.command("disruption-hook")
def pools_disruption_hook(
    ctx: typer.Context,
    cluster: str,
    pool: str,
    deadline: Annotated[
        int | None,
        typer.Option(
            "--deadline",
            help="seconds a planned disruption waits for your checkpoint (default 600; the "
            "operator sets the maximum)",
        ),
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="detach the hook")] = False,
) -> None:
    """Show, set (--deadline) or remove (--remove) the pool's disruption hook: before a planned
    disruption NVKE cordons the node, asks (webhook event nodepool.disruption.requested) and
    waits for an ack or the deadline."""
    client = _client(ctx)
    found = _pool(client, _cluster(client, cluster), pool)
    path = f"clusters/{found['cluster_id']}/nodepools/{found['id']}/disruption-hook"
    if remove:
        client.request("DELETE", path)
        out.print(f"node pool {found['name']}: no disruption hook")
        return
    if deadline is not None:
        hook = client.json("PUT", path, json={"checkpoint_deadline_s": deadline})
    else:
        hook = client.json("GET", path)
    if hook:
        out.print(
            f"node pool {found['name']}: planned disruptions wait up to "
            f"{hook['checkpoint_deadline_s']} s for a checkpoint ack"
        )
    else:
        out.print(f"node pool {found['name']}: no disruption hook")


@pools_app.command("disruption-requests")
def pools_disruption_requests(
    ctx: typer.Context, cluster: str, pool: str, output: Output = Format.table
) -> None:
    """The pool's disruption requests (the asks before planned disruptions), newest first."""
    client = _client(ctx)
    found = _pool(client, _cluster(client, cluster), pool)
    rows = client.list_all(
        f"clusters/{found['cluster_id']}/nodepools/{found['id']}/disruption-requests"
    )
    shown = [{**r, "nodes": ",".join(r.get("nodes") or [])} for r in rows]
    emit(shown, REQUEST_COLUMNS, output, raw=rows)


@pools_app.command("ack")
def pools_ack(
    ctx: typer.Context,
    cluster: str,
    pool: str,
    request_id: Annotated[str, typer.Argument(help="the disruption request's id")],
) -> None:
    """Acknowledge a disruption request: your workload has checkpointed, the drain goes on."""
    client = _client(ctx)
    found = _pool(client, _cluster(client, cluster), pool)
    path = (
        f"clusters/{found['cluster_id']}/nodepools/{found['id']}/disruption-requests/"
        f"{request_id}/ack"
    )
    done = client.json("POST", path)
    out.print(f"disruption request {done['id']}: {done['state']}")


@pools_app.command("delete")
def pools_delete(
    ctx: typer.Context, cluster: str, pool: str, wait: Wait = False, timeout: Timeout = 600
) -> None:
    """Delete a node pool (drains and releases its nodes)."""
    client = _client(ctx)
    found = _pool(client, _cluster(client, cluster), pool)
    path = f"clusters/{found['cluster_id']}/nodepools/{found['id']}"
    _accepted(client, client.json("DELETE", path), wait, timeout)


# ------------------------------------------------------------------ credentials, billing
@app.command("get-credentials")
def get_credentials(
    ctx: typer.Context,
    cluster: str,
    kubeconfig_path: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig", help="file to merge into (default: $KUBECONFIG, ~/.kube/config)"
        ),
    ] = None,
) -> None:
    """Merge the cluster's admin kubeconfig under context nvke_<tenant>_<region>_<cluster>."""
    client = _client(ctx)
    found = _cluster(client, cluster)
    text = client.request("GET", f"clusters/{found['id']}/kubeconfig").text
    path = kubeconfig_path or kubeconfig.default_path()
    name = kubeconfig.merge_into(path, text)
    config.remember_merged(found["id"], kubeconfig=path.absolute(), context=name)
    out.print(f"context {name} merged into {path} (now current)")


@app.command("usage")
def usage(
    ctx: typer.Context,
    start: Annotated[
        str | None,
        typer.Option(help="ISO time (default: the start of this billing month, your time zone)"),
    ] = None,
    end: Annotated[str | None, typer.Option(help="ISO time (default: now)")] = None,
    group_by: Annotated[str, typer.Option(help="cluster,pool,model,profile,day")] = "cluster",
    output: Output = Format.table,
) -> None:
    """Billable GPU-hours and their cost (rated as the invoice rates it), grouped."""
    params = {k: v for k, v in (("start", start), ("end", end), ("group_by", group_by)) if v}
    body = _client(ctx).json("GET", "usage", params=params)
    groups = {
        "cluster": "cluster_name",
        "pool": "nodepool_name",
        "model": "gpu_model",
        "profile": "mig_profile",
        "day": "day",
    }
    cols = [groups[g] for g in body["group_by"] if g in groups]
    cols += ["gpu_hours", "sla_credit_gpu_hours", "billable_gpu_hours", "covered", "cost"]
    emit(usage_cli.usage_rows(body), cols, output, raw=body)
    if output is Format.table:
        window = usage_cli.window_note(body, start_given=bool(start), end_given=bool(end))
        for line in usage_cli.usage_notes(body, window):
            err.print(line, markup=False)


@app.command("invoices")
def invoices(
    ctx: typer.Context,
    invoice: Annotated[
        str | None, typer.Argument(help="an invoice's number or id: show its lines")
    ] = None,
    output: Output = Format.table,
) -> None:
    """Invoices of your tenant, or one invoice's lines. A draft whose latest rebuild failed
    reads DRAFT (stale), and a note says why."""
    client = _client(ctx)
    rows = client.list_all("invoices")
    if invoice is not None:
        found = next((r for r in rows if invoice in (r.get("number"), r.get("id"))), None)
        if found is None:
            raise ApiError(404, "not_found", f"no invoice numbered {invoice!r}")
        body = client.json("GET", f"invoices/{found['id']}")
        cols = ["position", "kind", "description", "gpu_hours", "unit_price", "amount"]
        emit(body["lines"], cols, output, raw=body)
        if output is Format.table:
            status = usage_cli.invoice_rows([body])[0]["status"]
            err.print(
                f"{body['number']} {body['period_label']} {status}: "
                f"total {body['total']} {body['currency']}",
                markup=False,
            )
            if note := usage_cli.stale_note(body):
                err.print(note, markup=False)
        return
    cols = [
        "number",
        "period_label",
        "status",
        "currency",
        "usage_amount",
        "credit_amount",
        "total",
    ]
    emit(usage_cli.invoice_rows(rows), cols, output, raw=rows)
    if output is Format.table:
        if not rows:
            err.print(usage_cli.INVOICES_EMPTY, markup=False)
        for row in rows:
            if note := usage_cli.stale_note(row):
                err.print(note, markup=False)


def run() -> None:
    """Console-script entry point: one clear line and a non-zero exit for every failure."""
    try:
        app()
    except ApiError as exc:
        err.print(exc.one_line(), markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    except config.ConfigError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    run()
