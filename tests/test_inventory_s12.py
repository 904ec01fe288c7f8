"""A GPU node's offers come from its status whenever it has one (session 12): GFD's count labels stand in only
for a nodes file of labels only. A live node whose GPUs are all unhealthy (allocatable `nvidia.com/gpu: "0"`)
or whose device plugin is not up yet offers nothing, though GFD still labels `nvidia.com/gpu.count: 8`."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies import inventory as inventory_mod
from tests.test_golden import policy_for
from tests.test_topology_levels import nodes


def _gfd_node() -> dict[str, Any]:
    node = copy.deepcopy(nodes("gpu-operator-default")[0])
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    return node


def test_a_labelled_node_offers_what_its_allocatable_says() -> None:
    n = inventory_mod.node_from_object(_gfd_node())
    assert n is not None and n.whole_gpus == 8


@pytest.mark.parametrize(
    "status",
    [
        {"allocatable": {"cpu": "96", "nvidia.com/gpu": "0"}, "capacity": {"cpu": "96", "nvidia.com/gpu": "8"}},
        {"allocatable": {"cpu": "96", "memory": "1Ti"}},  # the device plugin not registered yet
        {"capacity": {"cpu": "96"}},
    ],
    ids=["all-gpus-unhealthy", "no-device-plugin-yet", "capacity-without-gpus"],
)
def test_a_live_node_whose_status_offers_no_gpu_offers_none_whatever_gfd_counted(status: dict[str, Any]) -> None:
    node = _gfd_node()
    node["status"] = status
    n = inventory_mod.node_from_object(node)
    assert n is not None  # still a GPU node (gpu.present), offering nothing
    assert (n.offers, n.whole_gpus) == ((), 0)
    inv = inventory_mod.build([node, _gfd_node() | {"metadata": {**_gfd_node()["metadata"], "name": "other"}}],
                              policy_for(None))  # fmt: skip
    assert inv.max_whole_gpus == 8  # the other, healthy node


@pytest.mark.parametrize("status", [None, {}, {"conditions": []}], ids=["no-status", "empty", "no-resources"])
def test_a_node_of_labels_only_offers_what_gfd_counted(status: dict[str, Any] | None) -> None:
    node = _gfd_node()
    if status is None:
        del node["status"]
    else:
        node["status"] = status
    n = inventory_mod.node_from_object(node)
    assert n is not None and n.whole_gpus == 8
