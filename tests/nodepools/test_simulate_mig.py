"""``manage.py simulate mig GPU on|off``: MIG mode changed behind NVKE's back on a SIMULATED
host (a fresh-user trial of issue 31 had to reach for ``manage.py shell`` to cause drift).
The host's report carries it, and the READY node's pool names it (``NodesDrifted``) until MIG
is off again."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.helpers import drive_pool, running_h100_pool

pytestmark = pytest.mark.django_db


def _drifted(pool_id) -> dict:
    from nodepools.models import NodePool

    conditions = NodePool.objects.get(pk=pool_id).conditions
    return next(c for c in conditions if c["type"] == "NodesDrifted")


def test_mig_turned_on_behind_nvkes_back_is_named_then_cleared(
    owner, make_host, django_capture_on_commit_callbacks, capsys
):
    from fleet.models import Gpu
    from nodepools.models import Node

    _, pool_id = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    node = Node.objects.get(nodepool_id=pool_id, phase="READY")
    gpu = node.gpu_uuids[0]
    with django_capture_on_commit_callbacks(execute=True):
        call_command("simulate", "mig", gpu, "on")
    assert f"MIG mode on on {gpu}; reported in-process" in capsys.readouterr().out
    assert Gpu.objects.get(uuid=gpu).mig_mode == "enabled"
    drive_pool(pool_id)
    drifted = _drifted(pool_id)
    assert (drifted["status"], drifted["message"]) == (
        "True",
        f"node {node.name}: {gpu}: MIG mode expected disabled, reported enabled",
    )
    with django_capture_on_commit_callbacks(execute=True):
        call_command("simulate", "mig", gpu, "off")
    drive_pool(pool_id)
    assert Gpu.objects.get(uuid=gpu).mig_mode == "disabled"
    assert (_drifted(pool_id)["status"], _drifted(pool_id)["reason"]) == ("False", "NoDrift")


def test_an_unknown_gpu_is_one_line(db):
    with pytest.raises(CommandError, match="no GPU 'GPU-nope'"):
        call_command("simulate", "mig", "GPU-nope", "on")
