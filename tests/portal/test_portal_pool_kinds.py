"""The portal offers only what the API accepts on a pool's kind: a shared MIG pool's page has
no isolation form (the API answers 409 isolation_change_not_supported), a dedicated pool's
page has one."""

from __future__ import annotations

import pytest

from tests.helpers import drive_pool, make_cluster
from tests.nodepools.test_shared_hosts import make_pool, shared

pytestmark = pytest.mark.django_db


def test_a_shared_pool_page_offers_no_isolation_change_and_a_dedicated_one_does(
    owner, operator, alice_client, make_host
):
    host = make_host("h100-sxm5-80gb", gpus=2, hostname="hv-shared-portal")
    operator.post(f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"}, format="json")
    make_host("h100-sxm5-80gb", gpus=8, hostname="dedicated-portal")
    cluster = make_cluster(owner, "kinds")
    shared_pool = make_pool(owner, cluster, "mig1g", shared("1g.10gb"))
    drive_pool(shared_pool)
    dedicated_pool = make_pool(owner, cluster, "whole", {"mode": "exclusive"}, gpus=8)
    drive_pool(dedicated_pool)
    form = 'action="/clusters/{c}/nodepools/{p}/isolation"'
    page = alice_client.get(f"/clusters/{cluster}/nodepools/{shared_pool}").content.decode()
    assert 'id="isolation-not-changeable"' in page
    assert form.format(c=cluster, p=shared_pool) not in page
    page = alice_client.get(f"/clusters/{cluster}/nodepools/{dedicated_pool}").content.decode()
    assert 'id="isolation-not-changeable"' not in page
    assert form.format(c=cluster, p=dedicated_pool) in page
