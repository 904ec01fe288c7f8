"""cluster/labelsets: a node's labels as a shared set + its hostname read exactly like the plain dict they
replace (items and their order, equality both ways, `in`, `get`, views), the shared sets of nodes nobody
holds any more drop out of the cache, past the bound a node keeps its plain dict; and the inventory, its
index, node selectors and affinity answer the same over them as over plain dicts."""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.labelsets import HOSTNAME, LabelSets, NodeLabels
from cluster.nodes import NodeTransform, as_object, record, same_content
from policies import inventory as inventory_mod
from policies.document import default_policy, parse_policy_text
from policies.selectors import node_selection, selection_filter
from tests.bench import clustergen
from tests.test_nodeindex import random_node, random_selection, relabel, summary
from webhook import state as state_mod

KEYS = st.sampled_from(["a", "b", "zone", "nvidia.com/gpu.product", "topology.kubernetes.io/rack", "x/y", ""])
VALUES = st.sampled_from(["", "1", "v", "node-1", "node-2", HOSTNAME])
LABELS = st.dictionaries(KEYS, VALUES, max_size=6)


@st.composite
def with_host(draw: Any) -> dict[str, str]:
    """A label dict with the hostname label at any position."""
    items = list(draw(LABELS).items())
    items.insert(draw(st.integers(0, len(items))), (HOSTNAME, draw(st.sampled_from(["node-1", "node-2", "x"]))))
    return dict(items)


def shared(labels: dict[str, str], sets: LabelSets | None = None) -> Mapping[str, str]:
    out = (sets if sets is not None else LabelSets()).share(dict(labels))
    assert isinstance(out, NodeLabels)
    return out


@given(with_host(), st.lists(KEYS | st.just(HOSTNAME) | st.just("absent"), max_size=5))
def test_node_labels_read_like_the_dict(d: dict[str, str], probes: list[str]) -> None:
    m = shared(d)
    assert list(m) == list(d) and list(m.keys()) == list(d.keys())
    assert list(m.items()) == list(d.items()) and list(m.values()) == list(d.values())
    assert len(m) == len(d) and len(m.items()) == len(d) and dict(m) == d and list({**m}) == list(d)
    assert repr(m) == repr(d) and str(m) == str(d)
    assert copy.deepcopy(m) == d and list(copy.deepcopy(m).items()) == list(d.items())
    for k in [*d, *probes]:
        assert (k in m) is (k in d) and (k in m.keys()) is (k in d.keys())  # noqa: SIM118 - the views
        assert m.get(k) == d.get(k) and m.get(k, "dflt") == d.get(k, "dflt")
        assert ((k, d.get(k)) in m.items()) is ((k, d.get(k)) in d.items())
        if k in d:
            assert m[k] == d[k]
        else:
            with pytest.raises(KeyError):
                m[k]
    assert ("a", "nope") not in m.items() or d.get("a") == "nope"
    assert set(m.values()) == set(d.values()) and ("v" in m.values()) is ("v" in d.values())
    for unhashable in ([], {}):
        with pytest.raises(TypeError):
            unhashable in m  # noqa: B015 - a dict raises too
    with pytest.raises(TypeError):
        hash(m)


@given(with_host(), with_host())
def test_equality_and_set_operations_as_between_dicts(d: dict[str, str], e: dict[str, str]) -> None:
    sets = LabelSets()
    m, n = shared(d, sets), shared(e, sets)
    for left, right in ((m, n), (m, e), (d, n)):
        assert (left == right) is (d == e) and (left != right) is (d != e)
    assert m == d and d == m and not (m != d) and not (d != m)  # noqa: SIM202 - __ne__ too
    assert m != [*d.items()] and m != None  # noqa: E711 - == None goes through __eq__
    assert m == shared(d) and shared(d) == m  # two caches, two bases: compared by content
    assert m.items() - n.items() == d.items() - e.items() and n.items() - m.items() == e.items() - d.items()
    assert m.items() & e.items() == d.items() & e.items() and m.keys() | n.keys() == d.keys() | e.keys()
    assert (m.items() == n.items()) is (d.items() == e.items())


@given(with_host(), st.sampled_from(["node-1", "node-2", "node-3"]))
def test_nodes_differing_only_by_hostname_share_one_set(d: dict[str, str], other: str) -> None:
    sets = LabelSets()
    m, n = shared(d, sets), shared({**d, HOSTNAME: other}, sets)
    assert m._base is n._base and len(sets) == 1 and n[HOSTNAME] == other
    assert (m == n) is (d[HOSTNAME] == other)


def test_the_hostname_position_is_part_of_the_set() -> None:
    sets = LabelSets()
    first, last = shared({HOSTNAME: "n1", "a": "1"}, sets), shared({"a": "1", HOSTNAME: "n1"}, sets)
    assert first._base is not last._base and list(first) == [HOSTNAME, "a"] and list(last) == ["a", HOSTNAME]
    assert first == last  # as two dicts with the same items in another order


def test_labels_without_a_hostname_stay_the_plain_dict() -> None:
    sets, d = LabelSets(), {"a": "1"}
    assert sets.share(d) is d and len(sets) == 0 and sets.unshared == 0


def test_a_set_no_node_holds_is_dropped() -> None:
    sets = LabelSets()
    m = shared({"a": "1", HOSTNAME: "n1"}, sets)
    n = shared({"a": "1", HOSTNAME: "n2"}, sets)
    del m
    assert len(sets) == 1  # n still holds it
    del n
    assert len(sets) == 0  # freed with its last node (no cycle: no collection needed)


def test_past_the_bound_a_node_keeps_its_plain_dict_counted_and_shares_again_once_room() -> None:
    sets = LabelSets(limit=2)
    held = [shared({"a": str(i), HOSTNAME: "n"}, sets) for i in range(2)]
    d = {"a": "9", HOSTNAME: "n"}
    assert sets.share(d) is d and sets.unshared == 1 and len(sets) == 2
    assert isinstance(sets.share({"a": "0", HOSTNAME: "m"}), NodeLabels)  # a cached set is still shared
    held.pop()
    assert isinstance(sets.share(dict(d)), NodeLabels) and sets.unshared == 1


def test_a_relabelled_node_moves_to_another_set_and_the_old_one_goes() -> None:
    transform = NodeTransform()
    nodes = [clustergen.node(i, heavy=True) for i in range(3)]  # one rack: one set
    records = {n["metadata"]["name"]: record(transform(n)) for n in nodes}
    assert len(transform.label_sets) == 1
    moved = copy.deepcopy(nodes[0])
    moved["metadata"]["labels"]["gpu-admission.example/health"] = "degraded"
    new = record(transform(moved))
    assert new is not None and len(transform.label_sets) == 2
    old = records[moved["metadata"]["name"]]
    assert old is not None and not same_content(old, new)
    assert new.labels["gpu-admission.example/health"] == "degraded" and new.labels[HOSTNAME] == old.labels[HOSTNAME]
    records[moved["metadata"]["name"]] = new
    del old
    assert len(transform.label_sets) == 2  # the rest of the rack still holds the old set
    for node in nodes[1:]:  # the rest of the rack relabelled too: the old set has no node left
        node["metadata"]["labels"]["gpu-admission.example/health"] = "degraded"
        records[node["metadata"]["name"]] = record(transform(node))
    assert len(transform.label_sets) == 1  # freed at once: no cycle, no collection needed
    del records, new
    assert len(transform.label_sets) == 0


def test_the_transform_keeps_a_heavy_nodes_labels_and_shares_a_racks_set() -> None:
    transform = NodeTransform()
    raws = [clustergen.node(i, heavy=True) for i in range(16 * 16)]
    slims = [transform(copy.deepcopy(n)) for n in raws]
    for raw, slim in zip(raws, slims, strict=True):
        assert slim is not None and slim["metadata"]["labels"] == raw["metadata"]["labels"]
        assert list(slim["metadata"]["labels"].items()) == list(raw["metadata"]["labels"].items())
    assert len(transform.label_sets) <= 16 and transform.label_sets.unshared == 0  # 16 racks


def plain(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with its labels a plain dict again (what main's transform gave)."""
    return {**obj, "metadata": {**obj["metadata"], "labels": dict(obj["metadata"]["labels"])}}


@pytest.mark.parametrize("seed", range(10))
def test_the_index_and_the_node_filter_select_the_same_nodes_as_over_plain_dicts(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(rng.randint(1, 120))]
    raws = [random_node(rng, n) for n in names]
    transform = NodeTransform()
    slims = [transform(r) for r in raws]
    assert any(isinstance(s["metadata"]["labels"], NodeLabels) for s in slims if s is not None)
    inv = inventory_mod.build([s for s in slims if s is not None], default_policy())
    ref = inventory_mod.build([plain(s) for s in slims if s is not None], default_policy())
    assert summary(inv) == summary(ref)
    labels = {n.name: dict(n.labels) for n in ref.nodes}
    for _ in range(60):
        pod = random_selection(rng, names)
        allowed = selection_filter(node_selection(pod))
        want = sorted(n for n, lab in labels.items() if allowed(lab, n))
        assert sorted(n.name for n in inv.candidates(pod)) == want, pod
        assert sorted(n.name for n in inv.nodes if allowed(n.labels, n.name)) == want, pod


@pytest.mark.parametrize("seed", range(4))
def test_batches_of_transformed_node_changes_equal_a_fresh_build_from_plain_dicts(seed: int) -> None:
    rng = random.Random(seed)
    policy = default_policy()
    transform = NodeTransform()
    live: dict[str, dict[str, Any]] = {}
    inv = inventory_mod.build([], policy)
    for step in range(20):
        changes: dict[str, inventory_mod.GpuNode | None] = {}
        for _ in range(rng.randint(1, 12)):
            obj = clustergen.node(rng.randrange(300), generation=step)
            name = obj["metadata"]["name"]
            if rng.random() < 0.25:
                live.pop(name, None)
                changes[name] = None
                continue
            if rng.random() < 0.6:
                relabel(rng, obj["metadata"]["labels"])
            slim = transform(obj)
            assert slim is not None
            live[name] = slim
            changes[name] = inventory_mod.node_from_object(as_object(record(slim)), policy.pools)  # type: ignore[arg-type]
        inv = inv.apply(changes)
        assert summary(inv) == summary(inventory_mod.build([plain(o) for o in live.values()], policy)), step


HOST_POOL = """
apiVersion: gpu-admission.io/v1alpha1
kind: Policy
pools:
  - name: one-host
    nodeSelector: {kubernetes.io/hostname: h100-r00001-01}
    product: NVIDIA-H100-80GB-HBM3
    gpusPerNode: 8
    nodes: 1
"""


@pytest.mark.parametrize("policy_text", ["", HOST_POOL], ids=["no-pools", "hostname-pool"])
def test_a_racks_nodes_read_once_give_the_entries_each_read_alone_gives(policy_text: str) -> None:
    """webhook/state._EarlyNodes reads the nodes that share a label set and a status once (renamed for the
    others): every entry equals node_from_object's of that node, MIG, shared, CPU racks and relabels included."""
    rng = random.Random(5)
    policy = parse_policy_text(policy_text) if policy_text else default_policy()
    transform = NodeTransform()
    raws = [clustergen.node(i, heavy=True) for i in range(16 * 20)]
    for raw in rng.sample(raws, 40):
        relabel(rng, raw["metadata"]["labels"])
    records = [r for r in (record(transform(raw)) for raw in raws) if r is not None]
    early = state_mod._EarlyNodes()
    for rec in records:
        early.read(rec, policy, {}, None)
    want = {r.name: inventory_mod.node_from_object(plain(r.as_object()), policy.pools) for r in records}
    assert {name: entry[2] for name, entry in early.entries.items()} == want
    assert sum(n is not None for n in want.values()) > 200 and any(n is None for n in want.values())
    if policy_text:
        assert want["h100-r00001-01"] is not None and want["h100-r00001-01"].pool == "one-host"
    assert len(early._alike) < len(records) // 4 or policy_text  # read once per rack, not per node


def test_the_inventory_keeps_string_labels_as_they_are_and_turns_others_into_strings() -> None:
    """policies.inventory._labels: a node's labels shared with its object (a dict or a NodeLabels, not
    copied: 50,000 nodes need not hold two); labels of other types written as strings; no labels otherwise."""
    gpu = {"allocatable": {"nvidia.com/gpu": "8"}}
    plain_labels = {"nvidia.com/gpu.present": "true", HOSTNAME: "n1"}
    node = inventory_mod.node_from_object({"metadata": {"name": "n1", "labels": plain_labels}, "status": gpu})
    assert node is not None and node.labels is plain_labels
    slim = NodeTransform()({"metadata": {"name": "n1", "labels": dict(plain_labels)}, "status": gpu})
    assert slim is not None and isinstance(slim["metadata"]["labels"], NodeLabels)
    node = inventory_mod.node_from_object(slim)
    assert node is not None and node.labels is slim["metadata"]["labels"]
    odd = {"nvidia.com/gpu.present": "true", 7: "v", "x": 1, "y": None}
    node = inventory_mod.node_from_object({"metadata": {"name": "n2", "labels": odd}, "status": gpu})
    assert node is not None
    assert list(node.labels.items()) == [("nvidia.com/gpu.present", "true"), ("7", "v"), ("x", "1"), ("y", "None")]
    for meta in ("garbage", ["a"], None, {"labels": "garbage"}):
        node = inventory_mod.node_from_object({"metadata": meta, "status": gpu})
        assert node is not None and dict(node.labels) == {} and node.whole_gpus == 8
