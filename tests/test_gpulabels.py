"""GPU node labels as GFD and GKE really write them (policies/gpulabels.py), over the fixture clusters of
tests/fixtures/clusters/ (each cites its source in its header and in docs/policy.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import gpulabels
from policies import inventory as inventory_mod
from policies.resources import GPU
from policies.selectors import expression_matches
from tests.test_golden import policy_for

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "clusters").glob("*.yaml"))
EXAMPLE = Path(__file__).parent.parent / "examples" / "cluster" / "nodes.yaml"


def nodes(path: Path) -> list[Any]:
    items: list[Any] = yaml.safe_load(path.read_text(encoding="utf-8"))["items"]
    return items


def admitted(exprs: tuple[Any, ...], labels: dict[str, str]) -> bool:
    return all(expression_matches(e, labels) for e in exprs)


@pytest.mark.parametrize("path", [*FIXTURES, EXAMPLE], ids=lambda p: p.stem)
def test_selections_are_exact_on_each_cluster(path: Path) -> None:
    """Among nodes a whole-GPU ask can land on, training-pool's expressions admit exactly the whole-card nodes
    and online-exclusive's exactly the unshared ones."""
    inv = inventory_mod.build(nodes(path), policy_for(None))
    offering = [n for n in inv.nodes if n.offer(GPU)]
    assert offering
    for n in offering:
        assert admitted(inv.whole_card_expressions, dict(n.labels)) is n.whole_card, n.name
        assert admitted(inv.not_shared_expressions, dict(n.labels)) is not n.shared, n.name
    assert not [w for w in inv.warnings if "tells them apart" in w]


def test_the_strategy_label_alone_is_not_mig() -> None:
    """A default GPU Operator labels mig.strategy single on every GPU node (k8s-device-plugin
    mig-strategy_test.go "single non-mig device returns non-mig (none) labels")."""
    inv = inventory_mod.build(nodes(FIXTURES[0].parent / "gpu-operator-default.yaml"), policy_for(None))
    assert [n.whole_card for n in inv.nodes] == [True, True]
    assert inv.max_whole_gpus == 8
    assert all(n.mig_strategy == "single" and not n.partitioned for n in inv.nodes)


@pytest.mark.parametrize(
    ("labels", "resources", "want"),
    [
        ({"nvidia.com/mig.strategy": "single"}, [GPU], False),
        ({"nvidia.com/mig.strategy": "mixed"}, [GPU], False),
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}, [GPU], True),
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID"}, [GPU], True),
        ({"nvidia.com/gpu.slices.gi": "1"}, [GPU], True),
        ({"nvidia.com/mig-1g.10gb.count": "14"}, [GPU], True),
        ({"nvidia.com/mig-1g.10gb.count": "0"}, [GPU], False),
        ({"nvidia.com/mig-1g.10gb.count": "1"}, [GPU], True),  # one slice is a MIG node too
        ({"nvidia.com/mig-1g.10gb.count": "x"}, [GPU], False),
        ({"nvidia.com/mig-1g.10gb.total": "7"}, [GPU], False),  # a count label ends in .count
        ({"x.example/mig-1g.10gb.count": "7"}, [GPU], False),
        ({}, ["nvidia.com/mig-3g.40gb"], True),
        ({"cloud.google.com/gke-gpu-partition-size": "1g.5gb"}, [GPU], True),
    ],
)
def test_partitioned_by_what_says_so(labels: dict[str, str], resources: list[str], want: bool) -> None:
    assert gpulabels.partitioned(labels, None, resources) is want


def test_a_node_no_label_tells_apart_is_reported() -> None:
    """MIG seen only in allocatable beside whole GPUs, with no GFD label: no expression can exclude it."""
    bare = {
        "metadata": {"name": "odd", "labels": {"kubernetes.io/hostname": "odd"}},
        "status": {"allocatable": {GPU: "2", "nvidia.com/mig-1g.10gb": "7"}},
    }
    whole = {
        "metadata": {"name": "w", "labels": {"kubernetes.io/hostname": "w"}},
        "status": {"allocatable": {GPU: "8"}},
    }
    inv = inventory_mod.build([bare, whole], policy_for(None))
    assert [w for w in inv.warnings if "(odd) carry no label that tells them apart" in w]
