"""A GPU node's offers come from its status whenever it has one (session 12): GFD's count labels stand in only
for a nodes file of labels only. A live node whose GPUs are all unhealthy (allocatable `nvidia.com/gpu: "0"`)
or whose device plugin is not up yet offers nothing, though GFD still labels `nvidia.com/gpu.count: 8`."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies import dra
from policies import inventory as inventory_mod
from policies.subject import grouping
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


def test_a_tray_moved_to_another_clique_regroups_the_candidates_under_declared_levels() -> None:
    """GB200 trays under `topology.levels: [rack, zone]`: the clique is no level, so a clique value that changes
    on a tray (GFD relabels it once the fabric is re-cabled) touches no level count. The groupings by clique,
    memoized per topology epoch, must still follow it: the epoch is renewed when an NVLink key's value changes."""
    pol = policy_for({"topology": {"levels": ["topology.kubernetes.io/rack", "topology.kubernetes.io/zone"]}})
    objs = copy.deepcopy(nodes("gb200-nvl72"))
    key = "nvidia.com/gpu.clique"
    inv = inventory_mod.build(objs, pol)
    before = grouping(inv, inv.all, key).members
    moved = copy.deepcopy(objs[0])
    (first,) = (d for d, m in before.items() if any(name == moved["metadata"]["name"] for name, _ in m))
    other = next(d for d in before if d != first)
    moved["metadata"]["labels"][key] = other
    inv = inv.apply({moved["metadata"]["name"]: inventory_mod.node_from_object(moved)})
    fresh = inventory_mod.build([moved, *objs[1:]], pol)
    names = {d: sorted(m) for d, m in grouping(inv, inv.all, key).members.items()}
    assert names == {d: sorted(m) for d, m in grouping(fresh, fresh.all, key).members.items()}
    assert moved["metadata"]["name"] in [name for name, _ in names[other]]
    # A heartbeat (nothing the levels or cliques read) keeps the epoch and its memos.
    epoch = inv.topology_epoch
    beat = copy.deepcopy(moved)
    beat["metadata"]["labels"]["nvidia.com/gpu.deploy.dcgm"] = "false"
    assert inv.apply({moved["metadata"]["name"]: inventory_mod.node_from_object(beat)}).topology_epoch is epoch


@pytest.mark.parametrize(
    ("labels", "units"),
    [
        ({}, 1),  # no count of clients: the unit is the whole card
        ({"nvidia.com/gpu.replicas": "4"}, 4),
        ({"nvidia.com/gpu.replicas": "0"}, 1),
        ({"cloud.google.com/gke-max-shared-clients-per-gpu": "2"}, 2),  # GKE: no GFD
        ({"nvidia.com/gpu.replicas": "4", "cloud.google.com/gke-max-shared-clients-per-gpu": "2"}, 4),  # GFD's wins
    ],
)
def test_a_shared_gpu_is_advertised_as_this_many_units(labels: dict[str, str], units: int) -> None:
    assert inventory_mod._replicas(labels) == units


def test_a_clique_change_is_not_forgotten_behind_another_change_of_the_same_batch() -> None:
    """One watch batch: a tray moved to another clique, then another tray's health label changed. The second
    change touches no NVLink key; the first must still renew the epoch the groupings are memoized on."""
    pol = policy_for({"topology": {"levels": ["topology.kubernetes.io/rack", "topology.kubernetes.io/zone"]}})
    objs = copy.deepcopy(nodes("gb200-nvl72"))
    key = "nvidia.com/gpu.clique"
    inv = inventory_mod.build(objs, pol)
    groups = grouping(inv, inv.all, key).members
    moved, beat = copy.deepcopy(objs[0]), copy.deepcopy(objs[-1])
    moved["metadata"]["labels"][key] = next(d for d in groups if d != moved["metadata"]["labels"][key])
    beat["metadata"]["labels"]["nvidia.com/gpu.deploy.dcgm"] = "false"
    assert moved["metadata"]["name"] != beat["metadata"]["name"]
    batch = {o["metadata"]["name"]: inventory_mod.node_from_object(o) for o in (moved, beat)}
    after = inv.apply(batch)
    assert after.topology_epoch is not inv.topology_epoch
    fresh = inventory_mod.build([moved, *objs[1:-1], beat], pol)
    assert grouping(after, after.all, key).members == grouping(fresh, fresh.all, key).members


def test_a_dra_node_of_labels_only_offers_what_its_slices_publish_not_gfds_counts() -> None:
    """A nodes file of labels only, with the node's ResourceSlices: GFD counted 8 GPUs, the slices publish 4
    (the others kept for the device plugin, or unhealthy). A DRA node's GPUs are what its slices publish."""
    obj = copy.deepcopy(nodes("examples/cluster/dra.yaml")[0])
    del obj["status"]
    obj["metadata"]["labels"]["nvidia.com/gpu.count"] = "8"
    devices = dra.NodeDevices({"nvidia.com/gpu": 4}, "NVIDIA-H100-80GB-HBM3", 81559 * 2**20)
    n = inventory_mod.node_from_object(obj, (), devices)
    assert n is not None
    assert [(o.resource, o.count, o.dra) for o in n.offers] == [("nvidia.com/gpu", 4, True)]
    assert n.whole_gpus == 4
