"""The benchmarks' COPY helper (tests/bench/model_copy.py) follows the model: a column added
after the benchmark was written (``fleet_host.drain_force``, NOT NULL) takes its default, so
the placement benchmark's fixture no longer fails with NotNullViolation (issue 33 item 7)."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from tests.bench.model_copy import copy_rows

pytestmark = pytest.mark.django_db


def test_a_row_that_leaves_out_newer_columns_gets_their_defaults(catalog):
    from fleet.models import Gpu, Host

    host_id = uuid.uuid4()
    written = copy_rows(
        Host,
        [
            {
                "id": host_id,
                "hostname": "bench-copy-1",
                "zone": "us-east-1a",
                "gpu_model_id": "h100-sxm5-80gb",
                "gpu_count": 2,
                "topology": {"islands": [[0, 1]]},
            }
        ],
    )
    copy_rows(
        Gpu,
        [
            {
                "uuid": f"GPU-copy-{i}",
                "host_id": host_id,
                "index": i,
                "pci_bus_id": f"0:{i}",
                "gpu_model_id": "h100-sxm5-80gb",
                "product_name": "bench",
            }
            for i in range(2)
        ],
    )
    host = Host.objects.get(pk=host_id)
    assert written == 1
    assert (host.drain_force, host.drain_nodes, host.state, host.warnings) == (
        False,
        0,
        "AVAILABLE",
        [],
    )
    assert host.topology == {"islands": [[0, 1]]}
    # the column's default (now()) filled it, as for any insert: within the last minute
    assert 0 <= (timezone.now() - host.created_at).total_seconds() < 60
    assert host.free_gpus == 2  # the GPU trigger kept the summary, as for any insert


def test_a_name_that_is_not_a_field_is_refused(catalog):
    from fleet.models import Host

    with pytest.raises(KeyError, match="no field 'drain_forse'"):
        copy_rows(Host, [{"hostname": "x", "drain_forse": True}])


def test_a_not_null_column_without_default_must_be_given(catalog):
    from fleet.models import Host

    with pytest.raises(ValueError, match=r"Host\.gpu_count has no default"):
        copy_rows(Host, [{"hostname": "x", "zone": "z", "gpu_model_id": "h100-sxm5-80gb"}])
