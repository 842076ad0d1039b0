"""What ``nvkectl usage`` and ``nvkectl invoices`` print beside the API's rows: each row's
cost (the API rates it as the invoice does) or why it has none, the GPU-hours a reservation
covers, the total with the reservations' charges and the window it covers, and why a list
is empty (usage is aggregated every few minutes; invoices are built by an
operator, never on request)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def money(cost: dict[str, str] | None) -> str:
    """``{"USD": "10.00"}`` -> ``10.00 USD``; ``-`` for none, ``no price`` for null."""
    if cost is None:
        return "no price"
    if not cost:
        return "-"
    return " + ".join(f"{amount} {currency}" for currency, amount in sorted(cost.items()))


def no_price(error: dict | None) -> str:
    """Why the API shows no cost (its ``cost_error``): ``no price: <each unpriced model's
    reason>``, e.g. ``no price: no USD price for a100-sxm4-80gb (whole GPU) at …``; for
    another reason (a dry run on a reservation without room: ``reservation_exhausted``)
    ``no cost: <its detail>``."""
    if not error:
        return "no price"
    if error.get("code") and not str(error["code"]).startswith("missing"):
        return f"no cost: {error.get('detail')}"
    reasons = [m.get("detail", "") for m in error.get("missing") or []] or [error.get("detail")]
    return "no price: " + "; ".join(str(r) for r in reasons)


def cost_text(row: dict[str, Any]) -> str:
    """A row's (or the total's) cost as text, or why there is none."""
    if row.get("cost") is None:
        return no_price(row.get("cost_error"))
    return money(row.get("cost"))


def covered_text(row: dict[str, Any]) -> str:
    """``0.493000 GPU-h by reservation short-block``: the row's GPU-hours a capacity
    reservation covers (they cost nothing more: the reservation is charged on its own);
    ``-`` for none."""
    hours = row.get("covered_gpu_hours")
    if not hours or float(hours) == 0:
        return "-"
    names = ", ".join(row.get("covered_by") or [])
    return f"{hours} GPU-h by reservation {names}".rstrip()


def usage_rows(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The API's rows with ``cost`` as text (``10.00 USD``, or why there is none) and
    ``covered`` (the GPU-hours a reservation covers, by name): (billable - covered) GPU-h x
    the unit price = cost."""
    return [
        {**row, "cost": cost_text(row), "covered": covered_text(row)}
        for row in body.get("results", [])
    ]


def window_note(body: dict[str, Any], *, start_given: bool, end_given: bool) -> str:
    """The window the API chose where ``--start`` / ``--end`` were left out (the default of
    the usage and utilization APIs and the portal: this billing month so far, in the tenant's
    billing time zone); "" when both were given."""
    if start_given and end_given:
        return ""
    if not start_given and not end_given:
        why = "this billing month so far, the default"
    elif not start_given:
        why = "from the start of the billing month of --end, the default"
    else:
        why = "to now, the default"
    return f"window: {body.get('start')} .. {body.get('end')} ({why})"


def usage_notes(body: dict[str, Any], window: str = "") -> list[str]:
    """Lines for stderr after the table: the window when it was a default
    (:func:`window_note`), the reservations, a missing price, the total and the window it
    covers, and why nothing is listed."""
    totals = body.get("totals") or {}
    notes = [window] if window else []
    for r in body.get("reservations") or []:
        notes.append(
            f"reservation {r['reservation_name']}: {r['reserved_gpu_hours']} reserved GPU-h, "
            f"{cost_text(r)} (the usage it covers costs nothing more)"
        )
    if not body.get("results") and not float(totals.get("gpu_hours") or 0):
        every = body.get("aggregated_every_s")
        when = f"every {int(every) // 60} min" if every else "every few minutes"
        notes.append(
            f"no usage in {body.get('start')} .. {body.get('end')}: usage is aggregated {when} "
            "from the allocation ledger, so a node that became READY just now shows up later"
        )
    else:
        window = totals.get("cost_window") or {}
        covered = totals.get("covered_gpu_hours")
        inside = (
            f" ({covered} of them covered by reservations)" if covered and float(covered) else ""
        )
        notes.append(
            f"total: {totals.get('billable_gpu_hours')} billable GPU-h{inside}, "
            f"{cost_text(totals)}, for usage and reservations "
            f"{window.get('start', body.get('start'))} .. {window.get('end', body.get('end'))}"
        )
    return notes


def utc_minute(value: str) -> str:
    """An RFC 3339 time as the portal writes it: ``2026-12-07 03:01 UTC``."""
    return f"{datetime.fromisoformat(value).astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def stale_note(invoice: dict[str, Any]) -> str:
    """Why a DRAFT's figures are stale, from the API's ``build_error`` (the portal and the
    console say the same): ``NVKE-…: rebuild failed 2026-12-07 03:01 UTC: no EUR price for
    … (missing_price); its lines and total are stale (from the build of …) and it cannot be
    finalized until an operator adds the missing price``; "" when its latest build succeeded."""
    error = invoice.get("build_error")
    if not error:
        return ""
    failed = f" {utc_minute(error['failed_at'])}" if error.get("failed_at") else ""
    built = (
        f" (from the build of {utc_minute(invoice['computed_at'])})"
        if invoice.get("computed_at")
        else ""
    )
    return (
        f"{invoice.get('number')}: rebuild failed{failed}: {error.get('detail')} "
        f"({error.get('code')}); its lines and total are stale{built} and it cannot be "
        "finalized until an operator adds the missing price"
    )


def invoice_rows(invoices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The API's invoices for the table: a draft whose latest rebuild failed reads
    ``DRAFT (stale)`` (:func:`stale_note` says why)."""
    return [
        {**i, "status": f"{i.get('status')} (stale)"} if i.get("build_error") else i
        for i in invoices
    ]


INVOICES_EMPTY = (
    "no invoices yet: the month's draft is built every hour from its aggregated usage (an "
    "operator can build drafts now and finalizes them after the month ends), not on request; "
    "`nvkectl usage` shows the cost so far"
)
