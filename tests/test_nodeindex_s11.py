"""The node index on the example cluster where tests/test_nodeindex.py's random selections do not reach (issue
#20, session 11): a node added after the first list found by its name, a nameless node beside a pinned pod,
selections written wrong (a list where a label value belongs, strings where expressions belong), a nodeName
pin beside a nodeSelector, and an entry replaced by a node of another name. Each selection is checked against
the node-by-node filter (policies/selectors.py), the definition the index mirrors."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import inventory as inventory_mod
from policies import nodeindex
from policies.document import default_policy
from policies.selectors import node_selection, selection_filter

EXAMPLE = Path(__file__).parent.parent / "examples" / "cluster" / "nodes.yaml"


def example_nodes() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["items"]
    return items


def pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": spec}


def required(*terms: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def chosen(inv: inventory_mod.Inventory, p: dict[str, Any]) -> list[str]:
    """The index's answer, after checking it is the filter's."""
    allowed = selection_filter(node_selection(p))
    want = sorted(n.name for n in inv.nodes if allowed(n.labels, n.name))
    got = sorted(n.name for n in inv.candidates(p))
    assert got == want, p
    return got


def test_a_node_added_after_the_first_list_is_found_by_its_name() -> None:
    """Nodes of the first list are indexed in bulk (_load); one added later goes through the incremental path,
    which must index its name too, or a pod pinned to it by nodeName would find no node."""
    nodes = example_nodes()
    late = next(n for n in nodes if n["metadata"]["name"] == "h100-b-2")
    policy = default_policy()
    inv = inventory_mod.build([n for n in nodes if n is not late], policy)
    assert chosen(inv, pod({"nodeName": "h100-b-2"})) == []
    inv = inv.apply({"h100-b-2": inventory_mod.node_from_object(late, policy.pools)})
    assert chosen(inv, pod({"nodeName": "h100-b-2"})) == ["h100-b-2"]
    inv = inv.apply({"h100-b-2": None})
    assert chosen(inv, pod({"nodeName": "h100-b-2"})) == []


def test_a_pinned_pod_does_not_exclude_a_node_without_a_name() -> None:
    """A node written without metadata.name or a hostname label (a hand-made `check --nodes` file) has the name
    "": like the filter, a nodeName pin does not rule it out."""
    nodes = example_nodes()
    nameless = copy.deepcopy(next(n for n in nodes if n["metadata"]["name"] == "h100-b-2"))
    del nameless["metadata"]["name"]
    del nameless["metadata"]["labels"]["kubernetes.io/hostname"]
    inv = inventory_mod.build([*[n for n in nodes if n["metadata"]["name"] != "h100-b-2"], nameless], default_policy())
    assert chosen(inv, pod({"nodeName": "h100-a-1"})) == ["", "h100-a-1"]


@pytest.mark.parametrize(
    "spec",
    [
        # a list where a label value belongs: no node has it (and it is no key of any table)
        {"nodeSelector": {"topology.kubernetes.io/zone": ["zone-1"]}},
        # a set-based selector string written where an expression mapping belongs
        {"affinity": required({"matchExpressions": ["nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3)"]})},
        # the same for matchFields, beside a valid expression
        {
            "affinity": required(
                {
                    "matchExpressions": [
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-1"]}
                    ],
                    "matchFields": ["metadata.name=h100-a-1"],
                }
            )
        },
        # a number where the list of expressions belongs, beside an empty matchFields list
        {"affinity": required({"matchExpressions": 1, "matchFields": []})},
        {
            "affinity": required(
                {
                    "matchExpressions": [
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-1"]}
                    ],
                    "matchFields": 1,
                }
            )
        },
    ],
    ids=["selector-value-a-list", "expression-a-string", "field-a-string", "expressions-a-number", "fields-a-number"],
)
def test_selections_written_wrong_select_no_node(spec: dict[str, Any]) -> None:
    inv = inventory_mod.build(example_nodes(), default_policy())
    assert chosen(inv, pod(spec)) == []


def test_a_node_name_pin_and_a_node_selector_both_hold() -> None:
    inv = inventory_mod.build(example_nodes(), default_policy())
    spec = {"nodeName": "h100-a-1", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    assert chosen(inv, pod(spec)) == ["h100-a-1"]
    spec["nodeName"] = "l4-ts-1"
    assert chosen(inv, pod(spec)) == []


class Node:
    def __init__(self, name: str, labels: dict[str, str]) -> None:
        self.name = name
        self.labels = labels


def test_an_entry_replaced_by_a_node_of_another_name_moves_its_name() -> None:
    """NodeIndex keys entries by its caller's key, not by node name: a node replaced in its slot by one of
    another name leaves the old name's posting and joins the new one's, as a fresh build would have it."""
    labels = {"kubernetes.io/hostname": "h100-a-1", "topology.kubernetes.io/rack": "rack-a"}
    index = nodeindex.NodeIndex().apply({"entry-1": Node("h100-a-1", labels)}, lambda n: ())
    index = index.apply({"entry-0": Node("h100-a-0", labels)}, lambda n: ())  # incremental from here on
    renamed = index.apply({"entry-1": Node("h100-a-9", labels)}, lambda n: ())
    fresh = nodeindex.NodeIndex().apply(
        {"entry-1": Node("h100-a-9", labels), "entry-0": Node("h100-a-0", labels)}, lambda n: ()
    )
    for name in ("h100-a-1", "h100-a-9", "h100-a-0"):
        got = {n.name for n in renamed.node_list(renamed.label(nodeindex.NAME_KEY, name))}
        want = {n.name for n in fresh.node_list(fresh.label(nodeindex.NAME_KEY, name))}
        assert got == want, name
    assert renamed.label(nodeindex.NAME_KEY, "h100-a-1") == 0


def h100(i: int) -> dict[str, Any]:
    """The example's H100 node as the i-th of a larger zone: 8 nodes a rack."""
    node = copy.deepcopy(next(n for n in example_nodes() if n["metadata"]["name"] == "h100-a-1"))
    name = f"h100-{i:03d}"
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    node["metadata"]["labels"]["topology.kubernetes.io/rack"] = f"rack-{i // 8:02d}"
    return node


def test_nodes_leaving_a_zone_of_many_leave_its_posting() -> None:
    """A label value on 70 nodes is a bitmask posting (SMALL = 64). Nodes removed from it in later batches must
    leave it, whether it stays a bitmask (3 removed) or turns back into a tuple of slots (42 more: 25 left)."""
    policy = default_policy()
    nodes = [h100(i) for i in range(70)]
    inv = inventory_mod.build(nodes, policy)
    zone = pod({"nodeSelector": {"topology.kubernetes.io/zone": "zone-1"}})
    assert len(chosen(inv, zone)) == 70
    inv = inv.apply({f"h100-{i:03d}": None for i in range(3)})
    assert chosen(inv, zone) == [f"h100-{i:03d}" for i in range(3, 70)]
    inv = inv.apply({f"h100-{i:03d}": None for i in range(3, 45)})
    assert chosen(inv, zone) == [f"h100-{i:03d}" for i in range(45, 70)]
    inv = inv.apply({"h100-000": inventory_mod.node_from_object(nodes[0], policy.pools)})
    assert chosen(inv, zone) == ["h100-000", *(f"h100-{i:03d}" for i in range(45, 70))]


def test_a_slot_freed_by_a_delete_is_reused_and_carries_none_of_the_old_labels() -> None:
    """Slots are reused after a delete (the module docstring): a removed node's slot goes to the next node
    added, so the slot table does not grow with churn. The label the removed node alone carried leaves the
    index with it, or the new node in its slot would answer for it."""
    policy = default_policy()
    nodes = example_nodes()
    inv = inventory_mod.build(nodes, policy)
    size = inv.index.size  # the GPU nodes (the CPU node is not indexed)
    assert size == len(inv.index) == 6
    mig_config = pod({"nodeSelector": {"nvidia.com/mig.config": "custom-mixed"}})
    assert chosen(inv, mig_config) == ["a100-mig-1"]
    inv = inv.apply({"a100-mig-1": None})
    assert chosen(inv, mig_config) == []
    inv = inv.apply({"h100-c-1": inventory_mod.node_from_object(h100(16), policy.pools)})
    assert inv.index.size == size
    assert chosen(inv, mig_config) == []
    inv = inv.apply({"h100-c-2": inventory_mod.node_from_object(h100(17), policy.pools)})
    assert inv.index.size == size + 1


def test_an_older_version_keeps_answering_as_it_did() -> None:
    """NodeIndex is immutable: a version a review holds answers the same after the next one is made."""
    policy = default_policy()
    old = inventory_mod.build(example_nodes(), policy)
    rack_b = pod({"nodeSelector": {"topology.kubernetes.io/rack": "rack-b"}})
    new = old.apply({"h100-b-2": None, "h100-c-1": inventory_mod.node_from_object(h100(16), policy.pools)})
    assert chosen(new, rack_b) == ["h100-b-1"]
    assert chosen(old, rack_b) == ["h100-b-1", "h100-b-2"]


def test_postings_under_small_are_tuples_and_larger_ones_bitmasks() -> None:
    """SMALL = 64: a label value on fewer nodes is kept as a tuple of slots (a bitmask of one high slot would
    weigh ~slot/8 bytes), one on 64 or more as a bitmask; a bitmask shrinks back to a tuple only under
    SMALL // 2, so a set hovering at 64 does not convert back and forth."""

    def posting(index: nodeindex.NodeIndex, value: str) -> Any:
        return index.labels["topology.kubernetes.io/zone"].get(value)

    def node(i: int, zone: str) -> Node:
        return Node(f"h100-{i:03d}", {"kubernetes.io/hostname": f"h100-{i:03d}", "topology.kubernetes.io/zone": zone})

    index = nodeindex.NodeIndex().apply(
        {f"h100-{i:03d}": node(i, "zone-1" if i < 64 else "zone-2") for i in range(127)}, lambda n: ()
    )
    assert isinstance(posting(index, "zone-1"), int) and posting(index, "zone-1").bit_count() == 64
    assert posting(index, "zone-2") == tuple(range(64, 127))
    index = index.apply({"h100-127": node(127, "zone-2")}, lambda n: ())  # the tuple reaches 64
    assert isinstance(posting(index, "zone-2"), int) and posting(index, "zone-2").bit_count() == 64
    index = index.apply({f"h100-{i:03d}": None for i in range(32)}, lambda n: ())  # 32 left: still a bitmask
    assert isinstance(posting(index, "zone-1"), int) and posting(index, "zone-1").bit_count() == 32
    index = index.apply({"h100-032": None}, lambda n: ())  # 31 left: a tuple again
    assert posting(index, "zone-1") == tuple(range(33, 64))


def test_a_declared_pool_stands_in_until_a_live_node_joins_it() -> None:
    """A declared pool's stand-in nodes exist exactly while no live node is in the pool: the inventory asks the
    index's slot table whether they are there (Shards.__contains__)."""
    from policies.document import parse_policy_text
    from tests.test_nodeindex import POOLS

    policy = parse_policy_text(POOLS)
    inv = inventory_mod.build(example_nodes(), policy)
    names = sorted(n.name for n in inv.nodes)
    assert [n for n in names if n.startswith("spare")] == ["spare-0", "spare-1"]
    joining = h100(16)
    joining["metadata"]["labels"]["gpu-admission.example/block"] = "block-0001"
    inv = inv.apply({"h100-016": inventory_mod.node_from_object(joining, policy.pools)})
    assert sorted(n.name for n in inv.nodes) == sorted([*(n for n in names if not n.startswith("spare")), "h100-016"])
    inv = inv.apply({"h100-016": None})
    assert sorted(n.name for n in inv.nodes) == names
