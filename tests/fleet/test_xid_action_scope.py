"""The one Xid-action table (catalog.xid_actions): fleet and billing read the same scope.

``RESTART_VM`` restarts one node's VM: fleet no longer cordons the host for it (it used to,
while billing credited the node only), ``RESTART_BM`` still does.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from catalog.models import XidCode
from catalog.xid_actions import action_scope, actions_of_scope
from fleet.health import handle_xid
from fleet.models import Gpu, Host, XidEvent

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def test_every_scope_is_named_once_and_unknown_actions_are_gpu_scoped():
    assert actions_of_scope("host") == ("CHECK_MECHANICALS", "RESTART_BM")
    assert actions_of_scope("node") == ("RESTART_VM",)
    assert action_scope("RESET_GPU") == "gpu"
    assert action_scope("WORKFLOW_XID_48") == "gpu"
    assert action_scope("") == "gpu"
    with pytest.raises(ValueError):
        actions_of_scope("rack")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("action", "state"), [("RESTART_VM", "AVAILABLE"), ("RESTART_BM", "CORDONED")]
)
def test_only_a_host_scoped_action_cordons_the_host(make_host, action, state):
    # an uncatalogued code, given the action under test (the catalog has no RESTART_VM Xid)
    XidCode.objects.update_or_create(
        code=990, defaults={"severity": "critical", "nvidia_immediate_action": action}
    )
    host = make_host("h100-sxm5-80gb", gpus=2, hostname="vm-host")
    gpu = Gpu.objects.get(host=host, index=0)
    event = XidEvent.objects.create(host=host, gpu_uuid=gpu.uuid, ts=T0, xid=990, report_seq=1)
    outcome = handle_xid(host, event, T0)
    assert Host.objects.get(pk=host.pk).state == state
    assert outcome == ("cordoned" if state == "CORDONED" else "unhealthy")
    assert Gpu.objects.get(pk=gpu.pk).health == "UNHEALTHY"
