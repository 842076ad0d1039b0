"""What ``nvkectl usage`` and ``nvkectl invoices`` print beside the API's rows: each row's
cost (the API rates it as the invoice does), the total with the reservations' charges, and
why a list is empty (usage is aggregated every few minutes; invoices are built by an
operator, never on request)."""

from __future__ import annotations

from typing import Any


def money(cost: dict[str, str] | None) -> str:
    """``{"USD": "10.00"}`` -> ``10.00 USD``; ``-`` for none, ``no price`` for null."""
    if cost is None:
        return "no price"
    if not cost:
        return "-"
    return " + ".join(f"{amount} {currency}" for currency, amount in sorted(cost.items()))


def usage_rows(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The API's rows with ``cost`` as text (``10.00 USD``)."""
    return [{**row, "cost": money(row.get("cost"))} for row in body.get("results", [])]


def usage_notes(body: dict[str, Any]) -> list[str]:
    """Lines for stderr after the table: the total, the reservations, a missing price, and
    why nothing is listed."""
    totals = body.get("totals") or {}
    notes = []
    error = totals.get("cost_error")
    if error:
        notes.append(f"cost: none shown: {error.get('detail')} ({error.get('code')})")
    for r in body.get("reservations") or []:
        notes.append(
            f"reservation {r['reservation_name']}: {r['reserved_gpu_hours']} reserved GPU-h, "
            f"{money(r.get('cost'))} (the usage it covers costs nothing more)"
        )
    if not body.get("results") and not float(totals.get("gpu_hours") or 0):
        every = body.get("aggregated_every_s")
        when = f"every {int(every) // 60} min" if every else "every few minutes"
        notes.append(
            f"no usage in {body.get('start')} .. {body.get('end')}: usage is aggregated {when} "
            "from the allocation ledger, so a node that became READY just now shows up later"
        )
    else:
        notes.append(
            f"total: {totals.get('billable_gpu_hours')} billable GPU-h, {money(totals.get('cost'))}"
        )
    return notes


INVOICES_EMPTY = (
    "no invoices yet: invoices are built by an operator (monthly drafts, or the console's "
    "'Build drafts now'), not on request; `nvkectl usage` shows the cost so far"
)
