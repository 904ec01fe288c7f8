"""The server's node inventory fed by a real list + watch (over HTTPS from tests/test_kubeclient's scripted
API server): the first list builds it, events update one node each through the coalescer, and hostile Node
objects are skipped or clipped, counted in /metrics, without touching the other nodes' entries."""

from __future__ import annotations

import copy
import gc
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.coalesce import Coalescer
from cluster.nodes import MAX_LABELS, NodeTransform, record
from policies import inventory as inventory_mod
from policies.document import default_policy, parse_policy_text
from tests.bench import clustergen
from tests.test_kubeclient import KubeTestServer, Recorded, Reply, Stream, api, client_for, event_line, tls_dir  # noqa: F401  (the scripted API server's fixtures)
from webhook import state as state_mod
from webhook.app import ServerConfig, _register_gauges
from webhook.metrics import Metrics
from webhook.state import State

GOOD = [clustergen.node(i, heavy=True) for i in range(0, 48, 3)]  # H100 racks 0-2


def hostile() -> list[dict[str, Any]]:
    many = clustergen.node(100, heavy=True)
    many["metadata"]["name"] = "many-labels"
    many["metadata"]["labels"].update({f"x.example/l{i}": "v" for i in range(100_000)})
    huge = clustergen.node(101, heavy=True)
    huge["metadata"]["name"] = "huge-value"
    huge["metadata"]["labels"]["topology.kubernetes.io/rack"] = "r" * 2**20
    negative = clustergen.node(102, heavy=True)
    negative["metadata"]["name"] = "negative"
    negative["status"]["allocatable"]["nvidia.com/gpu"] = "-8"
    words = clustergen.node(103, heavy=True)
    words["metadata"]["name"] = "words"
    words["status"]["allocatable"]["nvidia.com/gpu"] = "eight"
    words["status"]["capacity"]["nvidia.com/gpu"] = {"not": "a number"}
    nameless = clustergen.node(104)
    del nameless["metadata"]["name"]
    return [many, huge, negative, words, nameless, "not an object"]  # type: ignore[list-item]


def entries(inv: inventory_mod.Inventory, names: list[str]) -> dict[str, Any]:
    by_name = {n.name: n for n in inv.nodes}
    return {name: by_name.get(name) for name in names}


class Script:
    """One list (the good and the hostile nodes), then one watch stream of events, then idle watches."""

    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.events = events
        self.watched = 0

    def __call__(self, r: Recorded) -> Reply | Stream | None:
        if r.path != "/api/v1/nodes":
            return None
        if r.query.get("watch") != "true":
            items = [*GOOD, *hostile()]
            return Reply(200, {"kind": "NodeList", "items": items, "metadata": {"resourceVersion": "10"}})
        self.watched += 1
        if self.watched == 1:
            return Stream([0.2, *(event_line(kind, obj) for kind, obj in self.events)], hold_open=True)
        return Stream([], hold_open=True)


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


def test_watch_builds_then_updates_node_by_node_and_survives_hostile_nodes(
    api: KubeTestServer,  # noqa: F811
    tls_dir: Path,  # noqa: F811
) -> None:
    moved = copy.deepcopy(GOOD[0])
    moved["metadata"]["labels"]["topology.kubernetes.io/rack"] = "rack-00009"
    moved["metadata"]["resourceVersion"] = "11"
    spoiled = copy.deepcopy(GOOD[1])  # an update that makes a good node unacceptable: it leaves the inventory
    spoiled["metadata"]["labels"].update({f"x.example/l{i}": "v" for i in range(MAX_LABELS + 1)})
    spoiled["metadata"]["resourceVersion"] = "12"
    status = copy.deepcopy(GOOD[3])  # a kubelet status update: nothing the inventory reads changes
    status["metadata"]["resourceVersion"] = "13"
    status["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-12-01T20:00:00Z"}]
    events = [("MODIFIED", moved), ("MODIFIED", spoiled), ("MODIFIED", status), ("DELETED", GOOD[2])]
    api.route(Script(events))
    state = State()
    with client_for(api, tls_dir) as client:
        refl = state.watch_nodes(client, interval=0.01)
        try:
            assert refl.wait_synced(20)
            wait_for(lambda: state.status.inventory_synced)
            names = [n["metadata"]["name"] for n in GOOD]
            first = state.snapshot().inventory
            want = inventory_mod.build(copy.deepcopy(GOOD), default_policy())
            assert entries(first, names) == entries(want, names)  # the others are exactly as without the hostile
            assert "many-labels" not in {n.name for n in first.nodes}
            huge = next(n for n in first.nodes if n.name == "huge-value")
            assert "topology.kubernetes.io/rack" not in huge.labels  # dropped, not kept at 1 MiB
            # Cached objects are cut down: no images, conditions or managedFields; GPU resources only.
            cached = refl.get(names[3]).as_object()  # kept as a NodeRecord: the same fields, no nested dicts
            assert cached == {
                "metadata": {k: GOOD[3]["metadata"][k] for k in ("name", "labels", "resourceVersion")},
                "status": {"allocatable": {"nvidia.com/gpu": "8"}},  # capacity is not read when allocatable has GPUs
            }

            wait_for(lambda: names[2] not in {n.name for n in state.snapshot().inventory.nodes})
            after = state.snapshot().inventory
            assert entries(after, [names[3]]) == entries(first, [names[3]])  # its status update was never queued
            assert refl.get(names[3]).version == "13"  # the cache follows it all the same
            assert state.node_events_unchanged == 1
            later = [moved, *copy.deepcopy(GOOD[3:])]
            assert entries(after, names) == {
                **entries(inventory_mod.build(later, default_policy()), names),
                names[1]: None,
                names[2]: None,
            }
            counts = state.node_transform.snapshot()
            assert counts == {
                "too-many-labels": 2,
                "label-too-long": 1,
                "bad-resource": 2,  # negative and words allocatable (capacity is not read after them)
                "no-name": 1,
                "not-an-object": 1,
            }
            metrics = Metrics()
            _register_gauges(metrics, state, None, ServerConfig())
            text = metrics.render()
            assert 'gpu_admission_node_objects_clipped_total{reason="too-many-labels"} 2' in text
            assert "# TYPE gpu_admission_node_objects_clipped_total counter" in text
            sets = len(state.node_transform.label_sets)  # the live nodes' shared label sets (cluster/labelsets.py)
            assert sets > 0 and f"gpu_admission_node_label_sets {sets}\n" in text
            assert "gpu_admission_node_labels_unshared_total 0\n" in text
            assert 'gpu_admission_node_events_total{counter="received"} 4' in text
            assert 'gpu_admission_node_events_total{counter="unchanged"} 1' in text
            assert 'gpu_admission_node_events_total{counter="applied"} 3' in text
        finally:
            state.stop()


def test_the_collector_stays_off_through_the_first_lists_build_and_is_back_on_after(
    api: KubeTestServer,  # noqa: F811
    tls_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On before the build, its first automatic collection scanned every object the list had made, beside the
    build's own collect (a second full pass over 50,000 nodes' objects)."""
    api.route(Script([]))
    seen: list[bool] = []
    real = state_mod._frozen
    monkeypatch.setattr(state_mod, "_frozen", lambda *a, **k: seen.append(gc.isenabled()) or real(*a, **k))
    state = State()
    assert gc.isenabled()
    with client_for(api, tls_dir) as client:
        state.watch_nodes(client, interval=0.01)
        try:
            wait_for(lambda: state.status.inventory_synced)
            assert seen == [False] and gc.isenabled()
        finally:
            state.stop()


def test_coalescer_keeps_the_latest_change_per_key_and_paces_batches() -> None:
    batches: list[dict[str, Any]] = []
    c = Coalescer(batches.append, interval=0.2).start()
    try:
        c.put("a", 1)
        assert c.wait_idle(5)
        started = time.monotonic()
        for i in range(100):
            c.put("b", i)
            c.put("a", None)
        assert c.wait_idle(5)
        assert time.monotonic() - started >= 0.15  # the second batch waited for the interval
        assert batches == [{"a": 1}, {"b": 99, "a": None}]
        assert (c.received, c.applied, c.batches) == (201, 3, 2)
    finally:
        c.stop()


def test_transform_keeps_what_the_inventory_reads() -> None:
    t = NodeTransform()
    heavy = clustergen.node(5, heavy=True)
    heavy["spec"]["taints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    heavy["spec"]["unschedulable"] = True
    slim = t(heavy)
    assert slim is not None
    assert slim["metadata"] == {
        "name": heavy["metadata"]["name"],
        "labels": heavy["metadata"]["labels"],
        "resourceVersion": heavy["metadata"]["resourceVersion"],
    }
    assert slim["spec"] == {"taints": heavy["spec"]["taints"], "unschedulable": True}
    gpus = {"nvidia.com/gpu": "8"}
    assert heavy["status"]["allocatable"] != gpus  # cpu, memory and pods are dropped
    assert slim["status"] == {"allocatable": gpus}
    assert inventory_mod.node_from_object(slim) == inventory_mod.node_from_object(heavy)
    assert t.snapshot() == {}
    for hostile_node in hostile()[1:4]:  # what the inventory makes of a clipped node is what it made of it whole
        assert inventory_mod.node_from_object(t(hostile_node)) == inventory_mod.node_from_object(hostile_node) or (
            hostile_node["metadata"]["name"] == "huge-value"
        )


def test_nodes_read_while_the_list_arrives_are_reused_only_for_the_same_object_and_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transform = NodeTransform()
    objs = {n["metadata"]["name"]: record(transform(copy.deepcopy(n))) for n in GOOD[:4]}
    names = list(objs)
    policy = default_policy()
    early = state_mod._EarlyNodes()
    for obj in objs.values():
        early.read(obj, policy, {}, None)
    reads: list[str] = []
    real = state_mod._read_node
    monkeypatch.setattr(state_mod, "_read_node", lambda obj, *a: reads.append(obj.name) or real(obj, *a))

    inv = early.build(objs, policy, {}, None)
    plain = [o.as_object() for o in objs.values()]
    assert reads == [] and entries(inv, names) == entries(inventory_mod.build(plain, policy), names)

    newer = copy.deepcopy(objs[names[0]].as_object())  # a relist brought a newer object: read again
    labels = newer["metadata"]["labels"]  # the cached labels are read-only (shared: cluster/labelsets.py)
    newer["metadata"]["labels"] = {**labels, "topology.kubernetes.io/rack": "rack-00009"}
    relabelled = record(newer)
    inv = early.build({**objs, names[0]: relabelled}, policy, {}, None)
    assert reads == [names[0]] and entries(inv, names[:1])[names[0]].rack == "rack-00009"

    pooled = parse_policy_text(SPARE_POOL)  # the policy changed while listing: every node read again
    reads.clear()
    inv = early.build(objs, pooled, {}, None)
    assert sorted(reads) == sorted(names) and {n.pool for n in inv.nodes if not n.declared} == {"spare"}


SPARE_POOL = """
apiVersion: gpu-admission.io/v1alpha1
kind: Policy
pools:
  - name: spare
    nodeSelector: {nvidia.com/gpu.present: "true"}
    product: NVIDIA-H100-80GB-HBM3
    gpusPerNode: 8
    nodes: 1
"""
