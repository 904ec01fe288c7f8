"""policies/inventory.py, session 12 (issue #20): what the survivors of `_pool_changes`, `node_from_object`,
`_gpu_resources` and `_sets_of` showed no test pinned — declared pools' stand-ins while live nodes join and leave
them, and the reading of one Node object where labels or status say less than the fixtures do (no GFD, a GFD
older than the sharing-strategy label, MPS, the GPU Operator before its device plugin runs, 0 allocatable GPUs,
a status of capacity only, a DRA node without GFD)."""

from __future__ import annotations

import copy
from typing import Any

from policies import dra, mutations
from policies import inventory as inventory_mod
from tests.test_golden import policy_for
from tests.test_topology_levels import nodes

GiB = 2**30
MiB = 2**20
NODEGROUP = "eks.amazonaws.com/nodegroup"
# The p5 node group of the EKS fixture, declared before any of its Capacity Block instances has joined.
P5_POOL = {"name": "p5-reserved", "nodeSelector": {NODEGROUP: "p5"}, "product": "NVIDIA-H100-80GB-HBM3",
           "gpusPerNode": 8, "nodes": 2}  # fmt: skip


def _stand_ins(inv: inventory_mod.Inventory) -> list[str]:
    return [n.name for n in inv.nodes if n.declared]


def test_a_declared_pools_stand_ins_leave_when_a_live_node_joins_it_and_return_when_the_last_one_leaves() -> None:
    """EKS: the p5 node group declared as a pool of two 8x H100 nodes. Its stand-ins are in the inventory while
    no live node is in the pool: a p6 node joining (another node group) leaves them; the first p5 node joining
    removes them; its status updates and a second p5 node keep them out; they are back only when the last p5
    node has left. Each step is one node event, as the node watch applies them."""
    pol = policy_for({"pools": [P5_POOL]})
    read = {o["metadata"]["name"]: inventory_mod.node_from_object(o, pol.pools) for o in nodes("eks-p5-p6")}
    p5a, p5b = "ip-10-0-1-10.ec2.internal", "ip-10-0-1-11.ec2.internal"
    p6 = "ip-10-0-1-14.ec2.internal"
    assert [(k, n.pool if n else None) for k, n in read.items() if k in (p5a, p5b, p6)] == [
        (p5a, "p5-reserved"),
        (p5b, "p5-reserved"),
        (p6, None),
    ]
    stand_ins = ["p5-reserved-0", "p5-reserved-1"]

    inv = inventory_mod.empty(pol)
    assert _stand_ins(inv) == stand_ins
    assert [n.name for n in inv.all.having(inventory_mod.DECLARED)] == stand_ins
    assert [(n.whole_gpus, n.memory_bytes) for n in inv.nodes] == [(8, 80 * GiB)] * 2

    inv = inv.apply({p6: read[p6]})  # another node group: still no live node in the pool
    assert _stand_ins(inv) == stand_ins
    assert [n.name for n in inv.all.having(inventory_mod.DECLARED)] == stand_ins

    inv = inv.apply({p5a: read[p5a]})  # the first live node of the pool: the stand-ins leave
    assert _stand_ins(inv) == []
    assert sorted(n.name for n in inv.nodes) == [p5a, p6]
    assert not inv.all.having(inventory_mod.DECLARED)

    inv = inv.apply({p5a: copy.copy(read[p5a])})  # its status update (a heartbeat)
    assert _stand_ins(inv) == []
    inv = inv.apply({p5b: read[p5b]})
    assert _stand_ins(inv) == []

    inv = inv.apply({p5a: None})  # one p5 node left: the pool still has a live node
    assert _stand_ins(inv) == [] and sorted(n.name for n in inv.nodes) == [p5b, p6]
    inv = inv.apply({p5b: None})  # the last one left: the stand-ins are back
    assert _stand_ins(inv) == stand_ins
    assert [n.name for n in inv.all.having(inventory_mod.DECLARED)] == stand_ins
    assert sorted(n.name for n in inv.nodes) == sorted([p6, *stand_ins])


def test_nodes_without_gfd_have_no_product_no_sharing_and_no_mig() -> None:
    """EKS GPU AMI nodes: the device plugin advertises nvidia.com/gpu, no GFD labels at all. No product (the
    empty string every product set and message reads), sharing and MIG strategy "none", whole cards."""
    for obj in nodes("eks-p5-p6"):
        n = inventory_mod.node_from_object(obj)
        assert n is not None
        assert (n.product, n.sharing, n.mig_strategy, n.whole_gpus, n.partitioned) == ("", "none", "none", 8, False)
        assert n.whole_card and not n.shared
    inv = inventory_mod.build(nodes("eks-p5-p6"), policy_for(None))
    assert [name for name, _ in inv.all.members_of("product")] == [("product", "")]


def _without_sharing_label(obj: dict[str, Any]) -> dict[str, Any]:
    del obj["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"]
    return obj


def test_gfd_before_the_sharing_strategy_label_is_read_time_sliced_by_its_replicas_or_shared_product() -> None:
    """GFD before device plugin v0.15 (NVIDIA/k8s-device-plugin#503 added `nvidia.com/gpu.sharing-strategy`)
    said time-slicing with `nvidia.com/gpu.replicas` alone, plus `-SHARED` on the product when the resource is
    not renamed. The time-slicing fixture's nodes without the label, and an L4 node shared 2 ways (renamed, so
    its product keeps its plain name): replicas above 1, or a -SHARED product, is time-slicing; 1 is none."""
    objs = [_without_sharing_label(o) for o in nodes("time-slicing")]
    two = copy.deepcopy(objs[1])
    two["metadata"]["name"] = two["metadata"]["labels"]["kubernetes.io/hostname"] = "l4-ts-two-way"
    two["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "2"
    two["status"]["allocatable"]["nvidia.com/gpu.shared"] = "8"
    read = [inventory_mod.node_from_object(o) for o in [*objs, two]]
    assert [(n.name, n.sharing, n.shared, n.whole_card) for n in read if n is not None] == [
        ("l4-ts-default", "time-slicing", True, False),
        ("l4-ts-renamed", "time-slicing", True, False),
        ("h100-whole-01", "none", False, True),
        ("l4-ts-two-way", "time-slicing", True, False),
    ]
    # A shared product with no replicas label at all is still time-sliced.
    bare = copy.deepcopy(objs[0])
    del bare["metadata"]["labels"]["nvidia.com/gpu.replicas"]
    n = inventory_mod.node_from_object(bare)
    assert n is not None and n.sharing == "time-slicing"


def test_an_mps_node_is_read_as_mps_not_time_slicing() -> None:
    """The device plugin's MPS sharing (v0.15+): GFD labels `nvidia.com/gpu.sharing-strategy: mps` with the
    replicas and the -SHARED product, as for time-slicing; the strategy is read as the label says."""
    obj = nodes("time-slicing")[0]
    obj["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "mps"
    n = inventory_mod.node_from_object(obj)
    assert n is not None and (n.sharing, n.shared) == ("mps", True)
    assert [(o.resource, o.count, o.kind) for o in n.offers] == [("nvidia.com/gpu", 16, "shared")]


def test_a_node_object_without_a_name_is_named_by_its_hostname_label() -> None:
    """A nodes file's Node written without `metadata.name`: its `kubernetes.io/hostname` label names it."""
    obj = nodes("gpu-operator-default")[0]
    del obj["metadata"]["name"]
    n = inventory_mod.node_from_object(obj)
    assert n is not None and n.name == obj["metadata"]["labels"]["kubernetes.io/hostname"] != ""


def _before_gfd(obj: dict[str, Any]) -> dict[str, Any]:
    """A GPU Operator node before GFD runs: of NVIDIA's labels only `nvidia.com/gpu.present` (from NFD's PCI
    label), no count labels."""
    labels = obj["metadata"]["labels"]
    obj["metadata"]["labels"] = {
        k: v for k, v in labels.items() if not k.startswith("nvidia.com/") or k == "nvidia.com/gpu.present"
    }
    return obj


def test_the_gpu_operator_labels_a_gpu_node_before_its_device_plugin_runs() -> None:
    """The GPU Operator labels `nvidia.com/gpu.present: "true"` before the driver, GFD and the device plugin
    run: no count labels, no nvidia.com/gpu in the allocatable yet. The node is a GPU node offering nothing (so
    far); without that label the same node is no GPU node."""
    obj = _before_gfd(nodes("gpu-operator-default")[0])
    del obj["status"]["allocatable"]["nvidia.com/gpu"]
    n = inventory_mod.node_from_object(obj)
    assert n is not None
    assert (n.name, n.offers, n.whole_gpus, n.product, n.whole_card) == (obj["metadata"]["name"], (), 0, "", False)
    del obj["metadata"]["labels"]["nvidia.com/gpu.present"]
    assert inventory_mod.node_from_object(obj) is None


def test_a_node_whose_gpus_are_all_unhealthy_offers_none() -> None:
    """The device plugin advertises only healthy GPUs: after XID errors a node's allocatable says
    `nvidia.com/gpu: "0"` (its capacity still 8). An EKS node (no GFD label) is then no GPU node, not a node
    of its cpu, memory or EFA counts; a node labelled present without count labels is kept, offering nothing
    (no offer of 0 units)."""
    eks = nodes("eks-p5-p6")[0]
    eks["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    assert inventory_mod.node_from_object(eks) is None
    present = _before_gfd(nodes("gpu-operator-default")[0])
    present["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    n = inventory_mod.node_from_object(present)
    assert n is not None and n.offers == () and n.whole_gpus == 0


def test_a_status_of_capacity_only_is_read_as_its_allocatable() -> None:
    """A nodes file written with `status.capacity` only (the API server copies it into the allocatable when
    the allocatable is absent): read as that allocatable, for a node without GFD labels (EKS) as for one with."""
    for obj in (nodes("eks-p5-p6")[0], nodes("gpu-operator-default")[0]):
        obj["status"] = {"capacity": obj["status"]["allocatable"]}
        n = inventory_mod.node_from_object(obj)
        assert n is not None
        assert [(o.resource, o.count, o.kind) for o in n.offers] == [("nvidia.com/gpu", 8, "whole")]


def test_a_dra_node_without_gfd_labels_has_the_nominal_memory_of_the_product_its_slices_name() -> None:
    """The NVIDIA DRA driver without GFD: the node says only `nvidia.com/gpu.present`; its slices publish
    `productName: NVIDIA H100 80GB HBM3` and 81559Mi per GPU. The card is the 80 GiB H100 (the catalogue's
    nominal size, as from a GFD product label), not 81559 MiB."""
    obj = nodes("examples/cluster/dra.yaml")[0]
    obj["metadata"]["labels"] = {k: v for k, v in obj["metadata"]["labels"].items() if k != "nvidia.com/gpu.product"}
    devices = dra.NodeDevices({"nvidia.com/gpu": 8}, "NVIDIA-H100-80GB-HBM3", 81559 * MiB)
    n = inventory_mod.node_from_object(obj, (), devices)
    assert n is not None
    assert (n.product, n.memory_bytes, n.whole_gpus) == ("", 80 * GiB, 8)
    assert n.offers == (
        inventory_mod.Offer("nvidia.com/gpu", 8, 80 * GiB, 0, "whole", dra=True, device_memory=81559 * MiB),
    )


def test_a_mig_single_slice_offers_its_own_memory_to_a_memory_ask() -> None:
    """MIG single (A100 40GB, all 1g.5gb) beside an H100 node: each nvidia.com/gpu unit of the A100 node is a
    5 GiB slice, so a 20 GiB ask is best fitted by a whole H100, and a 4 GiB ask by the slice."""
    inv = inventory_mod.build(nodes("mig-single"), policy_for(None))
    offers = {(name[1].resource, name[1].kind, name[2]) for name, _ in inv.all.members_of("offer")}
    assert offers == {("nvidia.com/gpu", "mig", 5 * GiB), ("nvidia.com/gpu", "whole", 80 * GiB)}
    big = mutations.choose_slice(inv.all, 20 * GiB, allow_shared=False)
    assert big is not None and (big[0].kind, [n.name for n in big[1]]) == ("whole", ["h100-01"])
    small = mutations.choose_slice(inv.all, 4 * GiB, allow_shared=False)
    assert small is not None and (small[0].profile, [n.name for n in small[1]]) == ("1g.5gb", ["a100-mig-single-01"])


def test_levels_declared_by_a_sites_own_labels_are_counted_from_the_first_node() -> None:
    """On-prem GPU Operator nodes labelled with the site's own leaf-switch and spine keys, declared as
    `topology.levels` (no key detection knows): both are levels, counted from an inventory that starts empty."""
    leaf, spine = "network.example.com/leaf", "network.example.com/spine"
    objs = nodes("gpu-operator-default")
    for o, value in zip(objs, ("leaf-1", "leaf-2"), strict=True):
        o["metadata"]["labels"] |= {leaf: value, spine: "spine-1"}
    pol = policy_for({"topology": {"levels": [leaf, spine]}})
    inv = inventory_mod.build(objs, pol)
    assert [(lv.key, lv.domains, lv.largest_gpus) for lv in inv.levels] == [(leaf, 2, 8), (spine, 1, 16)]
    assert inv.warnings == ()


def _gke_time_shared_a100(clients: int) -> dict[str, Any]:
    """A GKE A100 40GB node (a2-highgpu-1g) in a time-sharing node pool: GKE's device plugin advertises each
    GPU as `clients` units of nvidia.com/gpu; no GFD, so no nvidia.com/gpu.replicas label."""
    name = "gke-a100-shared-pool-0"
    labels = {
        "kubernetes.io/hostname": name,
        "cloud.google.com/gke-nodepool": "a100-shared-pool",
        "cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
        "cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
        "cloud.google.com/gke-max-shared-clients-per-gpu": str(clients),
    }
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "11", "pods": "110", "nvidia.com/gpu": str(clients)}}}  # fmt: skip


def test_a_gke_time_shared_unit_offers_the_cards_memory_shared_by_its_clients() -> None:
    """A time-shared unit offers its fair share of the card (docs/policy.md: card memory / replicas). On GKE the
    replicas are `cloud.google.com/gke-max-shared-clients-per-gpu`: an A100 40GB shared by 4 clients offers
    10 GiB a unit, so an 8 GiB ask fits a share and a 16 GiB one goes to a whole H100 (the fixture's A3 Mega)."""
    h100 = nodes("gke")[0]
    inv = inventory_mod.build([_gke_time_shared_a100(4), h100], policy_for(None))
    offers = {(name[1].kind, name[1].count, name[2]) for name, _ in inv.all.members_of("offer")}
    assert offers == {("shared", 4, 10 * GiB), ("whole", 8, 80 * GiB)}
    fits = mutations.choose_slice(inv.all, 8 * GiB, allow_shared=True)
    assert fits is not None and (fits[0].kind, [n.name for n in fits[1]]) == ("shared", ["gke-a100-shared-pool-0"])
    too_big = mutations.choose_slice(inv.all, 16 * GiB, allow_shared=True)
    assert too_big is not None and (too_big[0].kind, [n.name for n in too_big[1]]) == (
        "whole",
        [h100["metadata"]["name"]],
    )
