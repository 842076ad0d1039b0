"""Operator console: the defragmentation page (dry run) and a run's progress page.

The fleet is the fragmented one of tests/nodepools/test_defrag_run.py (SIMULATED hosts): the
plan frees a-1 (tenant A's node -> a-2) and b-1 (tenant B's node -> b-2), 4 GPUs each, 1.0
GPU-hour each at 15 minutes a move.
"""

from __future__ import annotations

import pytest

from tests.nodepools.test_defrag_run import drive_run, fragmented  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def test_the_console_shows_the_plan_starts_a_run_and_shows_its_progress(
    ops_client,
    fragmented,  # noqa: F811 (the fixture imported above)
    tenant_a,
    tenant_b,
):
    from nodepools.defrag_models import DefragRun
    from nodepools.models import Node
    from tenants.models import AuditEvent

    _hosts, pools = fragmented
    node_a = Node.objects.get(nodepool_id=pools["a-1"][1], phase="READY")
    page = ops_client.get("/console/defrag").content.decode()
    assert '<span id="defrag-hosts">a-1, b-1</span>' in page
    assert "<strong>2.00</strong> GPU-hours of disruption" in page
    frees = page.split('id="defrag-frees"')[1].split("</table>")[0]
    # now: 1 whole host free, 0 islands, 24 free GPUs, 16 stranded for 8-GPU nodes
    assert "<tr><td>now</td><td>1</td><td>0</td><td>24</td><td>16 / " in frees
    assert "<tr><td>after the plan</td><td>3</td><td>0</td><td>24</td><td>0 / " in frees
    moves = page.split('id="defrag-moves"')[1].split("</table>")[0]
    assert f'<td class="mono">{node_a.name}</td><td>{tenant_a.name} / a1 / h100</td>' in moves
    assert "<td>a-1 0,1,2,3</td><td>a-2 4,5,6,7</td>" in moves
    tenants = page.split('id="defrag-tenants"')[1].split("</table>")[0]
    assert f"<tr><td>{tenant_b.name}</td>" in tenants

    response = ops_client.post("/console/defrag/runs", {"max_steps": "100"})
    run = DefragRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/console/defrag/runs/{run.id}"
    event = AuditEvent.objects.get(action="defrag.start")
    assert (event.actor, event.after) == ("user:ops", {"steps": 2, "hosts": ["a-1", "b-1"]})
    drive_run(run.id, [p for _, p in pools.values()])
    page = ops_client.get(f"/console/defrag/runs/{run.id}").content.decode()
    assert '<span id="defrag-stage">2 of 2 step(s) done; freed a-1, b-1</span>' in page
    assert "Freed so far: a-1, b-1." in page
    assert "hx-trigger" not in page  # an ended run is not polled
    # the flash of the start is read only now, after the run ended: it says what started, not
    # a stage ("planning") that the page's own progress line has long outdated
    flash = page.split('<ul class="messages" id="messages" role="status">')[1].split("</ul>")[0]
    assert ">Defragmentation run started (2 step(s)); its progress is shown live.</li>" in flash
    assert "planning" not in flash and "0 of 2" not in flash
    assert 'id="messages"' not in ops_client.get(f"/console/defrag/runs/{run.id}").content.decode()
    listing = ops_client.get("/console/defrag").content.decode()
    assert "freed a-1, b-1" in listing.split('id="defrag-runs"')[1]


def test_tenant_users_get_404_on_the_defragmentation_pages(alice_client, ops_client):
    from nodepools.defrag_models import DefragRun

    run = DefragRun.objects.create(requested_by="op", status="DONE", active=None)
    for url in ("/console/defrag", f"/console/defrag/runs/{run.id}"):
        assert alice_client.get(url).status_code == 404, url
    assert alice_client.post("/console/defrag/runs", {}).status_code == 404
    assert DefragRun.objects.count() == 1
    assert ops_client.get(f"/console/defrag/runs/{run.id}").status_code == 200


def test_the_dry_run_says_which_released_gpus_are_being_scrubbed(
    ops_client,
    operator,
    fragmented,  # noqa: F811 (the fixture imported above)
):
    """Right after a scale-down the released GPUs wait for their scrub (the host's agent's
    next report): neither free nor held, the plan leaves them out, and the page says so
    instead of an unexplained empty (or smaller) plan (issue 33 item 6)."""
    from fleet.choices import ScrubState
    from fleet.models import Gpu

    hosts, _pools = fragmented
    # as a release leaves them: free, their scrub not confirmed by the agent yet
    pending = Gpu.objects.filter(host=hosts["spare"], holder_id__isnull=True).update(
        scrub_state=ScrubState.PENDING
    )
    assert pending == 8
    page = ops_client.get("/console/defrag").content.decode()
    note = page.split('id="defrag-scrubbing">')[1].split("</p>")[0]
    assert note.startswith("8 released GPU(s) on spare are being scrubbed")
    frees = page.split('id="defrag-frees"')[1].split("</table>")[0]
    # 24 free GPUs before the scrub (test above), 16 now: spare's 8 are not free
    assert "<tr><td>now</td><td>0</td><td>0</td><td>16</td>" in frees
    # the API's dry run carries the same figure
    body = operator.get("/api/v1/fleet/defrag/plan").json()
    assert body["scrubbing"] == {"gpus": 8, "hosts": ["spare"]}
    # nothing pending: no note
    Gpu.objects.filter(host=hosts["spare"]).update(scrub_state=ScrubState.CLEAN)
    assert 'id="defrag-scrubbing"' not in ops_client.get("/console/defrag").content.decode()
