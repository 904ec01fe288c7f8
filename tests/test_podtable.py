"""The pod view by column (cluster/podtable.py, cluster/interned.py) and as the pod Reflector's store: equal to
a plain dict of PodEntries under random puts and removes, and — the server's path, events and relists through
a Reflector whose store is the view — to a naive model of what the view means (a dict of each pod's entry,
the counts recomputed from it), with garbage, odd keys and odd resourceVersions; and a bound on the bytes a
GPU pod costs (tracemalloc, not time)."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import pods as pods_mod
from cluster.interned import Interned
from cluster.pods import PodView
from cluster.podtable import PodEntry, PodTable, join_key, split_key
from cluster.reflector import Change, Reflector
from policies.ledger import pod_note
from policies.subject import pod_facts
from webhook.state import _entry_key, _entry_version

# Keys of every shape split_key meets: plain pod names, a tail of exactly 8 and of 9 characters, several
# dashes, none, a trailing dash, non-ASCII and NUL in the tail, the empty key.
KEYS = [
    "ml/train-000001-worker-3",
    "ml/train-000001-worker-4",
    "ml/web-7d9f8b6c5-x2k4q",
    "ml/a-12345678",
    "ml/a-123456789",
    "ml/nodash",
    "ml/ends-",
    "ml/x-é",
    "ml/x-\0",
    "other/train-000001-worker-3",
    "",
    "-",
    "--",
]
ENTRIES = st.builds(
    PodEntry,
    st.sampled_from(["", "n1", "n2", "n3"]),
    st.sampled_from([(), (("nvidia.com/gpu", 1),), (("nvidia.com/gpu", 8),), (("nvidia.com/mig-1g.10gb", 2),)]),
    st.sampled_from([None, "ml/j1", "ml/j2"]),
    st.sampled_from(["", "Running", "Pending", "Succeeded"]),
    st.sampled_from(KEYS),
    st.sampled_from([None, "0", "1", "42", "007", "abc", "123456789012345678", "1234567890123456789", "-1"]),
    st.sampled_from([None, ("note", 1), ("note", 2)]),
)


@pytest.mark.parametrize("key", KEYS)
def test_a_key_comes_back_from_its_head_and_tail(key: str) -> None:
    assert join_key(*split_key(key)) == key


def test_the_pods_of_a_controller_share_their_head() -> None:
    assert split_key("ml/train-000001-worker-3")[0] == split_key("ml/train-000001-worker-7")[0] == "ml/train-000001"
    assert split_key("ml/web-7d9f8b6c5-x2k4q")[0] == "ml/web-7d9f8b6c5"
    assert split_key("ml/nodash") == ("ml/nodash", -1)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.sampled_from(KEYS), ENTRIES), max_size=80))
def test_the_table_equals_a_dict_of_entries(ops: list[tuple[bool, str, PodEntry]]) -> None:
    table, plain = PodTable(), {}
    for put, key, e in ops:
        if put:
            assert table.put(key, e) == plain.get(key)
            plain[key] = replace(e, note=None)  # the note rides the change; the table keeps none
        else:
            assert table.pop(key) == plain.pop(key, None)
        assert len(table) == len(plain)
        assert table.get(key) == plain.get(key)
    assert table.entries() == plain and sorted(table.keys()) == sorted(plain)
    assert all(table.get(k) == plain.get(k) and (k in table) == (k in plain) for k in KEYS)
    # The interned tables hold exactly the values in use: a value no pod references any more is forgotten.
    assert len(table.nodes) == len({e.node for e in plain.values()})
    assert len(table.jobs) == len({e.job for e in plain.values() if e.job is not None})
    assert len(table.heads) == len({split_key(k)[0] for k in plain})


def test_the_same_objects_come_back_and_slots_are_reused() -> None:
    table = PodTable()
    gpus, note = (("nvidia.com/gpu", 8),), ("shared", "note")
    table.put("ml/a-1", PodEntry("n1", gpus, "ml/j", "Running", "ml/a-1", "5", note))
    e = table.get("ml/a-1")
    assert e is not None and e.gpus is gpus and e.version == "5" and e.note is None  # the note is not kept
    for i in range(1000):
        table.put(f"ml/b-{i}", PodEntry("n1", gpus, None, "Running", f"ml/b-{i}", str(i)))
    width = len(table._head)
    for i in range(1000):
        assert table.pop(f"ml/b-{i}") is not None
    for i in range(1000):
        table.put(f"ml/c-{i}", PodEntry("n2", gpus, None, "Running", f"ml/c-{i}", str(i)))
    assert len(table._head) == width  # the deleted pods' slots were reused
    assert len(table) == 1001 and table.get("ml/b-3") is None and table.get("ml/c-3") is not None
    for i in range(1000):
        table.pop(f"ml/c-{i}")
    assert len(table._index._buckets) <= 16  # the index shrank back with the pods


def test_interned_ids_are_counted_and_reused() -> None:
    names: Interned[str] = Interned()
    a, b = names.acquire("a"), names.acquire("b")
    assert names.acquire("a") == a and len(names) == 2
    names.release(a)
    assert names.find("a") == a  # one reference left
    names.release(a)
    assert names.find("a") == -1 and len(names) == 1
    assert names.acquire("c") == a and names.value(b) == "b"  # the freed id is reused


# -- the view as the pod Reflector's store, against a naive model -------------------------------------------------

NAMES = ["w-0", "w-1", "w-2", "w-3", "solo", "x-123456789"]
POD = st.fixed_dictionaries(
    {
        "name": st.sampled_from(NAMES),
        "node": st.sampled_from(["", "n1", "n2"]),
        "gpus": st.sampled_from([0, 1, 8]),
        "claims": st.booleans(),
        "job": st.sampled_from([None, "j1", "j2"]),
        "phase": st.sampled_from(["Running", "Pending", "Succeeded", "Failed"]),
        "rv": st.sampled_from(["1", "2", "10", "007", "v9", None]),
        "garbage": st.integers(0, 9),
    }
)
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), POD),
        st.tuples(st.just("LIST"), st.lists(POD, max_size=6)),
    ),
    max_size=25,
)


def pod_object(p: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": p["name"], "namespace": "ml"}
    if p["rv"] is not None:
        meta["resourceVersion"] = p["rv"]
    if p["job"]:
        meta["labels"] = {"batch.kubernetes.io/job-name": p["job"]}
    if p["garbage"] == 0:
        return {"metadata": meta, "spec": "garbage"}
    spec: dict[str, Any] = {"nodeName": p["node"], "containers": [{"name": "c"}]}
    if p["gpus"]:
        spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": p["gpus"]}}
    if p["claims"]:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c"}]
    return {"metadata": meta, "spec": spec, "status": {"phase": p["phase"]}}


class ListingClient:
    """What Reflector._list asks of a client: one list, its items through the transform, as list_all does."""

    closed = False

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.returned: list[int] = []  # items list_all handed back, per list

    def list_all(self, path: str, *, transform: Callable[[Any], Any], **_: Any) -> dict[str, Any]:
        items = [t for t in map(transform, self.items) if t]
        self.returned.append(len(items))
        return {"metadata": {"resourceVersion": "99"}, "items": items}


class Model:
    """The meaning of the view: each pod's entry (the Reflector's semantics: garbage forgets the key), and the
    counts recomputed from them; the changes a listener should hear, and the jobs that start holding."""

    def __init__(self) -> None:
        self.entries: dict[str, PodEntry] = {}
        self.skipped = 0
        self.heard: list[tuple[str, str, PodEntry | None, PodEntry | None]] = []
        self.bound: list[str] = []

    def read(self, obj: dict[str, Any]) -> PodEntry | None:
        try:
            return pods_mod.entry(obj, pod_facts, pod_note)
        except (ValueError, TypeError, AttributeError):
            self.skipped += 1
            return None

    def set(self, key: str, new: PodEntry | None, kind: str | None = None) -> None:
        old = self.entries.pop(key, None)
        if new is not None:
            self.entries[key] = replace(new, note=None)  # the cache keeps no note; the change heard has it
            if new.job and new.holding and (old is None or not old.holding):
                self.bound.append(new.job)
        if kind is not None:
            self.heard.append((kind, key, old, new))

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        key = f"ml/{obj['metadata']['name']}"
        old = self.entries.get(key)
        if kind == "DELETED":  # heard even when not kept (a pod without GPUs), with the watch's object
            self.entries.pop(key, None)
            self.heard.append(("DELETED", key, old if old is not None else obj, None))  # type: ignore[arg-type]
            return
        new = self.read(obj)
        if new is not None:
            self.set(key, new, "ADDED" if old is None else "MODIFIED")
        elif old is not None:  # garbage or no GPU any more: forgotten
            self.set(key, None, "DELETED")

    def relist(self, objs: list[dict[str, Any]]) -> None:
        if not self.entries:  # into an empty store the Reflector streams the list: item by item, nothing gone
            for obj in objs:
                e = self.read(obj)
                old = self.entries.get(e.key) if e is not None else None
                if e is not None and (old is None or self.differs(old, e)):
                    self.set(e.key, e, "ADDED" if old is None else "MODIFIED")
            return
        fresh: dict[str, PodEntry] = {}
        for obj in objs:
            e = self.read(obj)
            if e is not None:
                fresh[e.key] = e
        for key, e in fresh.items():
            old = self.entries.get(key)
            if old is None:
                self.set(key, e, "ADDED")
            elif self.differs(old, e):
                self.set(key, e, "MODIFIED")
        for key in [k for k in self.entries if k not in fresh]:
            self.set(key, None, "DELETED")

    @staticmethod
    def differs(old: PodEntry, new: PodEntry) -> bool:
        return old.version != new.version if old.version and new.version else old != new

    def used(self) -> dict[str, dict[str, int]]:
        out: dict[str, Counter[str]] = {}
        for e in self.entries.values():
            if e.holding:
                for resource, n in e.gpus:
                    out.setdefault(e.node, Counter())[resource] += n
        return {node: dict(c) for node, c in out.items()}

    def jobs(self) -> dict[str, dict[str, int]]:
        out: dict[str, Counter[str]] = {}
        for e in self.entries.values():
            if e.holding and e.job is not None:
                out.setdefault(e.job, Counter())[e.node] += 1
        return {job: dict(c) for job, c in out.items()}


@settings(max_examples=200, deadline=None)
@given(events=EVENTS)
def test_the_view_as_the_reflectors_store_equals_the_naive_model(events: list[tuple[str, Any]]) -> None:
    bound: list[str] = []
    heard: list[Change] = []
    view = PodView(pod_facts, on_bound=bound.append, note=pod_note)
    client = ListingClient()
    refl = Reflector(client, "/api/v1/pods", on_change=heard.append, transform=view.transform,  # type: ignore[arg-type]
                     key_of=_entry_key, version_of=_entry_version, store=view)  # fmt: skip
    model = Model()
    for kind, what in events:
        before = view.snapshot()
        if kind == "LIST":
            client.items = [pod_object(p) for p in what]
            refl._list()
            model.relist(client.items)
        else:
            obj = pod_object(what)
            refl._apply({"type": kind, "object": obj})
            model.event(kind, obj)
        snap = view.snapshot()
        assert view.entries() == refl.snapshot() == model.entries
        assert len(refl) == len(view) == snap.pods == len(model.entries)
        assert all(view.get(f"ml/{n}") == model.entries.get(f"ml/{n}") for n in NAMES)
        assert {n: dict(u) for n, u in snap.used.items()} == model.used()
        assert dict(snap.used_of("nvidia.com/gpu")) == {
            n: u["nvidia.com/gpu"] for n, u in model.used().items() if "nvidia.com/gpu" in u
        }
        assert {j: dict(c) for j, c in snap.jobs.items()} == model.jobs()
        assert snap.skipped == model.skipped
        moved = {n for n in set(before.used) | set(snap.used) if before.used.get(n) != snap.used.get(n)}
        assert snap.changed_since is not None
        assert moved <= (snap.changed_since(before.version) or set())
    assert bound == model.bound
    changes = [(c.type, c.key, c.old, c.new) for c in heard if c.type != "SYNCED"]
    assert sorted(changes, key=lambda c: (c[0], c[1])) == sorted(model.heard, key=lambda c: (c[0], c[1]))
    assert view.synced == any(kind == "LIST" for kind, _ in events)


def test_a_first_list_into_the_store_holds_no_list_of_entries() -> None:
    """Into the empty view each listed pod goes as its page is read: list_all hands back no items to hold; a
    relist (the store not empty) is compared whole, and a pod gone from it is deleted."""
    view, client = PodView(pod_facts), ListingClient()
    refl = Reflector(client, "/api/v1/pods", transform=view.transform, key_of=_entry_key,  # type: ignore[arg-type]
                     version_of=_entry_version, store=view)  # fmt: skip
    pods = [{"name": f"w-{i}", "node": "n1", "gpus": 1, "claims": False, "job": "j1", "phase": "Running",
             "rv": str(i + 1), "garbage": 1} for i in range(3)]  # fmt: skip
    client.items = [pod_object(p) for p in pods]
    refl._list()
    assert client.returned == [0] and len(view) == 3 and refl.synced
    client.items = client.items[:2]
    refl._list()
    assert client.returned == [0, 2] and sorted(view) == ["ml/w-0", "ml/w-1"]
    assert view.snapshot().used_of("nvidia.com/gpu") == {"n1": 2}


# -- memory ------------------------------------------------------------------------------------------------------

BYTES_PER_POD = 120  # 8-pod jobs bound over up to 3 seconds (fakeapi's pods), with the ledger's notes or not


def _room_in_the_interned_table() -> None:
    """Make the interpreter's table of interned strings resize now, so that it has room for as many more
    strings as it holds. The view interns its nodes, jobs and phases, and the ledger's note its groups and
    uids: when the table's room runs out during a measurement, its whole new table (1.9 MB here alone, 3.8 MB
    after the golden suite) lands in the figure. When that happens depends on how many strings earlier tests
    left interned, not on the view. The table grows to at least 3x the strings it holds and fills to 2/3 of
    that; a measurement interns a few thousand strings, against the tens of thousands any process holds.

    The resize is found as the one call of sys.intern that allocates (a fresh string is only inserted; the
    old table is not traced, so the new one shows whole)."""
    tracemalloc.start()
    try:
        for i in range(10_000_000):
            fresh = f"room-in-the-interned-table-{i}"
            before = tracemalloc.get_traced_memory()[0]
            sys.intern(fresh)
            if tracemalloc.get_traced_memory()[0] - before > 4096:  # a table, not the int `before`
                return
    finally:
        tracemalloc.stop()
    raise AssertionError("sys.intern never resized its table")


@pytest.mark.parametrize("with_note", [True, False])
def test_a_gpu_pod_costs_the_view_at_most_its_stated_bytes(with_note: bool) -> None:
    """GPU pods of the scale benchmark's shape (1 GPU each, 8 to a job, spread over 2,000 nodes) applied as the
    pod Reflector does: the bytes that stay allocated per pod between 10,000 and 40,000 pods (what grows with
    the pods, not the fixed costs), everything the view keeps counted by tracemalloc (columns, index, interned
    values, counts per node and job); the ledger's notes cost nothing (the view keeps none). The interpreter's
    table of interned strings is given room first (`_room_in_the_interned_table`): its entries for the view's
    job names (~5 B a pod) are not counted, and the figure no longer depends on the tests run before."""
    from tests.bench.fakeapi import Cluster

    small, large = 10_000, 40_000
    fake = Cluster(2000, pods=large)
    view = PodView(pod_facts, note=pod_note if with_note else None)

    def fill(start: int, end: int) -> int:
        for i in range(start, end):
            e = view.transform(fake.pod(i))
            assert e is not None
            view.apply(Change("ADDED", e.key, None, e))
        assert view.snapshot().pods == end
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    gc.collect()
    _room_in_the_interned_table()
    tracemalloc.start()
    try:
        at_small = fill(0, small)
        per_pod = (fill(small, large) - at_small) / (large - small)
    finally:
        tracemalloc.stop()
    assert per_pod <= BYTES_PER_POD, f"{per_pod:.0f} bytes per GPU pod"
