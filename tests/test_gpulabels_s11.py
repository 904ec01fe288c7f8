"""gpulabels' whole-card and not-shared expressions on label sets the fixture clusters do not have (issue #20,
session 11): a time-sliced node as GFD labelled it before `nvidia.com/gpu.sharing-strategy` existed (only the
`-SHARED` product says so), nodes no label tells apart (the problem line, word for word), and an expression that
would shut out a whole-card node, which is left out. policies/affinity.py is checked against these functions
(tests/test_affinity.py), so they are the spec of what the inventory offers as node affinity."""

from __future__ import annotations

from policies import gpulabels
from policies.gpulabels import BASE_EXPRESSIONS

H100 = {
    "kubernetes.io/hostname": "h100-a-1",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "single",
}


def old_gfd_time_sliced(host: str, product: str) -> dict[str, str]:
    """Time-slicing without renameByDefault under a GFD older than the sharing-strategy label: the product gets
    `-SHARED` and `gpu.replicas` the replica count, nothing else says the GPUs are shared."""
    return {
        "kubernetes.io/hostname": host,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/mig.strategy": "single",
    }


def bare(host: str) -> dict[str, str]:
    """A node whose MIG slices show only in its allocatable (no GFD labels): nothing to select it by."""
    return {"kubernetes.io/hostname": host, "kubernetes.io/os": "linux"}


L4_OLD = old_gfd_time_sliced("l4-ts-1", "NVIDIA-L4-SHARED")
A10G_OLD = old_gfd_time_sliced("a10g-ts-1", "NVIDIA-A10G-SHARED")
# A GFD that has the sharing-strategy label writes it beside the -SHARED product: BASE_EXPRESSIONS exclude it.
L4_NEW = {**old_gfd_time_sliced("l4-ts-2", "NVIDIA-L4-SHARED"), "nvidia.com/gpu.sharing-strategy": "time-slicing"}
PRODUCTS_NOT_IN = {
    "key": "nvidia.com/gpu.product",
    "operator": "NotIn",
    "values": ["NVIDIA-A10G-SHARED", "NVIDIA-L4-SHARED"],
}


def test_a_shared_product_without_the_sharing_label_is_excluded_by_its_product() -> None:
    """Both selections name every -SHARED product of the unlabelled nodes, sorted, in one NotIn; a node that
    has the sharing label is left to BASE_EXPRESSIONS. No node leaks, so no problem line."""
    exprs, problems = gpulabels.whole_card_expressions([H100], [L4_OLD, A10G_OLD, L4_NEW])
    assert exprs == (*BASE_EXPRESSIONS, PRODUCTS_NOT_IN)
    assert problems == []
    exprs, problems = gpulabels.not_shared_expressions([H100], [A10G_OLD, L4_OLD])
    assert exprs == (BASE_EXPRESSIONS[0], PRODUCTS_NOT_IN)
    assert problems == []


def test_only_the_sharing_label_when_every_shared_node_has_it() -> None:
    exprs, problems = gpulabels.not_shared_expressions([H100], [L4_NEW])
    assert exprs == (BASE_EXPRESSIONS[0],)
    assert problems == []


def test_nodes_no_label_tells_apart_are_counted_and_the_first_three_named() -> None:
    """Four leaking nodes: the count, then the first three names in sorted order. A node written without a
    hostname label (a hand-made `check --nodes` file) is named "?", which sorts first."""
    nameless = {"kubernetes.io/os": "linux"}
    leaking = [bare("gpu-c"), bare("gpu-a"), nameless, bare("gpu-b")]
    exprs, problems = gpulabels.whole_card_expressions([H100], leaking)
    assert exprs == BASE_EXPRESSIONS
    assert problems == ["4 MIG or shared GPU node(s) (?, gpu-a, gpu-b) carry no label that tells them apart"]
    exprs, problems = gpulabels.not_shared_expressions([H100], [bare("gpu-a")])
    assert exprs == BASE_EXPRESSIONS[:1]
    assert problems == ["1 time-sliced or MPS GPU node(s) (gpu-a) carry no label that tells them apart"]


def test_an_expression_that_would_shut_out_a_whole_card_node_is_left_out() -> None:
    """Cluster-wide mixed strategy (every node labelled mixed: one DoesNotExist per profile in use). A whole-card
    node whose 1g.10gb count reads 0 (no slice: `partitioned` says whole, test_gpulabels) would fail that
    profile's DoesNotExist, so it is dropped; the 3g.40gb one still keeps the MIG node out. The base
    expressions stay whatever the nodes carry."""
    whole = {**H100, "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.10gb.count": "0"}
    assert not gpulabels.partitioned(whole, None, ["nvidia.com/gpu"])
    mig = {
        "kubernetes.io/hostname": "a100-mig-1",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.10gb.count": "16",
        "nvidia.com/mig-3g.40gb.count": "8",
    }
    exprs, problems = gpulabels.whole_card_expressions([whole], [mig])
    assert exprs == (*BASE_EXPRESSIONS, {"key": "nvidia.com/mig-3g.40gb.count", "operator": "DoesNotExist"})
    assert problems == []
