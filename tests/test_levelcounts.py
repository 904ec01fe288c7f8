"""Topology levels from the incremental counts (policies/levelcounts.py) against the plain definition: a scan
over every node of the inventory, as the levels were computed before they were counted. Random clusters,
changed one batch at a time; older versions must keep their own counts (copy-on-write)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from policies import inventory as inventory_mod
from policies import levelcounts, topology
from policies.document import default_policy, parse_policy_text
from policies.levelcounts import LevelCounts

CLIQUE = "nvidia.com/gpu.clique"
L3, L2, L1 = (f"topology.k8s.aws/network-node-layer-{i}" for i in (3, 2, 1))
RACK = "topology.kubernetes.io/rack"
ZONE = topology.ZONE
KEYS = (CLIQUE, L3, L2, L1, RACK, ZONE, "gpu-admission.example/health")


def scan_levels(inv: inventory_mod.Inventory) -> tuple[tuple[topology.Level, ...], list[str]]:
    """The levels by the definition: every node's labels read, per key and per pair of keys."""
    nodes = list(inv.nodes)
    placed = [n for n in nodes if n.whole_card] or nodes
    if inv.level_setting:
        keys = list(inv.level_setting)
    else:
        keys = topology.auto_keys({k for n in placed for k in n.labels}, inv.rack_label)
    sized = [(n.labels, n.whole_gpus if n.whole_card else 0) for n in placed]
    levels: list[topology.Level] = []
    warnings: list[str] = []
    for key in keys:
        have = [(lab[key], gpus) for lab, gpus in sized if lab.get(key)]
        where = "topology.levels" if inv.level_setting else "auto-detected"
        if not have:
            if inv.level_setting and sized:
                warnings.append(f"no whole-card GPU node carries {key!r} ({where}): level not used")
            continue
        if len(have) < len(sized):
            if topology.kind_of(key) == "nvlink":
                warnings.append(
                    f"{key} is on {len(have)} of {len(sized)} whole-card GPU nodes: NVLink domains are not used "
                    f"to place jobs (claims of a ComputeDomain channel still are)"
                )
                continue
            warnings.append(f"level label {key!r} is missing on {len(sized) - len(have)} of {len(sized)} GPU nodes")
        if levels and not nests(sized, levels[-1].key, key):
            warnings.append(
                f"topology levels nest wrongly: a {levels[-1].key} domain spans several {key} domains; {key} not used"
            )
            continue
        per: dict[str, int] = {}
        for value, gpus in have:
            per[value] = per.get(value, 0) + gpus
        levels.append(topology.Level(key, topology.kind_of(key), len(per), max(per.values()), len(have)))
    return tuple(levels), warnings


def nests(nodes: Sequence[tuple[Mapping[str, str], int]], fine: str, coarse: str) -> bool:
    seen: dict[str, str] = {}
    for lab, _ in nodes:
        f, c = lab.get(fine), lab.get(coarse)
        if f and c and seen.setdefault(f, c) != c:
            return False
    return True


def random_node(rng: random.Random, name: str, keys: Sequence[str] = KEYS) -> dict[str, Any]:
    """A node of a nested fabric (4 nodes a rack, 2 racks a block, 2 blocks a zone), now and then mislabelled:
    a label missing or empty, or a value from elsewhere (domains that no longer nest)."""
    labels = {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name}
    rack = int(name.rsplit("-", 1)[-1]) // 4
    nested = {CLIQUE: rack, L3: rack, RACK: rack, L2: rack // 2, L1: rack // 4, ZONE: rack // 4}
    for key in keys:
        value = f"d{nested.get(key, 0)}"
        roll = rng.random()
        if roll < 0.05:
            continue
        labels[key] = "" if roll < 0.08 else f"d{rng.randrange(8)}" if roll < 0.12 else value
    kind = rng.random()
    if kind < 0.15:
        labels |= {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}
    elif kind < 0.25:
        labels["nvidia.com/mig.strategy"] = "mixed"
        return {
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/mig-1g.10gb": "7"}},
        }
    gpus = str(rng.choice([4, 8]))
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": gpus}}}


DECLARED = """
apiVersion: gpu-admission.io/v1alpha1
kind: Policy
topology:
  rack: topology.k8s.aws/network-node-layer-3
  levels: [nvidia.com/gpu.clique, topology.k8s.aws/network-node-layer-3, topology.k8s.aws/network-node-layer-2,
           topology.kubernetes.io/zone]
"""


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("policy_text", ["", DECLARED], ids=["auto", "declared"])
def test_counted_levels_equal_a_scan_of_every_node_at_every_step(seed: int, policy_text: str) -> None:
    rng = random.Random(seed)
    policy = parse_policy_text(policy_text) if policy_text else default_policy()
    keys = rng.sample(KEYS, rng.randint(2, len(KEYS)))  # which conventions this cluster uses
    inv = inventory_mod.build([], policy)
    history: list[tuple[inventory_mod.Inventory, Any]] = []
    seen: set[tuple[str, ...]] = set()
    for step in range(40):
        changes: dict[str, inventory_mod.GpuNode | None] = {}
        for _ in range(rng.choice([1, 1, 2, 5, 30])):
            name = f"node-{rng.randrange(60)}"
            changes[name] = None if rng.random() < 0.3 else inventory_mod.node_from_object(random_node(rng, name, keys))
        inv = inv.apply(changes)
        levels, warnings = scan_levels(inv)
        assert (inv.levels, inv.level_warnings[: len(warnings)]) == (levels, tuple(warnings)), f"step {step}"
        history.append((inv, levels))
        seen.add(tuple(lv.key for lv in levels))
    assert any(seen)  # the cluster had levels at some point (the generator nests its labels)
    for old, levels in history:  # every version still reads its own counts, and changes from them rightly
        counted, _ = inventory_mod._levels(old.index, old, old.level_counts, old.rack_label)
        assert counted == levels
        name = f"node-{rng.randrange(60)}"
        branch = old.apply({name: inventory_mod.node_from_object(random_node(rng, name, keys))})
        assert branch.levels == scan_levels(branch)[0]


def test_a_first_list_counts_each_distinct_shape_once_and_gets_the_same_levels_as_one_by_one() -> None:
    rng = random.Random(7)
    nodes = [inventory_mod.node_from_object(random_node(rng, f"node-{i}")) for i in range(200)]
    at_once = inventory_mod.build([], default_policy()).apply({n.name: n for n in nodes if n})
    one_by_one = inventory_mod.build([], default_policy())
    for n in nodes:
        if n is not None:
            one_by_one = one_by_one.apply({n.name: n})
    assert at_once.level_counts == one_by_one.level_counts
    assert (at_once.levels, at_once.level_warnings) == (one_by_one.levels, one_by_one.level_warnings)


def test_removing_every_node_leaves_no_count_behind() -> None:
    rng = random.Random(3)
    nodes = {f"node-{i}": inventory_mod.node_from_object(random_node(rng, f"node-{i}")) for i in range(50)}
    inv = inventory_mod.build([], default_policy()).apply(nodes)
    empty = inv.apply(dict.fromkeys(nodes))
    assert empty.level_counts == LevelCounts(inv.level_counts.keys)
    assert empty.levels == ()


def test_pairs_are_counted_in_key_order_only() -> None:
    counts = LevelCounts((L3, L2)).apply([], [(True, 8, ("a", "p")), (True, 8, ("a", "q"))])
    view = counts.view()
    assert view.nests(L3, L3) and not view.nests(L3, L2)  # one L3 domain in two L2 domains
    assert not view.nests(L2, L3)  # not counted that way round: no level rather than a wrong one
    assert not view.nests(L3, RACK)  # not a candidate key
    assert view.key(L3).largest == 16 and view.key(L2).largest == 8 and len(view.key(L2).domains) == 2


@pytest.mark.parametrize("declared", [(), (CLIQUE, L3, L2, ZONE)])
@pytest.mark.parametrize("rack", ["auto", RACK, L2, "example.com/my-rack", CLIQUE])
def test_candidate_keys_hold_the_level_order_as_a_subsequence(declared: tuple[str, ...], rack: str) -> None:
    """Levels nest-check a key against the one kept before it: that pair must be counted (in key order)."""
    keys = topology.candidate_keys(declared, rack)
    assert len(set(keys)) == len(keys)
    order = list(declared) or topology.auto_keys({*KEYS, rack}, None if rack == "auto" else rack)
    assert order and set(order) <= set(keys)
    positions = [keys.index(k) for k in order]
    assert positions == sorted(positions), order


def test_counts_hold_the_figures_they_name() -> None:
    """Nodes carrying a key, per domain (nodes, whole-card GPUs), and the conflicts of a pair, as counts."""
    shapes = [(True, 8, ("a", "p")), (True, 8, ("a", "q")), (True, 4, ("b", "")), (True, 8, (None, "p"))]
    view = LevelCounts((L3, L2)).apply([], shapes).view()
    assert (view.key(L3).present, view.key(L3).have, view.key(L2).present, view.key(L2).have) == (3, 3, 4, 3)
    assert dict(view.key(L3).domains) == {"a": (2, 16), "b": (1, 4)}
    assert dict(view.key(L2).domains) == {"p": (2, 16), "q": (1, 8)}
    assert dict(view.key(L3).sizes) == {16: 1, 4: 1} and dict(view.key(L2).sizes) == {16: 1, 8: 1}
    assert view.counts.pairs[True, L3, L2].conflicts == 1  # "a" in p and in q
    assert dict(view.counts.pairs[True, L3, L2].coarse) == {"a": {"p": 1, "q": 1}}
    fixed = view.counts.apply([(True, 8, ("a", "q"))], []).view()
    assert fixed.counts.pairs[True, L3, L2].conflicts == 0 and fixed.nests(L3, L2)


def test_a_domain_emptied_and_refilled_in_one_batch() -> None:
    """The only node of a rack changes shape (its GPU count) in a batch: the domain leaves and comes back."""
    counts = LevelCounts((RACK,)).apply([], [(True, 8, ("r1",)), (True, 8, ("r2",))])
    after = counts.apply([(True, 8, ("r1",))], [(True, 4, ("r1",))]).view()
    assert dict(after.key(RACK).domains) == {"r1": (1, 4), "r2": (1, 8)} and after.key(RACK).largest == 8
    # `apply` counts additions first, so within one batch a removed domain is never read again; the table of
    # pending edits must still answer like the table it will become.
    pending = levelcounts._Pending(counts.per_key[True, RACK].domains)
    pending.put("r1", None)
    assert pending.get("r1", (0, 0)) == (0, 0) and pending.get("r2", (0, 0)) == (1, 8)
    assert dict(pending.done()) == {"r2": (1, 8)}


def test_levels_of_a_cluster_without_whole_cards_count_no_gpus() -> None:
    """Time-sliced nodes and MIG nodes with some whole GPUs only: the levels are read over all of them, with 0
    whole-card GPUs (a partitioned node's whole GPUs are not whole cards)."""
    shared = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}
    nodes = {}
    for i in range(4):
        labels = {"nvidia.com/gpu.present": "true", RACK: f"r{i // 2}", **(shared if i % 2 else {})}
        gpus = {"nvidia.com/gpu": "32"} if i % 2 else {"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "14"}
        obj = {"metadata": {"name": f"n{i}", "labels": labels}, "status": {"allocatable": gpus}}
        nodes[f"n{i}"] = inventory_mod.node_from_object(obj)
    assert not any(n.whole_card for n in nodes.values() if n) and any(n.whole_gpus for n in nodes.values() if n)
    inv = inventory_mod.build([], default_policy()).apply(nodes)
    assert [(lv.key, lv.domains, lv.largest_gpus, lv.nodes) for lv in inv.levels] == [(RACK, 2, 0, 4)]


def test_keys_never_on_one_node_together_still_nest() -> None:
    """Racks on some whole-card nodes, zones on the others: no pair is counted, and nothing conflicts."""
    nodes = {}
    for i in range(4):
        labels = {"nvidia.com/gpu.present": "true", **({RACK: "r1"} if i < 2 else {ZONE: "z1"})}
        obj = {"metadata": {"name": f"n{i}", "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
        nodes[f"n{i}"] = inventory_mod.node_from_object(obj)
    inv = inventory_mod.build([], default_policy()).apply(nodes)
    assert [lv.key for lv in inv.levels] == [RACK, ZONE] and (True, RACK, ZONE) not in inv.level_counts.pairs
    assert inv.levels == scan_levels(inv)[0]
