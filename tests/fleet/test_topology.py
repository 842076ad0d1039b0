"""``nvidia-smi topo -m`` parsing and NVLink islands (fleet/topology.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet import topology

DATA = Path(__file__).parent / "data"


def test_an_nvswitch_host_is_one_island_and_nic_columns_are_ignored():
    topo = topology.parse_nvidia_smi_topo((DATA / "hgx-h100-8gpu-topo.txt").read_text())
    assert topo["source"] == "nvidia-smi topo -m"
    assert topo["gpus"] == 8
    assert topo["links"][0] == ["X", "NV18", "NV18", "NV18", "NV18", "NV18", "NV18", "NV18"]
    assert topo["islands"] == [[0, 1, 2, 3, 4, 5, 6, 7]]


def test_nvlink_bridged_pairs_are_islands_of_two():
    topo = topology.parse_nvidia_smi_topo((DATA / "h100-nvl-8gpu-topo.txt").read_text())
    assert topo["links"][0] == ["X", "NV12", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert topo["islands"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topology.island_of(topo) == {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2, 6: 3, 7: 3}


def test_colour_codes_from_a_terminal_are_stripped():
    text = (DATA / "h100-nvl-8gpu-topo.txt").read_text().replace("NV12", "\x1b[32mNV12\x1b[0m")
    assert topology.parse_nvidia_smi_topo(text)["islands"] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Legend:\n  X = Self\n",
        "\tGPU0\tGPU1\nGPU0\t X \tNV4\n",  # GPU1 row missing
        "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\tBOGUS\n",
        "\tGPU0\tGPU1\nGPU0\tNV4\tNV4\nGPU1\tNV4\t X \n",  # GPU0 not X to itself
    ],
)
def test_what_is_not_a_matrix_is_refused(text):
    with pytest.raises(topology.InvalidTopology):
        topology.parse_nvidia_smi_topo(text)


def test_a_chain_of_nvlinks_is_one_island_and_a_lone_gpu_its_own():
    links = [
        ["X", "NV1", "SYS", "SYS"],
        ["NV1", "X", "NV1", "SYS"],
        ["SYS", "NV1", "X", "SYS"],
        ["SYS", "SYS", "SYS", "X"],
    ]
    assert topology.nvlink_islands(links) == [[0, 1, 2], [3]]


def test_the_agents_matrix_must_match_the_host():
    links = [["X", "NV4"], ["NV4", "X"]]
    assert topology.from_agent({"links": links}, 2)["islands"] == [[0, 1]]
    assert topology.from_agent({"links": links}, 3) is None
    assert topology.from_agent({"links": [["X", "WAT"], ["NV4", "X"]]}, 2) is None
    assert topology.from_agent("NV4", 2) is None
