"""The indexed inventory against the plain definitions: selections evaluated over label postings give the
nodes a node-by-node filter gives, and an inventory updated one batch of node changes at a time equals one
built from scratch from the same nodes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from policies import inventory as inventory_mod
from policies import nodeindex
from policies.document import default_policy, parse_policy_text
from policies.selectors import node_selection, selection_filter
from tests.bench import clustergen

KEYS = ["zone", "rack", "pool", "nvidia.com/gpu.replicas", "kubernetes.io/hostname", "odd"]
VALUES = ["a", "b", "c", "1", "4", "12", "", " 7", "x-1"]
OPS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Bogus"]


def random_node(rng: random.Random, name: str) -> dict[str, Any]:
    labels = {k: rng.choice(VALUES) for k in KEYS if rng.random() < 0.6}
    labels["nvidia.com/gpu.present"] = "true"
    if rng.random() < 0.8:
        labels["kubernetes.io/hostname"] = name
    gpus = {"nvidia.com/gpu": str(rng.choice([1, 4, 8]))} if rng.random() < 0.9 else {}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": gpus}}


def random_expr(rng: random.Random, key_space: list[Any]) -> dict[str, Any]:
    expr: dict[str, Any] = {"key": rng.choice(key_space), "operator": rng.choice(OPS)}
    if rng.random() < 0.9:
        pool: list[Any] = [*VALUES, 4, None]
        expr["values"] = rng.sample(pool, rng.randint(0, 3))
    return expr


def random_selection(rng: random.Random, names: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if rng.random() < 0.2:
        spec["nodeName"] = rng.choice([*names[:3], "nope", ""])
    if rng.random() < 0.4:
        spec["nodeSelector"] = {rng.choice(KEYS): rng.choice([*VALUES, None, 4]) for _ in range(rng.randint(1, 2))}
    if rng.random() < 0.7:
        terms = []
        for _ in range(rng.randint(0, 3)):
            term: dict[str, Any] = {}
            if rng.random() < 0.9:
                term["matchExpressions"] = [random_expr(rng, [*KEYS, 7]) for _ in range(rng.randint(0, 3))]
            if rng.random() < 0.3:
                field = random_expr(rng, ["metadata.name", "metadata.uid"])
                if field["key"] == "metadata.name" and rng.random() < 0.5:
                    field["values"] = rng.sample(names, min(2, len(names)))
                term["matchFields"] = [field]
            terms.append(term if rng.random() < 0.95 else "not a term")
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec}


@pytest.mark.parametrize("seed", range(20))
def test_selections_over_the_index_match_the_node_by_node_filter(seed: int) -> None:
    _selections_match_the_filter(seed)


@pytest.mark.parametrize("seed", range(5))
def test_the_node_by_node_fallback_of_a_selection_too_deep_for_the_index_matches_too(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inventory._match tests node by node when selection_mask hits RecursionError (a pathologically nested
    value): the same nodes."""

    def too_deep(*_: Any) -> int:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(nodeindex, "selection_mask", too_deep)
    _selections_match_the_filter(seed)


def _selections_match_the_filter(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(rng.randint(1, 120))]
    inv = inventory_mod.build([random_node(rng, n) for n in names], default_policy())
    for _ in range(60):
        pod = random_selection(rng, names)
        allowed = selection_filter(node_selection(pod))
        want = [n.name for n in inv.nodes if allowed(n.labels, n.name)]
        assert sorted(n.name for n in inv.candidates(pod)) == sorted(want), pod


def summary(inv: inventory_mod.Inventory) -> dict[str, Any]:
    """Everything a review reads of an inventory, node order aside."""
    probes = [
        {"spec": {}},
        {"spec": {"nodeSelector": {"topology.kubernetes.io/rack": "rack-00001"}}},
        {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/mig.strategy", "operator": "DoesNotExist"}]}]}}}}},
    ]  # fmt: skip
    whole = inv.all.having(inventory_mod.WHOLE_CARD)
    return {
        "nodes": sorted((n.name, n.rack, n.offers, n.pool) for n in inv.nodes),
        "rack": inv.rack_label,
        "warnings": inv.warnings,
        "maxima": (inv.max_whole_gpus, inv.max_memory_bytes, inv.max_rack_gpus, inv.largest_gpu_units),
        "resources": sorted(inv.resources),
        "zones": inv.zones,
        "whole": sorted(n.name for n in whole),
        "offers": sorted((k[1].resource, k[2], len(m)) for k, m in inv.all.members_of("offer")),
        "candidates": [sorted(n.name for n in inv.candidates(p)) for p in probes],
        "affinity": (inv.whole_card_expressions, inv.not_shared_expressions),
        "levels": (inv.levels, inv.level_warnings, inv.nvlink_key, inv.rack_or_finer, inv.level_finer),
    }


POOLS = """
apiVersion: gpu-admission.io/v1alpha1
kind: Policy
pools:
  - name: spare
    nodeSelector: {gpu-admission.example/block: block-0001}
    product: NVIDIA-H100-80GB-HBM3
    gpusPerNode: 8
    nodes: 2
"""


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy_text", ["", POOLS], ids=["no-pools", "declared-pool"])
def test_batches_of_node_changes_equal_a_fresh_build(seed: int, policy_text: str) -> None:
    rng = random.Random(seed)
    policy = parse_policy_text(policy_text) if policy_text else default_policy()
    live: dict[str, dict[str, Any]] = {}
    inv = inventory_mod.build([], policy)
    for step in range(25):
        changes: dict[str, inventory_mod.GpuNode | None] = {}
        for _ in range(rng.randint(1, 12)):
            i = rng.randrange(300)
            obj = clustergen.node(i, generation=step)
            name = obj["metadata"]["name"]
            roll = rng.random()
            if roll < 0.25:
                live.pop(name, None)
                changes[name] = None
                continue
            if roll < 0.6:  # a relabel: what levels read (rack, block, zone, clique, sharing) or not (health)
                relabel(rng, obj["metadata"]["labels"])
            live[name] = obj
            changes[name] = inventory_mod.node_from_object(obj, policy.pools)
        inv = inv.apply(changes)
        assert summary(inv) == summary(inventory_mod.build(list(live.values()), policy)), f"step {step}"


def relabel(rng: random.Random, labels: dict[str, str]) -> None:
    roll = rng.random()
    if roll < 0.2:
        labels.pop("topology.kubernetes.io/rack")
    elif roll < 0.4:
        labels["topology.kubernetes.io/rack"] = f"rack-{rng.randrange(4):05d}"
    elif roll < 0.5:
        labels["topology.kubernetes.io/zone"] = rng.choice(["zone-0", "zone-1", ""])
    elif roll < 0.6:
        labels["gpu-admission.example/block"] = f"block-{rng.randrange(3):04d}"
    elif roll < 0.7:
        labels["nvidia.com/gpu.clique"] = f"cluster-1.{rng.randrange(3)}"
    elif roll < 0.8:
        labels.pop("nvidia.com/gpu.clique", None)
    elif roll < 0.85 and "nvidia.com/gpu.present" in labels:  # whole cards become time-sliced
        labels |= {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    elif roll < 0.9 and "nvidia.com/gpu.present" in labels:  # MIG turned on (the same GPU count)
        labels["nvidia.com/mig-1g.10gb.count"] = "7"
    else:
        labels["gpu-admission.example/health"] = rng.choice(["ok", "degraded"])


def test_a_label_no_level_reads_keeps_the_levels_of_the_previous_version() -> None:
    """A health flip reuses the levels (no O(nodes) recount: the storm's label changes); a zone move recounts."""
    policy = default_policy()
    inv = inventory_mod.build(clustergen.cluster(200), policy)
    obj = clustergen.node(17, generation=1)
    obj["metadata"]["labels"]["gpu-admission.example/health"] = "degraded"
    after = inv.apply({obj["metadata"]["name"]: inventory_mod.node_from_object(obj, policy.pools)})
    assert after.levels is inv.levels and after.level_warnings is inv.level_warnings
    assert after.topology_epoch is inv.topology_epoch
    obj = clustergen.node(17, generation=2)  # a new object: the inventory keeps the old one's labels
    obj["metadata"]["labels"]["topology.kubernetes.io/zone"] = "zone-9"
    moved = after.apply({obj["metadata"]["name"]: inventory_mod.node_from_object(obj, policy.pools)})
    # Its rack now spans two zones: the zone level no longer nests and is dropped.
    assert [lv.key for lv in after.levels] == ["topology.kubernetes.io/rack", "topology.kubernetes.io/zone"]
    assert [lv.key for lv in moved.levels] == ["topology.kubernetes.io/rack"]
    assert moved.topology_epoch is not after.topology_epoch


def test_gpus_lost_without_a_label_change_recount_the_levels() -> None:
    """A GPU falls off the bus: the device plugin reports 4 of 8, the labels stay (the heartbeat fast path
    must still compare the node's whole-card GPUs)."""
    policy = default_policy()
    inv = inventory_mod.build(clustergen.cluster(16), policy)  # one rack of 16 H100 nodes
    obj = clustergen.node(3, generation=1)
    obj["status"]["allocatable"]["nvidia.com/gpu"] = obj["status"]["capacity"]["nvidia.com/gpu"] = "4"
    after = inv.apply({obj["metadata"]["name"]: inventory_mod.node_from_object(obj, policy.pools)})
    fresh = inventory_mod.build([*clustergen.cluster(3), obj, *clustergen.cluster(16)[4:]], policy)
    assert inv.levels[0].largest_gpus == 128
    assert after.levels == fresh.levels and after.levels[0].largest_gpus == 124
    assert after.topology_epoch is not inv.topology_epoch


def test_the_declared_rack_label_appearing_on_a_node_recounts_the_levels() -> None:
    """topology.rack names a key auto-detection does not know: its first appearance is still a level input."""
    policy = parse_policy_text(POOLS.split("pools:")[0] + "topology: {rack: example.com/pod-rack}\n")
    inv = inventory_mod.build(clustergen.cluster(16), policy)
    assert any("example.com/pod-rack" in w for w in inv.warnings)
    obj = clustergen.node(5, generation=1)
    obj["metadata"]["labels"]["example.com/pod-rack"] = "r1"
    after = inv.apply({obj["metadata"]["name"]: inventory_mod.node_from_object(obj, policy.pools)})
    fresh = inventory_mod.build([*clustergen.cluster(5), obj, *clustergen.cluster(16)[6:]], policy)
    assert (after.levels, after.warnings) == (fresh.levels, fresh.warnings) and after.levels != inv.levels


def test_a_node_updated_without_label_changes_touches_no_label_posting() -> None:
    policy = default_policy()
    objs = clustergen.cluster(200)
    inv = inventory_mod.build(objs, policy)
    obj = clustergen.node(17, generation=1)  # the same labels, a new resourceVersion
    after = inv.apply({obj["metadata"]["name"]: inventory_mod.node_from_object(obj, policy.pools)})
    assert after.index.labels is inv.index.labels  # shared, not copied
    assert after.index.sets is inv.index.sets and after.index.slots is inv.index.slots


def test_bits_and_slots_round_trip() -> None:
    rng = random.Random(1)
    for _ in range(50):
        slots = sorted(set(rng.sample(range(5000), rng.randint(0, 300))))
        mask = nodeindex.bits(slots)
        assert nodeindex.slots_of(mask) == slots
        assert mask.bit_count() == len(slots)
