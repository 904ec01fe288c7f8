"""policies/affinity.py over the index gives what gpulabels gives from the nodes' label lists: on every fixture
cluster, on random mixes of them, and after node changes applied one batch at a time."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from policies import gpulabels
from policies import inventory as inventory_mod
from policies.resources import GPU
from tests.test_golden import policy_for
from tests.test_gpulabels import EXAMPLE, FIXTURES, nodes


def by_label_lists(inv: inventory_mod.Inventory) -> tuple[Any, Any, list[str]]:
    """What fidelity's build computed: gpulabels' functions over the live nodes' label lists."""
    live = [n for n in inv.nodes if not n.declared]
    whole, problems = gpulabels.whole_card_expressions(
        [n.labels for n in live if n.whole_card], [n.labels for n in live if not n.whole_card and n.offer(GPU)]
    )
    unshared, more = gpulabels.not_shared_expressions(
        [n.labels for n in live if not n.shared and n.offer(GPU)], [n.labels for n in live if n.shared and n.offer(GPU)]
    )
    return whole, unshared, problems + more


def check(inv: inventory_mod.Inventory) -> None:
    whole, unshared, problems = by_label_lists(inv)
    assert inv.whole_card_expressions == whole
    assert inv.not_shared_expressions == unshared
    assert list(inv.warnings[len(inv.warnings) - len(problems) :]) == problems


@pytest.mark.parametrize("path", [*FIXTURES, EXAMPLE], ids=lambda p: p.stem)
def test_each_fixture_cluster(path: Any) -> None:
    check(inventory_mod.build(nodes(path), policy_for(None)))


def everything() -> list[dict[str, Any]]:
    out = []
    for path in [*FIXTURES, EXAMPLE]:
        for i, n in enumerate(nodes(path)):
            n = copy.deepcopy(n)
            n["metadata"]["name"] = f"{path.stem}-{i}"
            out.append(n)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_random_mixes_built_and_changed_batch_by_batch(seed: int) -> None:
    rng = random.Random(seed)
    pool = everything()
    policy = policy_for(None)
    chosen = rng.sample(pool, rng.randint(1, len(pool)))
    inv = inventory_mod.build(chosen, policy)
    check(inv)
    live = {n["metadata"]["name"]: n for n in chosen}
    for _ in range(10):
        changes: dict[str, inventory_mod.GpuNode | None] = {}
        for n in rng.sample(pool, rng.randint(1, 6)):
            name = n["metadata"]["name"]
            if name in live and rng.random() < 0.5:
                del live[name]
                changes[name] = None
            else:
                live[name] = n
                changes[name] = inventory_mod.node_from_object(n, policy.pools)
        inv = inv.apply(changes)
        check(inv)
        assert inv.whole_card_expressions == inventory_mod.build(list(live.values()), policy).whole_card_expressions
