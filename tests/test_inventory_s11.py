"""policies/inventory.py, session 11 (issue #20): what the survivors of the mutation run showed no test pinned —
the levels `/readyz` reports (every field, the penalty quoted whole), node sets, and the inventory's reading of
realistic label sets (GPU Operator/GFD, GKE, EKS, GB200)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from policies import inventory as inventory_mod
from tests.test_golden import policy_for
from tests.test_topology_levels import nodes

OVERSUB = "(16 MiB, ring, 400/200 Gb/s, 2:1 oversub)"


def test_level_report_of_gb200_names_every_field_and_quotes_each_penalty_whole() -> None:
    """GB200 NVL72 trays: 4 GPUs a node (the node size the penalty is worked out with, not the 8 assumed without
    whole-card nodes), two 12-GPU cliques, one per rack, in one zone."""
    pol = policy_for(None)
    inv = inventory_mod.build(nodes("gb200-nvl72"), pol)
    assert inv.max_whole_gpus == 4
    assert inventory_mod.level_report(inv, pol) == [
        {
            "key": "nvidia.com/gpu.clique",
            "kind": "nvlink",
            "domains": 2,
            "nodes": 6,
            "largestDomainGpus": 12,
            "penalty": f"all-reduce ≈1.1× slower across NVLink cliques than in one {OVERSUB}",
        },
        {
            "key": "topology.kubernetes.io/rack",
            "kind": "switch",
            "domains": 2,
            "nodes": 6,
            "largestDomainGpus": 12,
            "penalty": f"all-reduce ≈1.3× slower across racks than in one {OVERSUB}",
        },
        {
            "key": "topology.kubernetes.io/zone",
            "kind": "zone",
            "domains": 1,
            "nodes": 6,
            "largestDomainGpus": 24,
            "penalty": f"all-reduce ≈1.4× slower across zones than in one {OVERSUB}",
        },
    ]


def test_level_report_of_time_sliced_nodes_only_prices_a_two_gpu_job() -> None:
    """Two time-sliced L4 nodes in one rack, no whole card: the level is read over every GPU node with 0 GPUs,
    and the penalty is that of the smallest job that spreads at all (2 GPUs)."""
    pol = policy_for(None)
    inv = inventory_mod.build(nodes("time-slicing")[:2], pol)
    assert inv.max_whole_gpus == 0
    assert inventory_mod.level_report(inv, pol) == [
        {
            "key": "topology.kubernetes.io/rack",
            "kind": "switch",
            "domains": 1,
            "nodes": 2,
            "largestDomainGpus": 0,
            "penalty": f"all-reduce ≈2.0× slower across racks than in one {OVERSUB}",
        }
    ]


def test_level_report_without_a_penalty_when_the_comm_model_refuses_the_policy_bandwidths() -> None:
    """Bandwidths the comm model refuses (an oversubscription below 1, which the policy check now refuses too,
    so only a Policy built in code has it): the levels are still reported, with an empty penalty, not a crash
    of /readyz."""
    pol = policy_for(None)
    pol = dataclasses.replace(pol, comm=dataclasses.replace(pol.comm, cross_rack_oversubscription=0.5))
    report = inventory_mod.level_report(inventory_mod.build(nodes("gb200-nvl72"), pol), pol)
    assert [(r["key"], r["penalty"]) for r in report] == [
        ("nvidia.com/gpu.clique", ""),
        ("topology.kubernetes.io/rack", ""),
        ("topology.kubernetes.io/zone", ""),
    ]


def test_the_levels_of_a_kind_are_found_by_their_kind() -> None:
    """On GB200 the clique and the rack have the same largest domain (12 GPUs): only the kind tells them apart."""
    inv = inventory_mod.build(nodes("gb200-nvl72"), policy_for(None))
    assert [inv.level_index(k) for k in ("nvlink", "switch", "zone")] == [0, 1, 2]
    eks = inventory_mod.build(nodes("eks-p5-p6"), policy_for(None))
    assert [eks.level_index(k) for k in ("nvlink", "switch", "zone")] == [None, 0, 3]


def test_a_node_set_having_several_named_sets_is_their_intersection() -> None:
    inv = inventory_mod.build(nodes("time-slicing"), policy_for(None))
    shared = inv.all.having(inventory_mod.SHARED)
    assert [n.name for n in shared] == ["l4-ts-default", "l4-ts-renamed"]
    assert [n.name for n in shared.having(inventory_mod.OFFERS_GPU)] == ["l4-ts-default"]
    assert [n.name for n in inv.all.having(inventory_mod.SHARED, inventory_mod.OFFERS_GPU)] == ["l4-ts-default"]
    assert not shared.having(inventory_mod.WHOLE_CARD)
    assert [n.name for n in inv.all.having(inventory_mod.WHOLE_CARD)] == ["h100-whole-01"]


def test_dra_whole_gpu_offers_carry_the_slices_memory_and_no_compute() -> None:
    """examples/cluster/dra.yaml: the H100 nodes' GPUs are published by ResourceSlices (80Gi each); a whole-GPU
    offer has no MIG compute slices (0, like a device plugin's) and the slice memory as device memory."""
    inv = inventory_mod.build_cluster(nodes("examples/cluster/dra.yaml"), policy_for(None))
    by_name = {n.name: n for n in inv.nodes}
    assert by_name["dra-a-1"].offers == (
        inventory_mod.Offer("nvidia.com/gpu", 8, 80 * GiB, 0, "whole", dra=True, device_memory=80 * GiB),
    )
    assert by_name["dra-mig-1"].offers == (
        inventory_mod.Offer("nvidia.com/gpu", 1, 80 * GiB, 0, "whole", dra=True, device_memory=80 * GiB),
        inventory_mod.Offer("nvidia.com/mig-1g.10gb", 7, 10 * GiB, 1, "mig", "1g.10gb", claim_only=True, dra=True),
        inventory_mod.Offer("nvidia.com/mig-3g.40gb", 2, 40 * GiB, 3, "mig", "3g.40gb", claim_only=True, dra=True),
    )


GiB = 2**30
POOLS: list[dict[str, Any]] = [
    {"name": "h100-train", "nodeSelector": {"cloud.google.com/gke-nodepool": "a3-highgpu"},
     "product": "NVIDIA-H100-80GB-HBM3", "gpusPerNode": 8, "nodes": 2, "rack": "r7"},
    {"name": "l4-ts", "nodeSelector": {"karpenter.sh/nodepool": "l4-shared"}, "product": "NVIDIA-L4",
     "gpusPerNode": 1, "sharing": "time-slicing", "replicas": 4},
    {"name": "a100-mig", "nodeSelector": {"node.example.com/pool": "a100-mig"}, "product": "NVIDIA-A100-SXM4-80GB",
     "migStrategy": "mixed", "migProfiles": {"1g.10gb": 7, "3g.40gb": 2}},
    {"name": "a100-single", "nodeSelector": {"node.example.com/pool": "a100-single", "nvidia.com/gpu.memory": "4864"},
     "product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "gpusPerNode": 56, "migStrategy": "single"},
    # No product (so no memory), and `replicas` left over with sharing off: ignored.
    {"name": "spot-4gpu", "nodeSelector": {"karpenter.sh/nodepool": "gpu-spot"}, "gpusPerNode": 4, "replicas": 2},
]  # fmt: skip
H100_OFFER = inventory_mod.Offer("nvidia.com/gpu", 8, 80 * GiB, 0, "whole")


def _h100(i: int, rack_key: str) -> inventory_mod.GpuNode:
    labels = {
        "cloud.google.com/gke-nodepool": "a3-highgpu",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        rack_key: "r7",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "81920",
        "kubernetes.io/hostname": f"h100-train-{i}",
    }
    return inventory_mod.GpuNode(
        f"h100-train-{i}", labels, "NVIDIA-H100-80GB-HBM3", "none", "none", 8, 80 * GiB, (H100_OFFER,), "r7",
        "h100-train", partitioned=False, declared=True,
    )  # fmt: skip


def test_declared_pools_stand_in_as_nodes_read_from_their_description() -> None:
    """Each declared pool's stand-in nodes, field by field and label by label: a whole-card H100 pool in a rack,
    a time-sliced L4 pool (4 shares of its one GPU), an A100 pool in MIG mixed layout (one offer per profile),
    and one in MIG single layout (56 1g.5gb slices as nvidia.com/gpu; its memory label kept as the pool sets it)."""
    inv = inventory_mod.empty(policy_for({"pools": POOLS}))
    assert list(inv.nodes) == [
        _h100(0, "topology.kubernetes.io/rack"),
        _h100(1, "topology.kubernetes.io/rack"),
        inventory_mod.GpuNode(
            "l4-ts-0",
            {"karpenter.sh/nodepool": "l4-shared", "nvidia.com/gpu.product": "NVIDIA-L4",
             "nvidia.com/gpu.sharing-strategy": "time-slicing", "kubernetes.io/hostname": "l4-ts-0"},
            "NVIDIA-L4", "time-slicing", "none", 0, 0, (inventory_mod.Offer("nvidia.com/gpu", 4, 0, 0, "shared"),),
            None, "l4-ts", partitioned=False, declared=True,
        ),
        inventory_mod.GpuNode(
            "a100-mig-0",
            {"node.example.com/pool": "a100-mig", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
             "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.strategy": "mixed",
             "nvidia.com/gpu.memory": "81920", "kubernetes.io/hostname": "a100-mig-0"},
            "NVIDIA-A100-SXM4-80GB", "none", "mixed", 0, 80 * GiB,
            (inventory_mod.Offer("nvidia.com/mig-1g.10gb", 7, 10 * GiB, 1, "mig", "1g.10gb"),
             inventory_mod.Offer("nvidia.com/mig-3g.40gb", 2, 40 * GiB, 3, "mig", "3g.40gb")),
            None, "a100-mig", partitioned=True, declared=True,
        ),
        inventory_mod.GpuNode(
            "a100-single-0",
            {"node.example.com/pool": "a100-single", "nvidia.com/gpu.memory": "4864",
             "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/gpu.sharing-strategy": "none",
             "nvidia.com/mig.strategy": "single", "kubernetes.io/hostname": "a100-single-0"},
            "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "none", "single", 0, 40 * GiB,
            (inventory_mod.Offer("nvidia.com/gpu", 56, 5 * GiB, 1, "mig", "1g.5gb"),),
            None, "a100-single", partitioned=True, declared=True,
        ),
        inventory_mod.GpuNode(
            "spot-4gpu-0",
            {"karpenter.sh/nodepool": "gpu-spot", "nvidia.com/gpu.sharing-strategy": "none",
             "kubernetes.io/hostname": "spot-4gpu-0"},
            "", "none", "none", 4, 0, (inventory_mod.Offer("nvidia.com/gpu", 4, 0, 0, "whole"),),
            None, "spot-4gpu", partitioned=False, declared=True,
        ),
    ]  # fmt: skip
    # The labels too in their order (a dict compares equal in any order).
    assert list(inv.nodes[0].labels) == list(_h100(0, "topology.kubernetes.io/rack").labels)
    assert inv.rack_label == "topology.kubernetes.io/rack" and inv.max_rack_gpus == 16


def test_a_declared_pools_rack_is_written_under_the_rack_label_the_policy_sets() -> None:
    """topology.rack set to EKS's layer-3 label: the pool's `rack` is that label's value on its stand-ins."""
    layer3 = "topology.k8s.aws/network-node-layer-3"
    inv = inventory_mod.empty(policy_for({"pools": POOLS[:1], "topology": {"rack": layer3}}))
    assert list(inv.nodes) == [_h100(0, layer3), _h100(1, layer3)]
    assert [lv.key for lv in inv.levels] == [layer3]


# GFD-labelled nodes whose labels say what their allocatable says: GPU Operator defaults, MIG single, MIG mixed
# (an all-balanced A100 and an H100 with MIG off), time-slicing with the resource not renamed, GB200 trays.
GFD_NODES = [
    ("gpu-operator-default", 0), ("mig-single", 0), ("mig-single", 1), ("mig-mixed", 0), ("mig-mixed", 1),
    ("time-slicing", 0), ("time-slicing", 2), ("gb200-nvl72", 0),
]  # fmt: skip


@pytest.mark.parametrize(("cluster", "i"), GFD_NODES)
def test_a_nodes_file_of_labels_only_reads_the_offers_the_allocatable_gives(cluster: str, i: int) -> None:
    """Without a status (a nodes file of labels only), GFD's count labels stand in for the allocatable."""
    obj = nodes(cluster)[i]
    bare = copy.deepcopy(obj)
    del bare["status"]
    full, labels_only = inventory_mod.node_from_object(obj), inventory_mod.node_from_object(bare)
    assert full is not None and labels_only is not None
    assert labels_only.offers == full.offers and labels_only.whole_gpus == full.whole_gpus


def test_labels_only_a_mixed_node_with_mig_slices_offers_the_slices_alone() -> None:
    """The limit of the labels: on a MIG-mixed node `nvidia.com/gpu.count` counts every physical GPU, so beside
    MIG counts it cannot say how many stayed whole; the slices are read, no nvidia.com/gpu (examples' a100-mig-1
    advertises 2 whole GPUs in its allocatable)."""
    obj = next(o for o in nodes("examples/cluster/nodes.yaml") if o["metadata"]["name"] == "a100-mig-1")
    del obj["status"]
    n = inventory_mod.node_from_object(obj)
    assert n is not None
    assert [(o.resource, o.count) for o in n.offers] == [
        ("nvidia.com/mig-1g.10gb", 14),
        ("nvidia.com/mig-2g.20gb", 6),
        ("nvidia.com/mig-3g.40gb", 4),
    ]


def test_a_job_of_no_whole_gpu_or_of_one_gpu_on_gb200() -> None:
    """GB200: the clique (level 0) comes before the rack (level 1). A known size of 0 whole GPUs (MIG slices
    only) is kept in the rack like an unknown size; a 1-GPU job fits the narrowest level."""
    inv = inventory_mod.build(nodes("gb200-nvl72"), policy_for(None))
    assert [lv.key for lv in inv.levels][:2] == ["nvidia.com/gpu.clique", "topology.kubernetes.io/rack"]
    assert inv.level_for(0, known=True) == 1
    assert inv.level_for(64, known=False) == 1
    assert inv.level_for(1, known=True) == 0
    assert inv.level_for(12, known=True) == 0 and inv.level_for(13, known=True) == 2


def test_the_members_of_each_product_are_node_sets_of_the_inventory() -> None:
    inv = inventory_mod.build(nodes("time-slicing"), policy_for(None))
    members = {name[1]: [n.name for n in m] for name, m in inv.all.members_of("product")}
    assert members == {
        "NVIDIA-L4-SHARED": ["l4-ts-default"],
        "NVIDIA-L4": ["l4-ts-renamed"],
        "NVIDIA-H100-80GB-HBM3": ["h100-whole-01"],
    }
    shared = inv.all.having(inventory_mod.SHARED)
    assert sorted(name[1] for name, _ in shared.members_of("product")) == ["NVIDIA-L4", "NVIDIA-L4-SHARED"]


def test_gke_nodes_are_read_by_their_accelerator_and_partition_labels() -> None:
    """GKE nodes carry no GFD product: `cloud.google.com/gke-accelerator` names the card (its memory from the
    catalogue), `cloud.google.com/gke-gpu-partition-size` the MIG slice each nvidia.com/gpu unit is."""
    by_name = {o["metadata"]["name"]: inventory_mod.node_from_object(o) for o in nodes("gke")}
    h100, a100, l4 = by_name["gke-a3-mega-pool-0"], by_name["gke-a100-mig-pool-0"], by_name["gke-l4-shared-pool-0"]
    assert h100 is not None and a100 is not None and l4 is not None
    assert (h100.memory_bytes, h100.mig_strategy, h100.whole_gpus) == (80 * GiB, "none", 8)
    assert h100.offers == (inventory_mod.Offer("nvidia.com/gpu", 8, 80 * GiB, 0, "whole"),)
    assert (a100.memory_bytes, a100.mig_strategy, a100.whole_gpus, a100.partitioned) == (40 * GiB, "single", 0, True)
    assert a100.offers == (inventory_mod.Offer("nvidia.com/gpu", 7, 5 * GiB, 1, "mig", "1g.5gb"),)
    assert (l4.sharing, l4.mig_strategy) == ("time-slicing", "none")
    assert l4.offers == (inventory_mod.Offer("nvidia.com/gpu", 3, 0, 0, "shared"),)


def test_gb200_without_rack_labels_keeps_a_job_of_unknown_size_in_one_clique() -> None:
    """GB200 trays labelled with their clique and zone but no rack: no switch level, so the narrowest level (the
    clique) is where a job of unknown size (or of MIG slices only) is kept, never none."""
    objs = nodes("gb200-nvl72")
    for o in objs:
        del o["metadata"]["labels"]["topology.kubernetes.io/rack"]
    inv = inventory_mod.build(objs, policy_for(None))
    assert [lv.key for lv in inv.levels] == ["nvidia.com/gpu.clique", "topology.kubernetes.io/zone"]
    assert inv.rack_label is None
    assert inv.level_for(64, known=False) == 0 and inv.level_for(0, known=True) == 0
    assert inv.level_for(13, known=True) == 1


L1, L2, L3 = (f"topology.k8s.aws/network-node-layer-{i}" for i in (1, 2, 3))


def test_declared_levels_above_the_detected_rack_make_the_first_of_them_rack_or_finer() -> None:
    """EKS with topology.levels [layer-2, layer-1]: the rack label detected is still layer-3, but a job of unknown
    size is kept in one layer-2 domain, so a required layer-2 topology already confines it."""
    inv = inventory_mod.build(nodes("eks-p5-p6"), policy_for({"topology": {"levels": [L2, L1]}}))
    assert [lv.key for lv in inv.levels] == [L2, L1] and inv.rack_label == L3
    assert {L3, L2} <= inv.rack_or_finer and L1 not in inv.rack_or_finer


def test_each_level_confines_to_its_domain_with_every_finer_key() -> None:
    """EKS: layer-3, layer-2, layer-1, zone. Keys at a level or finer include every finer level's key, not only
    the leaf keys of each family."""
    inv = inventory_mod.build(nodes("eks-p5-p6"), policy_for(None))
    assert [lv.key for lv in inv.levels] == [L3, L2, L1, "topology.kubernetes.io/zone"]
    assert {L3, L2, L1, "topology.kubernetes.io/zone"} <= inv.level_finer[3]
    assert {L3, L2} <= inv.level_finer[1] and L1 not in inv.level_finer[1]


def test_an_inventory_whose_nodes_all_left_confines_by_the_rack_label_the_policy_sets() -> None:
    """topology.rack set to EKS's layer-3: every node leaving (scaled to zero) leaves no level, and the keys that
    confine a job to one rack are those of that label, as in an inventory that never had a node."""
    pol = policy_for({"topology": {"rack": L3}})
    inv = inventory_mod.build(nodes("eks-p5-p6"), pol)
    assert inv.levels
    gone = inv.apply({n.name: None for n in inv.nodes})
    assert gone.levels == () and gone.rack_label == L3
    assert L3 in gone.rack_or_finer and gone.rack_or_finer == inventory_mod.build([], pol).rack_or_finer


def test_node_objects_with_a_malformed_metadata_are_read_not_a_crash() -> None:
    """A nodes file's Node without metadata, or with a name that is no string: read by its labels (none here),
    never an error."""
    gpu = {"allocatable": {"nvidia.com/gpu": "8"}}
    objs: list[Any] = [
        {"kind": "Node", "status": gpu},
        {"kind": "Node", "metadata": None, "status": gpu},
        {"kind": "Node", "metadata": "h100-1", "status": gpu},
        {"kind": "Node", "metadata": {"name": ["h100-2"]}, "status": gpu},
    ]
    inv = inventory_mod.build(objs, policy_for(None))
    assert [(n.name, n.whole_gpus) for n in inv.nodes] == [("", 8)] * 4


def test_a_nodes_list_with_items_that_are_no_objects_and_repeated_names_keeps_every_node() -> None:
    """A nodes file may hold stray items (skipped) and repeat a name (both nodes kept)."""
    h100 = nodes("gpu-operator-default")[0]
    objs: list[Any] = ["dgx-h100-01", None, 8, h100, copy.deepcopy(h100)]
    inv = inventory_mod.build(objs, policy_for(None))
    assert [n.name for n in inv.nodes] == ["dgx-h100-01", "dgx-h100-01"]
    assert inv.max_whole_gpus == 8


def test_a_declared_level_no_node_carries_is_skipped_and_the_coarser_ones_kept() -> None:
    """EKS three-layer instances under levels written for four-layer ones: layer-4 is on no node, one warning,
    and layer-3 and layer-1 are still levels."""
    layer4 = "topology.k8s.aws/network-node-layer-4"
    inv = inventory_mod.build(nodes("eks-p5-p6"), policy_for({"topology": {"levels": [L3, layer4, L1]}}))
    assert [lv.key for lv in inv.levels] == [L3, L1]
    assert inv.warnings == (f"no whole-card GPU node carries {layer4!r} (topology.levels): level not used",)


def test_no_node_yet_leaves_the_rack_label_the_policy_sets_or_none() -> None:
    """A first list with no GPU node: no rack label detected (auto), or the one topology.rack sets."""
    assert inventory_mod.build([], policy_for(None)).rack_label is None
    assert inventory_mod.build([], policy_for({"topology": {"rack": L3}})).rack_label == L3


def test_equal_offers_of_different_nodes_are_one_instance() -> None:
    """50,000 nodes advertise a few dozen different offers: each is kept once."""
    a, b = (inventory_mod.node_from_object(o) for o in nodes("gpu-operator-default"))
    assert a is not None and b is not None and a.name != b.name
    assert a.offers[0] == b.offers[0] and a.offers[0] is b.offers[0]


def test_an_empty_rack_label_is_no_rack_label() -> None:
    """GPU Operator nodes whose `topology.kubernetes.io/rack` is written empty are in no rack."""
    objs = nodes("gpu-operator-default")
    for o in objs:
        o["metadata"]["labels"]["topology.kubernetes.io/rack"] = ""
    inv = inventory_mod.build(objs, policy_for(None))
    assert inv.rack_label is None and inv.max_rack_gpus == 0 and [n.rack for n in inv.nodes] == [None, None]
