"""Operator console: defragmentation — the dry run of a plan (what it frees, whom it disrupts,
the moves in order) and runs with their progress. The page calls the services the API calls
(:func:`nodepools.defrag.make_plan`, :func:`nodepools.defrag.start_run`); no logic here."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from rest_framework import serializers

from nodepools import defrag
from nodepools.api.defrag import DefragQuerySerializer
from nodepools.defrag_models import DefragRun
from nvke.errors import ApiError
from portal.access import console_page
from tenants import audit

#: runs listed on the page
RECENT_RUNS = 20


def _query(data) -> dict:
    form = DefragQuerySerializer(data={k: v for k, v in data.items() if v not in ("", None)})
    form.is_valid(raise_exception=True)
    return dict(form.validated_data)


@console_page
def defrag_page(request: HttpRequest) -> HttpResponse:
    """The dry run for the filter in the query string, and the recent runs."""
    try:
        query = _query(request.GET)
        plan = defrag.make_plan(**query)
        problem = ""
    except serializers.ValidationError as exc:
        query, plan, problem = {}, None, f"invalid filter: {exc.detail}"
    return render(
        request,
        "portal/console/defrag.html",
        {
            "plan": plan,
            "problem": problem,
            "query": query,
            "runs": DefragRun.objects.order_by("-created_at")[:RECENT_RUNS],
            "active": DefragRun.objects.filter(active=True).first(),
        },
    )


@console_page
@require_POST
def defrag_start(request: HttpRequest) -> HttpResponse:
    """Plan now with the page's filter and run the plan (audited ``defrag.start``)."""
    actor = request.principal.label
    try:
        run = defrag.start_run(actor=actor, **_query(request.POST))
    except serializers.ValidationError as exc:
        messages.error(request, f"invalid filter: {exc.detail}")
        return redirect("console:defrag")
    except ApiError as exc:
        messages.error(request, f"{exc.detail} ({exc.code})")
        return redirect("console:defrag")
    audit.record(
        actor=actor,
        action="defrag.start",
        target_type="defrag_run",
        target_id=run.pk,
        before={},
        after={"steps": run.progress.get("total", 0), "hosts": run.plan.get("hosts_freed", [])},
    )
    # not the stage: the run page shows it live, a stage in the flash went stale above it
    steps = run.progress.get("total", 0)
    messages.success(
        request, f"Defragmentation run started ({steps} step(s)); its progress is shown live."
    )
    return redirect("console:defrag-run", run.pk)


@console_page
def defrag_run(request: HttpRequest, run_id) -> HttpResponse:
    """One run: its status, progress, the error that stopped it, its plan step by step."""
    run = get_object_or_404(DefragRun, pk=run_id)
    steps = run.plan.get("steps") or []
    rows = []
    for number, step in enumerate(steps):
        if number < run.step:
            state = "done"
        elif number == run.step and run.status == "FAILED":
            state = "stopped"
        elif number == run.step and run.step_state:
            state = "moving"
        else:
            state = "pending"
        rows.append({"number": number + 1, "step": step, "state": state})
    return render(
        request,
        "portal/console/defrag_run.html",
        {"run": run, "rows": rows, "poll": run.active is True},
    )
