"""policies/inventory.py, session 12 (hI, issue #20): what the survivors of `_build`, `_next`, `_count`, `_levels`,
`_groups`, `_same_level_facts` and `_shared_offer` showed no test pinned. The tests that reached them compared an
updated inventory with a fresh build (both by the same mutated code), or read one field of a node; these read the
facts themselves: a node's offers, the totals, a declared pool's stand-ins as live nodes join and leave, and what a
status update keeps."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies import gpulabels
from policies import inventory as inventory_mod
from tests.test_golden import policy_for
from tests.test_topology_levels import nodes

GiB = 2**30
GPU = "nvidia.com/gpu"
Offer = inventory_mod.Offer


def _node(obj: Any, policy: Any = None) -> inventory_mod.GpuNode:
    n = inventory_mod.node_from_object(obj, policy.pools if policy is not None else ())
    assert n is not None
    return n


def _time_sliced(obj: Any, replicas: int) -> Any:
    """A GFD-labelled node under the device plugin's time-slicing (`renameByDefault: false`, the default): each
    resource advertises `replicas` units per device, its count labels stay, its `.replicas` label says
    `replicas` and its product label gets `-SHARED` (k8s-device-plugin internal/lm/resource.go productLabel and
    replicasLabel), and the sharing strategy is labelled."""
    obj = copy.deepcopy(obj)
    labels = obj["metadata"]["labels"]
    labels["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    for key in list(labels):
        if key.endswith(".replicas"):
            labels[key] = str(replicas)
        if key.endswith(".product"):
            labels[key] += "-SHARED"
    alloc = obj["status"]["allocatable"]
    for key in list(alloc):
        if key.startswith("nvidia.com/"):
            alloc[key] = str(int(alloc[key]) * replicas)
    return obj


# --- _build: the offers a node's resources make -------------------------------------------------------------


def test_a_mig_single_node_offers_its_slices_as_nvidia_com_gpu() -> None:
    """mig-single: each nvidia.com/gpu unit of the A100 node is one 1g.5gb slice (5 GiB, 1 compute slice, kind
    mig, its profile named); the H100 beside it offers whole cards (no compute slices)."""
    a100, h100 = (_node(o) for o in nodes("mig-single"))
    assert a100.offers == (Offer(GPU, 56, 5 * GiB, 1, "mig", "1g.5gb"),)
    assert (a100.whole_gpus, a100.partitioned, a100.whole_card) == (0, True, False)
    assert h100.offers == (Offer(GPU, 8, 80 * GiB, 0, "whole"),)
    assert type(h100.offers[0].compute) is int


def test_time_sliced_mig_slices_are_shared_offers() -> None:
    """Time-slicing on MIG slices: the units are shares of a slice, kind shared, whatever the resource is named.
    Single strategy (the product `…-MIG-1g.5gb-SHARED`, nvidia.com/gpu 4 shares of each of 56 slices); mixed
    strategy with the resources kept (`renameByDefault: false`, only the sharing-strategy label says so) and
    renamed (`nvidia.com/mig-<profile>.shared`)."""
    single = _node(_time_sliced(nodes("mig-single")[0], 4))
    assert single.product == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED" and single.sharing == "time-slicing"
    assert single.offers == (Offer(GPU, 224, 5 * GiB, 1, "shared", "1g.5gb"),)
    mixed_obj = _time_sliced(nodes("mig-mixed")[0], 2)
    mixed = _node(mixed_obj)
    assert mixed.sharing == "time-slicing"
    assert mixed.offers == (
        Offer("nvidia.com/mig-1g.10gb", 32, 10 * GiB, 1, "shared", "1g.10gb"),
        Offer("nvidia.com/mig-2g.20gb", 16, 20 * GiB, 2, "shared", "2g.20gb"),
        Offer("nvidia.com/mig-3g.40gb", 16, 40 * GiB, 3, "shared", "3g.40gb"),
    )
    alloc = mixed_obj["status"]["allocatable"]
    for key in [k for k in alloc if k.startswith("nvidia.com/mig-")]:
        alloc[f"{key}.shared"] = alloc.pop(key)
    renamed = _node(mixed_obj)
    assert [(o.resource, o.kind, o.profile) for o in renamed.offers] == [
        ("nvidia.com/mig-1g.10gb.shared", "shared", "1g.10gb"),
        ("nvidia.com/mig-2g.20gb.shared", "shared", "2g.20gb"),
        ("nvidia.com/mig-3g.40gb.shared", "shared", "3g.40gb"),
    ]


def test_a_mig_single_product_whose_profile_no_device_plugin_names_is_read_as_slices_of_unknown_size() -> None:
    """A product label written by hand (a cluster without GFD labelling nodes to match a declared pool), with a
    typo in the MIG profile (`1g.05gb`): the node and the pool's stand-in are read as MIG slices of unknown
    memory and compute, not an error that stops the inventory build (before the fix: ValueError, "not a MIG
    profile name", from the whole node list or policy)."""
    product = "NVIDIA-A100-SXM4-40GB-MIG-1g.05gb"
    obj = copy.deepcopy(nodes("mig-single")[0])
    obj["metadata"]["labels"] = {
        "kubernetes.io/hostname": "a100-mig-single-01",
        "node.example.com/pool": "a100",
        "nvidia.com/gpu.product": product,
    }
    n = _node(obj)
    slices = (Offer(GPU, 56, 0, 0, "mig", "1g.05gb"),)
    assert n.offers == slices
    assert (n.mig_strategy, n.partitioned, n.whole_gpus, n.memory_bytes) == ("single", True, 0, 40 * GiB)
    pool = {"name": "a100", "nodeSelector": {"node.example.com/pool": "a100"}, "product": product,
            "gpusPerNode": 56, "migStrategy": "single"}  # fmt: skip
    pol = policy_for({"pools": [pool]})
    assert [(m.name, m.offers, m.declared) for m in inventory_mod.build([], pol).nodes] == [("a100-0", slices, True)]
    live = inventory_mod.build([obj], pol)
    assert [(m.name, m.offers, m.pool) for m in live.nodes] == [("a100-mig-single-01", slices, "a100")]


# --- declared pools: stand-ins while no live node is in the pool (_build, _count, _next) ----------------------

A3_POOL = {
    "name": "a3-mega",
    "nodeSelector": {"cloud.google.com/gke-nodepool": "a3-mega-pool"},
    "product": "NVIDIA-H100-80GB-HBM3",
    "gpusPerNode": 8,
    "nodes": 4,
}


def _names(inv: inventory_mod.Inventory) -> list[tuple[str, str | None, bool]]:
    return sorted((n.name, n.pool, n.declared) for n in inv.nodes)


def test_a_declared_pool_stands_in_until_its_nodes_join_and_again_once_they_all_left() -> None:
    """GKE's autoscaled a3-mega pool declared (4 nodes of 8 H100s): its stand-ins while the pool is at zero,
    through a change elsewhere (the L4 node joining); gone as soon as one live node of the pool joins (which
    is read as in the pool, and counted once as live); back as soon as the last one left."""
    pol = policy_for({"pools": [A3_POOL]})
    stand_ins = [(f"a3-mega-{i}", "a3-mega", True) for i in range(4)]
    inv = inventory_mod.build([], pol)
    assert _names(inv) == stand_ins and dict(inv.totals.pools) == {}
    gke = {o["metadata"]["name"]: o for o in nodes("gke")}
    l4 = "gke-l4-shared-pool-0"
    inv = inv.apply({l4: _node(gke[l4], pol)})
    assert _names(inv) == [*stand_ins, (l4, None, False)] and dict(inv.totals.pools) == {}
    a3 = [f"gke-a3-mega-pool-{i}" for i in range(4)]
    inv = inv.apply({a3[0]: _node(gke[a3[0]], pol)})
    assert _names(inv) == [(a3[0], "a3-mega", False), (l4, None, False)]
    assert dict(inv.totals.pools) == {"a3-mega": 1}
    inv = inv.apply({name: _node(gke[name], pol) for name in a3[1:]})
    assert dict(inv.totals.pools) == {"a3-mega": 4} and len(inv.nodes) == 5
    inv = inv.apply({name: None for name in a3})
    assert _names(inv) == [*stand_ins, (l4, None, False)] and dict(inv.totals.pools) == {}
    assert inv.max_whole_gpus == 8  # the stand-ins' cards


def test_declared_stand_ins_are_no_live_nodes_for_the_node_affinity_expressions() -> None:
    """GPU Operator's two H100 nodes beside a declared A100 pool in MIG single layout: the stand-ins carry no
    slice label to be excluded by, but they are no nodes a pod could land on, so no expression is added for
    them and no label problem is reported."""
    pool = {"name": "a100-single", "nodeSelector": {"node.example.com/pool": "a100-single"},
            "product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "gpusPerNode": 56, "migStrategy": "single"}  # fmt: skip
    inv = inventory_mod.build(nodes("gpu-operator-default"), policy_for({"pools": [pool]}))
    assert [n.name for n in inv.nodes if n.declared] == ["a100-single-0"]
    alone = inventory_mod.build(nodes("gpu-operator-default"), policy_for(None))
    assert inv.label_problems == () and inv.warnings == alone.warnings
    assert inv.whole_card_expressions == gpulabels.BASE_EXPRESSIONS
    assert inv.not_shared_expressions == gpulabels.BASE_EXPRESSIONS[:1]


# --- _count: the totals the inventory's maxima come from ----------------------------------------------------


def test_a_rack_whose_nodes_all_left_is_no_rack_size() -> None:
    """GB200: the three trays of gb-rack-1 leave one by one, then those of gb-rack-2: each rack is counted at its
    size while it has whole-card GPUs, and not at all once empty (the largest rack is 0 with no rack left)."""
    inv = inventory_mod.build(nodes("gb200-nvl72"), policy_for(None))
    assert dict(inv.totals.rack_sizes) == {12: 2}
    by_rack: dict[str, list[str]] = {}
    for n in inv.nodes:
        assert n.rack is not None
        by_rack.setdefault(n.rack, []).append(n.name)
    sizes = []
    for rack in ("gb-rack-1", "gb-rack-2"):
        for name in by_rack[rack]:
            inv = inv.apply({name: None})
            sizes.append(dict(inv.totals.rack_sizes))
    assert sizes == [{12: 1, 8: 1}, {12: 1, 4: 1}, {12: 1}, {8: 1}, {4: 1}, {}]
    assert dict(inv.totals.rack_gpus) == {} and inv.max_rack_gpus == 0


def test_a_time_sliced_node_gives_a_pod_one_unit_of_nvidia_com_gpu() -> None:
    """The time-sliced L4 nodes alone: 16 units of nvidia.com/gpu on l4-ts-default, but each is a share of a card,
    so the most a pod gets from one node counts as 1 (the renamed node offers nvidia.com/gpu.shared)."""
    inv = inventory_mod.build(nodes("time-slicing")[:2], policy_for(None))
    assert dict(inv.totals.gpu_units) == {1: 1} and inv.largest_gpu_units == 1
    assert dict(inv.totals.resources) == {GPU: 1, "nvidia.com/gpu.shared": 1}


# --- _next: what an update keeps, and what it re-reads ------------------------------------------------------


def _heartbeat(inv: inventory_mod.Inventory) -> inventory_mod.Inventory:
    """Every node read again as it was (a status update that changes nothing the inventory reads)."""
    return inv.apply({n.name: n for n in inv.nodes})


def test_the_largest_nvlink_domain_is_kept_through_status_updates_and_is_0_without_one() -> None:
    """GB200: two 12-GPU cliques, before and after a status update of every tray. GPU Operator's H100 nodes have
    no NVLink-domain label: no key, and no largest domain."""
    inv = inventory_mod.build(nodes("gb200-nvl72"), policy_for(None))
    assert (inv.nvlink_key, inv.nvlink_largest) == ("nvidia.com/gpu.clique", 12)
    after = _heartbeat(inv)
    assert (after.nvlink_key, after.nvlink_largest) == ("nvidia.com/gpu.clique", 12)
    assert after.levels is inv.levels and after.topology_epoch is inv.topology_epoch
    plain = inventory_mod.build(nodes("gpu-operator-default"), policy_for(None))
    assert (plain.nvlink_key, plain.nvlink_largest) == (None, 0)
    assert (_heartbeat(plain).nvlink_key, _heartbeat(plain).nvlink_largest) == (None, 0)


def test_a_label_problem_stays_reported_through_status_updates() -> None:
    """A node whose MIG slices show only in its allocatable, beside whole GPUs, with no GFD label (the device
    plugin alone): no expression can exclude it from whole-card nodes, and the inventory says so, also after
    a status update that leaves the expressions' inputs as they were."""
    odd = {
        "metadata": {"name": "odd", "labels": {"kubernetes.io/hostname": "odd"}},
        "status": {"allocatable": {GPU: "2", "nvidia.com/mig-1g.10gb": "7"}},
    }
    whole = {
        "metadata": {"name": "w", "labels": {"kubernetes.io/hostname": "w"}},
        "status": {"allocatable": {GPU: "8"}},
    }
    problem = "1 MIG or shared GPU node(s) (odd) carry no label that tells them apart"
    inv = inventory_mod.build([odd, whole], policy_for(None))
    assert inv.label_problems == (problem,) and inv.warnings[-1] == problem
    after = _heartbeat(inv)
    assert after.label_problems == (problem,) and after.warnings == inv.warnings


def test_nvlink_cliques_labelled_after_the_trays_joined_are_found_under_declared_levels() -> None:
    """GB200 trays under `topology.levels: [rack, zone]` (the clique is no level, so its labels touch no level
    count). The trays joined before GFD labelled their NVLink clique (it does once the fabric is up): when the
    labels come, the inventory has an NVLink-domain key, the one a ComputeDomain job is kept in, as a fresh build
    of the labelled trays says; and none again once the labels are gone. The largest clique is 0 either way: the
    declared levels leave the key out of the counts. Before the fix the key stayed None until a tray joined or
    left."""
    pol = policy_for({"topology": {"levels": ["topology.kubernetes.io/rack", "topology.kubernetes.io/zone"]}})
    labelled = nodes("gb200-nvl72")
    bare = copy.deepcopy(labelled)
    for o in bare:
        del o["metadata"]["labels"]["nvidia.com/gpu.clique"]
    inv = inventory_mod.build(bare, pol)
    assert (inv.nvlink_key, inv.nvlink_largest) == (None, 0)
    inv = inv.apply({o["metadata"]["name"]: _node(o) for o in labelled})
    fresh = inventory_mod.build(labelled, pol)
    clique = ("nvidia.com/gpu.clique", 0)
    assert (inv.nvlink_key, inv.nvlink_largest) == (fresh.nvlink_key, fresh.nvlink_largest) == clique
    assert [lv.key for lv in inv.levels] == [lv.key for lv in fresh.levels]
    inv = inv.apply({o["metadata"]["name"]: _node(o) for o in bare})
    assert (inv.nvlink_key, inv.nvlink_largest) == (None, 0)


L3 = "topology.k8s.aws/network-node-layer-3"


def test_the_rack_label_detected_later_confines_a_job_even_when_no_level_changes() -> None:
    """One policy for several clusters, `topology.levels: [nvidia.com/gpu.clique]`, on EKS where no node carries
    a clique (no level at all, before or after). The GPU pool scaled from zero: the first p5 node brings the
    rack label (layer-3), and the keys that confine a job to one rack are now that label's family, as in an
    inventory built with the node from the start."""
    pol = policy_for({"topology": {"levels": ["nvidia.com/gpu.clique"]}})
    inv = inventory_mod.build([], pol)
    assert inv.rack_label is None and L3 not in inv.rack_or_finer
    p5 = nodes("eks-p5-p6")[0]
    inv = inv.apply({p5["metadata"]["name"]: _node(p5)})
    fresh = inventory_mod.build([p5], pol)
    assert inv.levels == fresh.levels == ()
    assert inv.rack_label == fresh.rack_label == L3
    assert L3 in inv.rack_or_finer and inv.rack_or_finer == fresh.rack_or_finer


def test_mig_slices_appearing_on_a_node_without_gfd_labels_take_it_out_of_the_whole_card_levels() -> None:
    """The device plugin alone (no GFD), two 8-GPU nodes in rack r1. On the second, one GPU is put in MIG mode:
    it advertises 7 whole GPUs (the MIG GPU has no instance yet), then its seven 1g.10gb slices too. Its labels
    and whole-GPU count stay the same, but it is no whole-card node any more: the rack's largest whole-card
    domain drops from 15 GPUs to 8, as a fresh build of the same nodes says."""

    def node(name: str, alloc: dict[str, str]) -> Any:
        labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/rack": "r1"}
        return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": alloc}}

    pol = policy_for(None)
    a, b = node("gpu-a", {GPU: "8"}), node("gpu-b", {GPU: "7"})
    inv = inventory_mod.build([a, b], pol)
    assert [(lv.key, lv.largest_gpus) for lv in inv.levels] == [("topology.kubernetes.io/rack", 15)]
    b = node("gpu-b", {GPU: "7", "nvidia.com/mig-1g.10gb": "7"})
    inv = inv.apply({"gpu-b": _node(b)})
    assert [(n.name, n.whole_card, n.whole_gpus) for n in inv.nodes] == [("gpu-a", True, 8), ("gpu-b", False, 7)]
    assert [(lv.key, lv.largest_gpus) for lv in inv.levels] == [("topology.kubernetes.io/rack", 8)]
    assert inv.levels == inventory_mod.build([a, b], pol).levels


# --- _shared_offer: the table of shared offer instances is bounded -------------------------------------------


def test_the_shared_offers_table_keeps_at_most_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile counts (every node a different nvidia.com/gpu count) fill the table of shared offers: it stops
    at OFFERS_SHARED distinct offers, and a new one past that is used as it is, not kept."""
    table: dict[Offer, Offer] = {}
    monkeypatch.setattr(inventory_mod, "_OFFERS", table)
    bound = inventory_mod.OFFERS_SHARED
    for count in range(1, bound + 1):
        o = Offer(GPU, count, 80 * GiB, 0, "whole")
        assert inventory_mod._shared_offer(o) is o
    assert len(table) == bound
    again = Offer(GPU, 1, 80 * GiB, 0, "whole")
    assert inventory_mod._shared_offer(again) is table[again] and table[again] is not again
    past = Offer(GPU, bound + 1, 80 * GiB, 0, "whole")
    assert inventory_mod._shared_offer(past) is past
    assert len(table) == bound and past not in table


# --- _levels: the levels' own warnings, quoted whole -------------------------------------------------------

NO_RACK = (
    "no GPU node carries a rack label (topology.kubernetes.io/rack, EKS/GKE/OKE/Topograph ones) or an NVLink "
    "clique: training-rack cannot be applied; set topology.levels or label the nodes"
)


def test_without_a_rack_label_or_a_clique_the_inventory_says_how_to_get_levels() -> None:
    """GPU Operator defaults on two H100 nodes (a zone, no rack, no clique): no level, and the one warning says
    what cannot be applied and the two ways out; the same on AKS. No warning without a GPU node."""
    for cluster in ("gpu-operator-default", "aks"):
        inv = inventory_mod.build(nodes(cluster), policy_for(None))
        assert inv.levels == () and inv.warnings == inv.level_warnings == (NO_RACK,)
    assert inventory_mod.build([], policy_for(None)).warnings == ()


def test_a_rack_label_set_in_the_policy_that_no_node_carries_is_named() -> None:
    """topology.rack set to EKS's layer-3 label on GPU Operator nodes (on-prem, no such label): the warning names
    the label the policy set, and no other; the same label on EKS nodes raises none."""
    pol = policy_for({"topology": {"rack": L3}})
    inv = inventory_mod.build(nodes("gpu-operator-default"), pol)
    assert inv.levels == () and inv.rack_label == L3
    assert inv.warnings == (f"no GPU node carries the rack label {L3!r} set in topology.rack",)
    eks = inventory_mod.build(nodes("eks-p5-p6"), pol)
    assert eks.warnings == () and eks.levels[0].key == L3


def test_a_rack_label_of_its_own_set_in_the_policy_is_the_rack_level() -> None:
    """An on-prem cluster labels its racks with a key of its own (`infra.example.com/rack`) and sets it as
    topology.rack: it is the rack level, under the zone, though no detected label is on the nodes."""
    own = "infra.example.com/rack"
    objs = nodes("gpu-operator-default")
    for o, rack in zip(objs, ("r1", "r2"), strict=True):
        o["metadata"]["labels"][own] = rack
    inv = inventory_mod.build(objs, policy_for({"topology": {"rack": own}}))
    assert [(lv.key, lv.kind, lv.domains, lv.largest_gpus) for lv in inv.levels] == [
        (own, "switch", 2, 8),
        ("topology.kubernetes.io/zone", "zone", 1, 16),
    ]
    assert inv.rack_label == own and inv.warnings == () and inv.max_rack_gpus == 8


def test_rack_labels_whose_values_are_filled_in_or_emptied_later_are_read_as_a_fresh_build_reads_them() -> None:
    """Time-slicing's three nodes joined with `topology.kubernetes.io/rack` written empty (no rack yet), then a
    labelling job fills in r2: the rack label is detected, every node is in r2 and the rack holds the H100's 8
    GPUs, as in an inventory built from the labelled nodes; emptied again, no rack label. Before the fix the
    detection ran only when a label key came or went, so the rack label stayed what it was (None, while the
    levels already had the rack)."""
    pol = policy_for(None)
    labelled = nodes("time-slicing")
    empty = copy.deepcopy(labelled)
    for o in empty:
        o["metadata"]["labels"]["topology.kubernetes.io/rack"] = ""

    def facts(inv: inventory_mod.Inventory) -> tuple[Any, ...]:
        return inv.rack_label, [n.rack for n in inv.nodes], inv.max_rack_gpus, inv.levels, inv.warnings

    inv = inventory_mod.build(empty, pol)
    assert facts(inv)[:3] == (None, [None] * 3, 0)
    inv = inv.apply({o["metadata"]["name"]: _node(o) for o in labelled})
    assert facts(inv) == facts(inventory_mod.build(labelled, pol))
    assert facts(inv)[:3] == ("topology.kubernetes.io/rack", ["r2"] * 3, 8)
    inv = inv.apply({o["metadata"]["name"]: _node(o) for o in empty})
    assert facts(inv) == facts(inventory_mod.build(empty, pol))
    assert facts(inv)[:3] == (None, [None] * 3, 0)
