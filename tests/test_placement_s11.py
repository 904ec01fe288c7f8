"""`policies.placement`, session 11 (issue #20): the functions session 10's run did not reach — `decide`,
`Grouping.__init__`, `Grouping.at`, `memoize` — what the mutation run showed no test pinned."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from policies import placement
from policies.placement import Capacity, Decision, DomainNodes, Grouping, Reservation, decide

RACK = "topology.kubernetes.io/rack"


def _node(name: str, rack: str | None, gpus: int) -> Any:
    return SimpleNamespace(name=name, labels={RACK: rack} if rack is not None else {}, whole_gpus=gpus)


def test_memoize_keeps_at_most_memo_size_answers_then_starts_afresh() -> None:
    store: dict[Any, Any] = {}
    for i in range(placement.MEMO_SIZE):
        assert placement.memoize(store, i, lambda i=i: i * 2) == i * 2
    assert len(store) == placement.MEMO_SIZE and placement.memoize(store, 3, lambda: "recomputed") == 6
    assert placement.memoize(store, "one more", lambda: "x") == "x"
    assert store == {"one more": "x"}


def test_a_grouping_counts_every_node_with_a_whole_gpu_and_a_domain_and_no_other() -> None:
    """A 1-GPU node is a member; a node with no whole GPU (MIG or shared only), no label or an empty one is not."""
    nodes = [_node("one", "r1", 1), _node("eight", "r1", 8), _node("none", "r2", 0), _node("nolabel", None, 8),
             _node("empty", "", 8)]  # fmt: skip
    g = Grouping(nodes, RACK)
    assert g.members == {"r1": (("one", 1), ("eight", 8))}
    static = g.at(None)
    assert static is g.static and static.allocatable == static.free == {"r1": (1, 8)}
    assert static.node_domain == {"one": "r1", "eight": "r1"} and static.node_gpus == {"one": 1, "eight": 8}
    assert static.free_counts() == {1: 1, 8: 1}


def _snapshot(version: int, used: dict[str, int], changed: frozenset[str] | None = frozenset()) -> Capacity:
    since = None if changed is None else (lambda v: changed)
    return Capacity(used=used, jobs={}, version=version, source=1, changed_since=since)


def test_the_same_snapshot_read_twice_is_the_same_domain_nodes() -> None:
    g = Grouping([_node("a", "r1", 8), _node("b", "r2", 8)], RACK)
    cap = _snapshot(1, {"a": 4})
    first = g.at(cap)
    assert g.at(cap) is first and g.at(_snapshot(1, {"a": 4})) is first  # same view, same version


def test_a_newer_snapshot_that_cannot_say_what_changed_is_counted_afresh() -> None:
    g = Grouping([_node("a", "r1", 8), _node("b", "r2", 8)], RACK)
    g.at(_snapshot(1, {}, changed=None))
    later = g.at(_snapshot(2, {"a": 8, "b": 2}, changed=None))
    assert later.free == {"r1": (0,), "r2": (6,)} and later.free_counts() == {0: 1, 6: 1}


def test_a_grouping_remembers_at_most_steps_kept_generations() -> None:
    g = Grouping([_node("a", "r1", 8)], RACK)
    for v in range(1, placement.STEPS_KEPT + 3):
        g.at(_snapshot(v, {"a": v % 8}, changed=frozenset({"a"})))
    assert len(g._steps) == placement.STEPS_KEPT


def test_a_grouping_asked_without_and_with_a_pod_view_in_turn_answers_each() -> None:
    """The static view (no pod view) is generation 0; a gang's rooms kept from it are rebuilt for a snapshot."""
    g = Grouping([_node("a", "r1", 8), _node("b", "r1", 8), _node("c", "r2", 8)], RACK)
    assert g.at(_snapshot(1, {})).room_index((8, 8)).fitting == [(2, 16, "r1")]
    assert g.at(None).generation == 0 and g.at(None).room_index((8, 8)).fitting == [(2, 16, "r1")]
    index = g.at(_snapshot(2, {"a": 1}, changed=frozenset({"a"}))).room_index((8, 8))
    assert index.fitting == [] and index.rooms["r1"].free_gpus == 15


def test_every_decision_names_its_key_and_its_domains() -> None:
    """The whole Decision of each source: the label key it was made on, and the domains it allows."""
    alloc = {"a": (8, 8), "b": (8, 8, 8)}
    nodes = DomainNodes(alloc, alloc, {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "b3": "b"})
    cap = Capacity(used={}, jobs={})
    peers = Capacity(used={"a1": 8}, jobs={"ns/j=x": {"a1": 1}})
    own = (Reservation("ns/j=x", RACK, "b", (8, 8)),)
    assert decide(nodes, RACK, (8, 8), peers, (), "ns/j=x") == Decision(RACK, placement.PEERS, "a", ("a",))
    assert decide(nodes, RACK, (8, 8), cap, own, "ns/j=x") == Decision(RACK, placement.RESERVED, "b", ("b",))
    assert decide(nodes, RACK, (8,) * 4, cap, (), "ns/j=x") == Decision(RACK, placement.NEVER_FITS, None, ())
    assert decide(nodes, RACK, (8, 8), None, (), "ns/j=x") == Decision(RACK, placement.STATIC, None, ("a", "b"))
    assert decide(nodes, RACK, (8, 8), cap, (), "ns/j=x") == Decision(RACK, placement.BEST_FIT, "a", ("a", "b"))
    busy = DomainNodes(alloc, {"a": (0, 8), "b": (0, 0, 8)}, nodes.node_domain)
    assert decide(busy, RACK, (8, 8), cap, (), "ns/j=x") == Decision(
        RACK, placement.NONE_FITS_NOW, None, ("a", "b"), roomiest="a", closest="a", shortfall=8
    )


def test_the_roomiest_of_domains_others_have_reserved_has_the_most_pieces_then_the_most_free_gpus() -> None:
    """Every rack holds another job's reservation, so the rooms come from after those (decide's `held`)."""
    alloc = {"a": (8, 8, 8), "b": (8, 8, 8)}
    nodes = DomainNodes(alloc, alloc, {})
    cap = Capacity(used={}, jobs={})
    for in_a, in_b in [((8,), (8, 8)), ((4,), (8,))]:  # a: 2 pieces to 1; a: 2 pieces and 20 GPUs to 16
        held = (Reservation("ns/j=o1", RACK, "a", in_a), Reservation("ns/j=o2", RACK, "b", in_b))
        d = decide(nodes, RACK, (8, 8, 8), cap, held, "ns/j=x")
        assert d is not None and (d.source, d.roomiest) == (placement.NONE_FITS_NOW, "a"), (in_a, in_b)
        d = decide(nodes, RACK, (8, 8, 8), cap, held[::-1], "ns/j=x")
        assert d is not None and d.roomiest == "a"
