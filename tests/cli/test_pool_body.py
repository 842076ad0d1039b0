"""``nvkectl nodepools create`` takes every field the node pool API takes, as flags or
``-f pool.yaml`` (issue 33 item 5: it had no time-slicing, MPS, vGPU, MIG layout, shared
tenancy or driver option)."""

from __future__ import annotations

import pytest
from nvkectl.main import app
from nvkectl.pools import parse_layout, pool_body
from typer.testing import CliRunner


def test_flags_cover_every_isolation_kind():
    base = {"name": "p", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 1, "nodes": 2}
    assert pool_body(**base)["isolation"] == {"mode": "exclusive"}
    assert pool_body(**base, mig_layout="3g.40gb=1,1g.10gb=2")["isolation"] == {
        "mode": "mig",
        "mig_layout": {"3g.40gb": 1, "1g.10gb": 2},
    }
    assert pool_body(**base, mig_profile="1g.10gb", tenancy="shared")["isolation"] == {
        "mode": "mig",
        "mig_profile": "1g.10gb",
        "tenancy": "shared",
    }
    assert pool_body(**base, mode="time-slicing", replicas=4)["isolation"] == {
        "mode": "time-slicing",
        "replicas": 4,
    }
    assert pool_body(**base, mode="mps", replicas=2)["isolation"]["mode"] == "mps"
    assert pool_body(**base, vgpu_profile="H100XM-1-10C")["isolation"] == {
        "mode": "vgpu",
        "vgpu_profile": "H100XM-1-10C",
    }
    body = pool_body(**base, driver_version="R580", cuda_version="12.8", same_nvlink_domain=True)
    assert (body["driver_version"], body["cuda_version"], body["placement"]) == (
        "R580",
        "12.8",
        {"same_nvlink_domain": True},
    )
    assert body["node_count"] == 2


def test_a_file_gives_the_fields_and_flags_override_it(tmp_path):
    f = tmp_path / "pool.yaml"
    f.write_text(
        "gpu_model: h100-sxm5-80gb\ngpus_per_node: 2\nnode_count: 3\n"
        "isolation: {mode: time-slicing, replicas: 4}\ndriver_version: R570\n"
    )
    body = pool_body(name="ts", file=f, replicas=8, driver_version="R580")
    assert body == {
        "name": "ts",
        "gpu_model": "h100-sxm5-80gb",
        "gpus_per_node": 2,
        "node_count": 3,
        "isolation": {"mode": "time-slicing", "replicas": 8},
        "driver_version": "R580",
    }


def test_a_bad_layout_says_what_it_wants():
    with pytest.raises(ValueError, match="is not PROFILE=COUNT"):
        parse_layout("3g.40gb")


def test_the_help_lists_the_new_flags():
    out = CliRunner().invoke(app, ["nodepools", "create", "--help"], terminal_width=200).output
    for flag in ("--file", "--isolation", "--mig-layout", "--vgpu-profile", "--replicas",
                 "--tenancy", "--driver-version", "--cuda-version", "--vgpu-layout",
                 "--gpu-publishing", "--reservation", "--same-nvlink-domain"):  # fmt: skip
        assert flag in out, flag
    assert "H100XM" not in out  # the example was a type the catalog has for no GPU


def test_vgpu_layout_and_gpu_publishing_have_flags():
    """A fresh-user trial: both were reachable only through -f although the help says every
    field the API takes is a flag."""
    from nvkectl.pools import pool_body

    body = pool_body(name="v", gpu_model="a10g", vgpu_layout="A10-4Q=3,A10-6Q=2")
    assert body["isolation"] == {"mode": "vgpu", "vgpu_layout": {"A10-4Q": 3, "A10-6Q": 2}}
    dra = pool_body(name="d", gpu_model="h100-sxm5-80gb", gpu_publishing="dra")
    assert (dra["gpu_publishing"], dra["isolation"]) == ("dra", {"mode": "exclusive"})
    with pytest.raises(ValueError, match=r"--vgpu-layout: 'A10-4Q' is not PROFILE=COUNT"):
        pool_body(name="v", vgpu_layout="A10-4Q")


def test_the_pool_table_says_what_each_node_gets_and_that_a_pool_is_shared():
    """``nodepools list/get`` name the isolation (``shared`` for tenancy shared) and the
    resources each node gets, from the pool's rendered GPU config (issue 33 item 3)."""
    from nvkectl.pools import isolation_text, pool_row

    shared = {
        "name": "mig1g",
        "isolation": {"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"},
        "gpu_config": {"resources": {"nvidia.com/gpu": 1}, "tenancy": "shared"},
    }
    row = pool_row(shared)
    assert (row["isolation"], row["resources_per_node"]) == (
        "mig 1g.10gb shared",
        "nvidia.com/gpu=1",
    )
    assert isolation_text({"mode": "exclusive"}) == "exclusive"
    assert isolation_text({"mode": "mig", "mig_layout": {"3g.40gb": 1, "1g.10gb": 2}}) == (
        "mig 3g.40gb=1,1g.10gb=2"
    )
    assert isolation_text({"mode": "time-slicing", "replicas": 4}) == "time-slicing x4"
    assert isolation_text({"mode": "mps", "replicas": 2, "mig_profile": "3g.40gb"}) == (
        "mps x2 on 3g.40gb"
    )
    assert isolation_text(None) == "exclusive"


def test_a_scale_up_dry_run_says_which_figures_are_the_added_nodes_and_which_the_pool():
    """A fresh-user trial read 'cost: 20.00 USD per hour, 8 GPU-h' under capacity and quota
    for the 4 added GPUs: the cost is the pool's at its new size."""
    from nvkectl.pools import resize_dry_run_lines

    body = {
        "node_count": {"from": 1, "to": 2},
        "disruption": {"nodes": [], "provision": 1},
        "capacity": {"placeable_now": True},
    }
    assert resize_dry_run_lines(body) == [
        "node count: 1 -> 2",
        "  would provision 1 node(s)",
        "  (capacity below: the 1 node(s) to place; quota: the 1 node(s) the new size adds to "
        "the spec of 1; cost: the whole pool at 2 node(s))",
    ]
    # a pool of spec 6 short of capacity (3 placed) resized to 7: 4 to place, 1 more for the
    # quota (a trial read "would provision 4" and "nodes requested 1" under one header)
    short = {
        "node_count": {"from": 6, "to": 7},
        "disruption": {"nodes": [], "provision": 4},
        "capacity": {"placeable_now": False},
    }
    assert resize_dry_run_lines(short)[-1] == (
        "  (capacity below: the 4 node(s) to place; quota: the 1 node(s) the new size adds to "
        "the spec of 6; cost: the whole pool at 7 node(s))"
    )
    down = {
        "node_count": {"from": 2, "to": 1},
        "disruption": {"nodes": [{"name": "c-p-1", "gpus": 4, "unhealthy": True}]},
    }
    assert resize_dry_run_lines(down) == [
        "node count: 2 -> 1",
        "  would drain and remove c-p-1 (4 GPU(s), unhealthy)",
    ]


def test_a_resize_within_the_pools_spec_reserves_no_more_quota(capsys):
    """Spec 6 with 3 placed, resized to 4: one node to place, no quota to reserve (the API
    answers quota null); nvkectl printed "quota: EXCEEDED: None GPUs limit None" (a trial)."""
    from nvkectl.reservations import print_dry_run

    print_dry_run(
        {
            "capacity": {"placeable_now": True, "message": "placeable now: 4 GPU(s) free"},
            "quota": None,
            "cost": None,
            "cost_error": {"code": "missing_price", "detail": "no USD price"},
        }
    )
    printed = capsys.readouterr().out
    assert "quota: nothing more to reserve: the pool's quota already counts this size" in printed
    assert "EXCEEDED" not in printed and "None GPUs" not in printed
