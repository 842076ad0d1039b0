"""The console's drain confirmation names the reservation commitments a drain would break
(the API refuses it unless forced: tests/nodepools/test_commitments.py), and a forced drain
from the console goes ahead, audited."""

from __future__ import annotations

import pytest

from tests.reservations.conftest import MODEL, pool_on_reservation

pytestmark = pytest.mark.django_db


def test_the_confirmation_names_what_the_drain_breaks_and_force_goes_ahead(
    ops_client, owner, make_host
):
    from fleet.models import Host
    from tenants.models import AuditEvent

    host = make_host(MODEL, gpus=8, hostname="only")
    pool_on_reservation(owner, reserved_gpus=8, nodes=2, gpus_per_node=4)
    page = ops_client.get(f"/console/hosts/{host.id}/confirm/maintenance")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'id="commitments"' in html
    assert (
        "reservation train-q4 (node pool r/trainers): 2 of 2 node(s) (8 GPU(s)) have no other "
        f"{MODEL} host in us-east-1"
    ) in html
    url = f"/console/hosts/{host.id}/maintenance"
    refused = ops_client.post(url, {"confirm_name": "only"}, follow=True)
    assert Host.objects.get(pk=host.pk).drain_target == ""  # refused: nothing changed
    assert "(commitment_would_break)" in refused.content.decode()  # the flash message
    ops_client.post(url, {"confirm_name": "only", "force": "on"})
    assert Host.objects.get(pk=host.pk).drain_target == "MAINTENANCE"
    assert AuditEvent.objects.filter(action="host.drain.commitment_broken").count() == 1
