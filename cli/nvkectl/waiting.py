"""``--wait``: follow an Operation (its ``Location``) with a progress bar until it finishes."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

from .api import ApiError, Client

FINISHED = {"DONE", "FAILED", "CANCELLED"}


def follow(client: Client, operation: dict[str, Any], *, timeout: float, poll: float = 1.0):
    """Poll the operation until DONE/FAILED/CANCELLED; returns its last state. Raises ApiError
    ``operation_failed`` when it did not end DONE and ``wait_timeout`` after ``timeout`` s."""
    url = f"operations/{operation['id']}"
    deadline = time.monotonic() + timeout
    op = operation
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[stage]}"),
        transient=False,
    ) as bar:
        task = bar.add_task(f"{op['type']} {op['id'][:8]}", total=None, stage=op["status"])
        while True:
            progress = op.get("progress") or {}
            total = progress.get("total") or None
            bar.update(
                task,
                total=total,
                completed=progress.get("done", 0),
                stage=progress.get("stage") or op["status"],
            )
            if op["status"] in FINISHED:
                if total:
                    bar.update(task, completed=total if op["status"] == "DONE" else None)
                break
            if time.monotonic() > deadline:
                raise ApiError(0, "wait_timeout", f"{op['type']} not finished after {timeout:g} s")
            time.sleep(poll)
            op = client.json("GET", url)
    if op["status"] != "DONE":
        error = op.get("error") or {}
        raise ApiError(
            0,
            error.get("code") or "operation_failed",
            f"{op['type']} {op['status']}: {error.get('message') or 'no detail'}",
        )
    return op
