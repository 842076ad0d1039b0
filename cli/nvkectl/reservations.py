"""``nvkectl reservations``: capacity reservations (N GPUs of a model in a region, or a whole
NVLink domain, for a window) and the free-capacity calendar; and the dry-run summary that
``nvkectl nodepools create --dry-run`` prints (capacity, quota left, hourly cost)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.console import Console

from .api import Client
from .output import Format, emit
from .usage import no_price

app = typer.Typer(no_args_is_help=True, help="GPU capacity reservations and the calendar.")
out = Console(width=200)

Output = Annotated[Format, typer.Option("--output", "-o", help="table, json or csv")]
COLUMNS = ["name", "id", "state", "gpu_model", "region", "gpus", "used_gpus", "start", "end"]
CALENDAR_COLUMNS = ["start", "end", "capacity", "on_demand", "reserved", "free", "overcommitted"]


def _client(ctx: typer.Context) -> Client:
    return Client.for_context(ctx.obj["context"])


def _row(r: dict[str, Any]) -> dict[str, Any]:
    domain = r.get("nvlink_domain") or {}
    return {**r, "nvlink_domain": domain.get("label")}


@app.command("create")
def create(
    ctx: typer.Context,
    gpu_model: Annotated[str, typer.Option(help="catalog slug, e.g. h100-sxm5-80gb")],
    region: Annotated[str, typer.Option("--region", "-r")],
    start: Annotated[str, typer.Option(help="RFC 3339, e.g. 2026-12-03T00:00:00Z")],
    end: Annotated[str | None, typer.Option(help="RFC 3339; left out: open-ended")] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs (left out with --nvlink-domain)")] = None,
    nvlink_domain: Annotated[
        str | None, typer.Option(help="<clusterUuid>.<cliqueId>: reserve the whole domain")
    ] = None,
    zone: Annotated[str | None, typer.Option()] = None,
    end_action: Annotated[str, typer.Option(help="keep or drain")] = "keep",
    name: Annotated[str | None, typer.Option()] = None,
    tenant: Annotated[str | None, typer.Option(help="operators: the tenant's id")] = None,
    output: Output = Format.table,
) -> None:
    """Reserve GPUs for a window (201, or the API's 409 saying how many could be)."""
    body: dict[str, Any] = {
        "gpu_model": gpu_model,
        "region": region,
        "start": start,
        "end": end,
        "end_action": end_action,
    }
    for key, value in (
        ("gpus", gpus),
        ("nvlink_domain", nvlink_domain),
        ("zone", zone),
        ("name", name),
        ("tenant", tenant),
    ):
        if value is not None:
            body[key] = value
    made = _client(ctx).json("POST", "reservations", json=body)
    emit([_row(made)], [*COLUMNS, "nvlink_domain"], output, raw=made)


@app.command("list")
def list_(ctx: typer.Context, output: Output = Format.table) -> None:
    """Reservations of your tenant."""
    rows = _client(ctx).list_all("reservations")
    emit([_row(r) for r in rows], COLUMNS, output, raw=rows)


@app.command("get")
def get(ctx: typer.Context, reservation: str, output: Output = Format.table) -> None:
    """One reservation, by id."""
    found = _client(ctx).json("GET", f"reservations/{reservation}")
    emit(
        [_row(found)],
        [*COLUMNS, "nvlink_domain", "end_action", "announce_at"],
        output,
        raw=found,
    )


@app.command("cancel")
def cancel(ctx: typer.Context, reservation: str) -> None:
    """Cancel a reservation now (its pools do what its end action says)."""
    done = _client(ctx).json("POST", f"reservations/{reservation}/cancel")
    out.print(f"reservation {done['id']} {done['state']} at {done['cancelled_at']}")


@app.command("calendar")
def calendar(
    ctx: typer.Context,
    gpu_model: Annotated[str, typer.Option(help="catalog slug")],
    region: Annotated[str, typer.Option("--region", "-r")],
    start: Annotated[str | None, typer.Option("--from", help="RFC 3339 (default now)")] = None,
    end: Annotated[str | None, typer.Option("--to", help="RFC 3339 (default +7 days)")] = None,
    zone: Annotated[str | None, typer.Option()] = None,
    output: Output = Format.table,
) -> None:
    """Free capacity of a GPU model in a region over a window (counts only)."""
    params = {
        k: v
        for k, v in (
            ("gpu_model", gpu_model),
            ("region", region),
            ("start", start),
            ("end", end),
            ("zone", zone),
        )
        if v
    }
    body = _client(ctx).json("GET", "reservations/calendar", params=params)
    emit(body["intervals"], CALENDAR_COLUMNS, output, raw=body)


def _money(value: Any) -> str:
    """An amount as the invoice prints it (2 decimals); the API sends JSON numbers."""
    return f"{Decimal(str(value)):.2f}"


def _number(value: Any) -> str:
    """A quantity without trailing zeros (``8.0`` -> ``8``, ``0.857142`` stays)."""
    return f"{Decimal(str(value)).normalize():f}"


def capacity_line(cap: dict[str, Any]) -> str:
    """The dry run's capacity figures in their unit: whole GPUs, or for a shared pool
    (``unit`` ``gpu_instance``) GPU instances of each MIG profile on shared hosts."""
    if cap.get("unit") == "gpu_instance":
        rows = cap.get("gpu_instances") or []
        needed = " + ".join(f"{r['needed']} x {r['profile']}" for r in rows)
        free = ", ".join(f"{r['free']} x {r['profile']}" for r in rows)
        return (
            f"  needed {needed} GPU instance(s), free {free} on shared hosts, "
            f"placeable from {cap.get('placeable_from')}"
        )
    # on a reservation, reserved_gpus is its size and the others' nodes hold the rest; else
    # the region's reserved GPUs (a trial read "reserved 4" beside another reservation's 8)
    on = bool(cap.get("reservation_id"))
    reserved = "reservation of" if on else "reserved"
    held = "held by other reservations" if on else "held by reservations"
    return (
        f"  needed {cap.get('needed_gpus')} GPU(s), free {cap.get('free_gpus')}, "
        f"{reserved} {cap.get('reserved_gpus')}, {held} "
        f"{cap.get('held_by_reservations', 0)}, placeable from {cap.get('placeable_from')}"
        + (f", reservation {cap['reservation_id']}" if on else "")
    )


def print_dry_run(body: dict[str, Any]) -> None:
    """The dry run's three answers, one block each (``-o json`` prints the body instead)."""
    cap = body.get("capacity") or {}
    quota = body.get("quota") or {}
    cost = body.get("cost")
    verdict = "placeable now" if cap.get("placeable_now") else "NOT placeable now"
    message = cap.get("message", "")
    # most messages open with the verdict ("placeable now: 56 x 1g.10gb ..."): said once
    said = message.lower().startswith(("placeable now", "not placeable"))
    line = message if said else f"{verdict}: {message}"
    out.print(f"capacity: {line}", markup=False, highlight=False)
    out.print(capacity_line(cap), markup=False, highlight=False)
    g, n = quota.get("gpus", {}), quota.get("nodes", {})
    if not quota:  # a resize within what the pool's spec already holds reserves nothing more
        out.print(
            "quota: nothing more to reserve: the pool's quota already counts this size",
            markup=False,
            highlight=False,
        )
    else:
        out.print(
            f"quota: {'fits' if quota.get('fits') else 'EXCEEDED'}: {g.get('gpu_model')} GPUs "
            f"limit {g.get('limit')}, reserved {g.get('reserved')}, requested "
            f"{g.get('requested')}, left after {g.get('left_after')}; nodes limit "
            f"{n.get('limit')}, requested "
            f"{n.get('requested')}, left after {n.get('left_after')}",
            markup=False,
            highlight=False,
        )
    if cost is None:
        # the API's reason (model, profile, currency), as `nvkectl usage` prints it
        out.print(f"cost: {no_price(body.get('cost_error'))}", markup=False, highlight=False)
        return
    if cost["basis"] != "reservation":
        line = (
            f"cost: {_money(cost['hourly'])} {cost['currency']} per hour (on-demand: "
            f"{_number(cost['gpu_hours_per_hour'])} GPU-h per hour at "
            f"{_number(cost['unit_price'])} per GPU-hour)"
        )
    else:
        line = (
            f"cost: {_money(cost['hourly'])} {cost['currency']} per hour (its "
            f"{_number(cost['gpu_hours_per_hour'])} GPU-h per hour are covered by the "
            f"reservation)"
        )
        if cost.get("reservation_hourly") is not None:
            line += (
                f"; the reservation itself: {_money(cost['reservation_hourly'])} "
                f"{cost['currency']}/h at {_number(cost['reservation_unit_price'])} per reserved "
                f"GPU-hour, billed whether used or not"
            )
        else:
            line += (
                "; the reservation itself: no reservation rate on the price sheet (its invoice "
                "cannot be built: missing_reservation_price)"
            )
    out.print(line, markup=False, highlight=False)
