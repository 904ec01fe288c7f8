"""policies/affinity.py on label sets the fixture clusters do not have (issue #20, session 12): the problem lines
word for word, a `-SHARED` product without the sharing label, MIG layouts where the mixed expressions depend on
which node carries which profile count, labels written with an empty value, and `same_inputs` on the indexes
`Inventory.apply` really makes (a GFD timestamp refresh, a strategy relabel, a status-only repartition).

Every inventory is also checked against gpulabels' functions over the nodes' label lists (test_affinity.check):
they are the spec `expressions` mirrors; the expected tuples are written out as well, read from gpulabels_s11's
cases and the nodes below."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from policies import affinity
from policies import inventory as inventory_mod
from policies.gpulabels import BASE_EXPRESSIONS
from tests.test_affinity import check
from tests.test_golden import policy_for
from tests.test_gpulabels import EXAMPLE, nodes

CLUSTERS = Path(__file__).parent / "fixtures" / "clusters"


def fixture_node(path: Path, name: str) -> dict[str, Any]:
    node: dict[str, Any] = copy.deepcopy(next(n for n in nodes(path) if n["metadata"]["name"] == name))
    return node


def renamed(node: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(node)
    out["metadata"]["name"] = name
    out["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return out


def build(items: list[dict[str, Any]]) -> inventory_mod.Inventory:
    inv = inventory_mod.build(items, policy_for(None))
    check(inv)
    return inv


def apply(inv: inventory_mod.Inventory, *items: dict[str, Any]) -> inventory_mod.Inventory:
    policy = policy_for(None)
    return inv.apply({n["metadata"]["name"]: inventory_mod.node_from_object(n, policy.pools) for n in items})


def does_not_exist(key: str) -> dict[str, Any]:
    return {"key": key, "operator": "DoesNotExist"}


H100 = fixture_node(EXAMPLE, "h100-a-1")
A100_MIXED = fixture_node(EXAMPLE, "a100-mig-1")  # 2 whole GPUs beside 1g.10gb, 2g.20gb and 3g.40gb slices
H100_MIXED = fixture_node(CLUSTERS / "mig-mixed.yaml", "h100-mixed-01")  # MIG off, labelled mixed cluster-wide
L4_RENAMED = fixture_node(CLUSTERS / "time-slicing.yaml", "l4-ts-renamed")


def a100_one_profile(name: str, profile: str, slices: int, gpus: int, whole: int = 0) -> dict[str, Any]:
    """An A100 80GB node under the mixed strategy (a100-balanced-01 of mig-mixed.yaml relabelled) with `gpus`
    GPUs: `slices` slices of one profile, and `whole` GPUs left whole. With none left whole it offers no
    nvidia.com/gpu, so a whole-GPU ask cannot land there: it is in neither selection's groups."""
    node = renamed(fixture_node(CLUSTERS / "mig-mixed.yaml", "a100-balanced-01"), name)
    labels = node["metadata"]["labels"]
    for key in [k for k in labels if k.startswith("nvidia.com/mig-")]:
        del labels[key]
    labels["nvidia.com/gpu.count"] = str(gpus)
    labels["nvidia.com/mig.config"] = f"all-{profile}" if not whole else "custom-mixed"
    labels.update(
        {
            f"nvidia.com/mig-{profile}.count": str(slices),
            f"nvidia.com/mig-{profile}.product": f"NVIDIA-A100-SXM4-80GB-MIG-{profile}",
            f"nvidia.com/mig-{profile}.replicas": "1",
        }
    )
    allocatable = {"cpu": "250", "memory": "1000Gi", "pods": "110", f"nvidia.com/mig-{profile}": str(slices)}
    if whole:
        allocatable["nvidia.com/gpu"] = str(whole)
    node["status"]["allocatable"] = allocatable
    return node


# --- the problem lines ---------------------------------------------------------------------------------------


def old_gfd_renamed_labels_only(name: str) -> dict[str, Any]:
    """l4-ts-renamed as a GFD older than `nvidia.com/gpu.sharing-strategy` labelled it (time-slicing with
    renameByDefault: the product keeps its name, `gpu.replicas` says 4), in a nodes file of labels only (no
    status): the inventory reads it as offering nvidia.com/gpu, time-sliced by its replicas, and no label the
    expressions can use tells it apart."""
    node = renamed(L4_RENAMED, name)
    del node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"]
    del node["status"]
    return node


def test_nodes_no_label_tells_apart_are_counted_and_the_first_three_named_in_each_selection() -> None:
    """Four such nodes leak from both selections: one problem line each, the count, the selection's own words
    ("MIG or shared" for training-pool's, "time-sliced or MPS" for online-exclusive's) and the first three
    names in sorted order, whole-card line first."""
    leaking = [old_gfd_renamed_labels_only(n) for n in ("l4-ts-c", "l4-ts-a", "l4-ts-d", "l4-ts-b")]
    inv = build([H100, *leaking])
    assert [n.name for n in inv.nodes if n.shared] == ["l4-ts-c", "l4-ts-a", "l4-ts-d", "l4-ts-b"]
    assert inv.whole_card_expressions == BASE_EXPRESSIONS
    assert inv.not_shared_expressions == BASE_EXPRESSIONS[:1]
    assert inv.label_problems == (
        "4 MIG or shared GPU node(s) (l4-ts-a, l4-ts-b, l4-ts-c) carry no label that tells them apart",
        "4 time-sliced or MPS GPU node(s) (l4-ts-a, l4-ts-b, l4-ts-c) carry no label that tells them apart",
    )
    assert inv.warnings[-2:] == inv.label_problems


def test_a_leaking_node_without_a_hostname_label_is_named_by_a_question_mark() -> None:
    """A hand-written nodes file may leave the hostname label out: the line names such a node "?" (it sorts
    before the letters), as gpulabels does."""
    nameless = old_gfd_renamed_labels_only("l4-ts-x")
    del nameless["metadata"]["labels"]["kubernetes.io/hostname"]
    inv = build([H100, nameless, old_gfd_renamed_labels_only("l4-ts-a")])
    assert inv.label_problems == (
        "2 MIG or shared GPU node(s) (?, l4-ts-a) carry no label that tells them apart",
        "2 time-sliced or MPS GPU node(s) (?, l4-ts-a) carry no label that tells them apart",
    )


# --- a -SHARED product without the sharing label ---------------------------------------------------------------


def old_gfd_time_sliced(name: str, product: str) -> dict[str, Any]:
    """Time-slicing without renameByDefault under a GFD older than the sharing-strategy label: the product gets
    `-SHARED`, nothing else says the GPUs are shared (test_gpulabels_s11.old_gfd_time_sliced, as a Node)."""
    node = renamed(fixture_node(CLUSTERS / "time-slicing.yaml", "l4-ts-default"), name)
    del node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"]
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = product
    return node


def test_a_shared_product_without_the_sharing_label_is_excluded_by_its_product_in_both_selections() -> None:
    """Every -SHARED product of the unlabelled shared nodes, sorted, in one NotIn (a node that has the sharing
    label is left to the base expressions): no node leaks."""
    l4_new = renamed(fixture_node(CLUSTERS / "time-slicing.yaml", "l4-ts-default"), "l4-ts-new")
    inv = build(
        [
            H100,
            old_gfd_time_sliced("l4-ts-old", "NVIDIA-L4-SHARED"),
            old_gfd_time_sliced("a10g-ts-old", "NVIDIA-A10G-SHARED"),
            l4_new,
        ]
    )
    products = {
        "key": "nvidia.com/gpu.product",
        "operator": "NotIn",
        "values": ["NVIDIA-A10G-SHARED", "NVIDIA-L4-SHARED"],
    }
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, products)
    assert inv.not_shared_expressions == (BASE_EXPRESSIONS[0], products)
    assert inv.label_problems == ()


# --- GKE labels written with an empty value --------------------------------------------------------------------


def gke_node(name: str) -> dict[str, Any]:
    return renamed(fixture_node(CLUSTERS / "gke.yaml", name), name)


def test_gke_labels_with_an_empty_value_are_read_as_absent() -> None:
    """Kubernetes allows an empty label value (`kubectl label node n key=` writes one). gpulabels reads an empty
    `gke-gpu-partition-size` or `gke-gpu-sharing-strategy` as no label (`labels.get(key)` is falsy), so
    neither gets a DoesNotExist of its own: here the time-shared L4 pool carries an empty partition size and
    the MIG pool an empty sharing strategy, and each keeps only the expression of the label it really has."""
    l4 = gke_node("gke-l4-shared-pool-0")
    l4["metadata"]["labels"]["cloud.google.com/gke-gpu-partition-size"] = ""
    inv = build([gke_node("gke-a3-mega-pool-0"), l4])
    sharing = does_not_exist("cloud.google.com/gke-gpu-sharing-strategy")
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, sharing)
    assert inv.not_shared_expressions == (BASE_EXPRESSIONS[0], sharing)
    assert inv.label_problems == ()

    mig = gke_node("gke-a100-mig-pool-0")
    mig["metadata"]["labels"]["cloud.google.com/gke-gpu-sharing-strategy"] = ""
    inv = build([gke_node("gke-a3-mega-pool-0"), mig])
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, does_not_exist("cloud.google.com/gke-gpu-partition-size"))
    assert inv.not_shared_expressions == BASE_EXPRESSIONS[:1]
    assert inv.label_problems == ()


# --- MIG mixed: which profiles count -----------------------------------------------------------------------------


def count(profile: str) -> dict[str, Any]:
    return does_not_exist(f"nvidia.com/mig-{profile}.count")


def test_only_profiles_of_the_mig_nodes_offering_whole_gpus_are_excluded() -> None:
    """Mixed strategy cluster-wide (the whole-card H100 is labelled mixed too), so one DoesNotExist per profile
    the MIG nodes offering nvidia.com/gpu use: a100-mig-1's three. The all-7g.80gb node offers no
    nvidia.com/gpu (a whole-GPU ask cannot land there), so its 7g.80gb is none of the expressions' business;
    listed after a100-mig-1, its profile is the last one read."""
    inv = build([H100_MIXED, A100_MIXED, a100_one_profile("a100-7g-01", "7g.80gb", 8, 8)])
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, count("1g.10gb"), count("2g.20gb"), count("3g.40gb"))
    assert inv.label_problems == ()


def test_a_strategy_labelled_per_node_gets_the_one_strategy_expression_whatever_profile_comes_last() -> None:
    """The H100 labelled single (a per-node mixed config, as in examples/cluster): `mig.strategy NotIn
    [mixed]` covers a100-mig-1, whichever profile label is read last (here the 7g.80gb of a node not in the
    groups)."""
    inv = build([H100, A100_MIXED, a100_one_profile("a100-7g-01", "7g.80gb", 8, 8)])
    mixed = {"key": "nvidia.com/mig.strategy", "operator": "NotIn", "values": ["mixed"]}
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, mixed)
    assert inv.label_problems == ()


def test_a_profile_counted_once_is_a_profile_in_use() -> None:
    """mig-parted's per-device layouts: GPU 0 of an 8-GPU A100 node runs `all-balanced` (2x 1g.10gb, 1x
    2g.20gb, 1x 3g.40gb), the other seven stay whole. A count of "1" is a slice like any other."""
    node = renamed(A100_MIXED, "a100-gpu0-balanced")
    labels = node["metadata"]["labels"]
    labels.update(
        {
            "nvidia.com/mig-1g.10gb.count": "2",
            "nvidia.com/mig-2g.20gb.count": "1",
            "nvidia.com/mig-3g.40gb.count": "1",
        }
    )
    node["status"]["allocatable"].update(
        {
            "nvidia.com/gpu": "7",
            "nvidia.com/mig-1g.10gb": "2",
            "nvidia.com/mig-2g.20gb": "1",
            "nvidia.com/mig-3g.40gb": "1",
        }
    )
    inv = build([H100_MIXED, node])
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, count("1g.10gb"), count("2g.20gb"), count("3g.40gb"))


def test_a_profile_counted_zero_is_no_profile_in_use() -> None:
    """A count label reading "0" is no slice (gpulabels._positive; test_gpulabels_s11 reads a whole-card node so
    labelled as whole): a100-mig-1 with a 7g.80gb count of 0 gets no 7g.80gb expression."""
    node = copy.deepcopy(A100_MIXED)
    node["metadata"]["labels"]["nvidia.com/mig-7g.80gb.count"] = "0"
    inv = build([H100_MIXED, node])
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, count("1g.10gb"), count("2g.20gb"), count("3g.40gb"))


def test_an_expression_that_would_shut_out_a_whole_card_node_is_left_out() -> None:
    """test_gpulabels_s11's case on Nodes: the whole-card H100, labelled mixed cluster-wide, reads a 1g.10gb count
    of 0 (no slice: it stays whole), so `mig-1g.10gb.count DoesNotExist` would shut it out and is dropped; the
    2g.20gb and 3g.40gb ones still keep a100-mig-1 out, and the base expressions stay."""
    h100 = copy.deepcopy(H100_MIXED)
    h100["metadata"]["labels"]["nvidia.com/mig-1g.10gb.count"] = "0"
    inv = build([h100, A100_MIXED])
    assert [n.whole_card for n in inv.nodes] == [True, False]
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, count("2g.20gb"), count("3g.40gb"))
    assert inv.label_problems == ()


def test_every_count_value_of_a_profile_counts() -> None:
    """Two nodes count the same profile differently, one offering whole GPUs beside its slices, one not: the
    profile's nodes are those of every value. Built twice with the counts swapped (an 8-GPU node with 2 or 4
    GPUs in 1g.10gb slices, a 4- or 2-GPU node all in them), so whichever value the index lists last, one build
    has the value of the node offering nvidia.com/gpu first."""
    mixed = {"key": "nvidia.com/mig.strategy", "operator": "NotIn", "values": ["mixed"]}
    for partial_gpus, full_gpus in ((2, 4), (4, 2)):
        partial = a100_one_profile("a100-partial", "1g.10gb", 7 * partial_gpus, 8, whole=8 - partial_gpus)
        full = a100_one_profile("a100-full", "1g.10gb", 7 * full_gpus, full_gpus)
        inv = build([H100, partial, full])
        assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, mixed), partial_gpus
        assert inv.label_problems == ()


# --- same_inputs on the indexes Inventory.apply makes ----------------------------------------------------------


def test_a_gfd_timestamp_refresh_leaves_the_expressions_inputs_the_same() -> None:
    """GFD rewrites `nvidia.com/gfd.timestamp` at every refresh: a label the expressions never read, so the new
    index shares every posting they read with the old one (a status update with nothing changed shares the
    label table itself)."""
    h100 = copy.deepcopy(H100)
    h100["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = "1764700000"
    inv = build([h100, A100_MIXED])
    assert affinity.same_inputs(inv.index, inv.index)
    same = apply(inv, copy.deepcopy(h100))
    assert same.index.labels is inv.index.labels
    assert affinity.same_inputs(inv.index, same.index)
    later = copy.deepcopy(h100)  # a new object: the inventory shares the labels of the one it read
    later["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = "1764700060"
    refreshed = apply(inv, later)
    assert refreshed.index.labels is not inv.index.labels and refreshed.index.sets is inv.index.sets
    assert affinity.same_inputs(inv.index, refreshed.index)
    assert affinity.same_inputs(refreshed.index, inv.index)


def test_a_relabel_of_the_mig_strategy_is_a_new_input() -> None:
    """The GPU Operator's strategy switched to mixed cluster-wide: GFD relabels the whole-card H100, whose sets
    stay the same. The per-node NotIn [mixed] no longer admits it, so the expressions become one DoesNotExist
    per profile: the updated inventory answers as a fresh build does."""
    inv = build([H100, A100_MIXED])
    mixed = {"key": "nvidia.com/mig.strategy", "operator": "NotIn", "values": ["mixed"]}
    assert inv.whole_card_expressions == (*BASE_EXPRESSIONS, mixed)
    relabelled = copy.deepcopy(H100)
    relabelled["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    after = apply(inv, relabelled)
    assert after.index.sets is inv.index.sets and len(after.index) == len(inv.index)
    assert not affinity.same_inputs(inv.index, after.index)
    fresh = build([relabelled, A100_MIXED])
    assert after.whole_card_expressions == fresh.whole_card_expressions
    assert after.whole_card_expressions == (*BASE_EXPRESSIONS, count("1g.10gb"), count("2g.20gb"), count("3g.40gb"))


def test_a_status_only_repartition_is_a_new_input() -> None:
    """The device plugin alone (its Helm chart leaves GFD off by default): no nvidia.com labels, so what a node
    offers is all there is. A node with two GPUs in 1g.10gb slices beside six whole ones leaks (nothing to
    select it by); repartitioning the rest changes only its allocatable, so it no longer offers nvidia.com/gpu
    and leaves the groups: the index keeps its label table, its sets change, and the problem line goes."""

    def plugin_only(name: str, allocatable: dict[str, str]) -> dict[str, Any]:
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        status = {"allocatable": {"cpu": "250", "memory": "1000Gi", "pods": "110", **allocatable}}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "status": status}

    whole = plugin_only("gpu-a-1", {"nvidia.com/gpu": "8"})
    part = plugin_only("gpu-b-1", {"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "14"})
    inv = build([whole, part])
    assert inv.label_problems == ("1 MIG or shared GPU node(s) (gpu-b-1) carry no label that tells them apart",)
    after = apply(inv, plugin_only("gpu-b-1", {"nvidia.com/mig-1g.10gb": "56"}))
    assert after.index.labels is inv.index.labels and after.index.sets is not inv.index.sets
    assert not affinity.same_inputs(inv.index, after.index)
    assert after.label_problems == ()
    assert after.whole_card_expressions == BASE_EXPRESSIONS
