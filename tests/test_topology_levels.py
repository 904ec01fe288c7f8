"""Topology levels (policies/topology.py): detected narrowest first on the fixture clusters, declared in the
policy, and inconsistent label sets reported as one-line warnings, in `check` and `/readyz`, never a crash."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import inventory as inventory_mod
from policies.document import PolicyError
from tests.test_check_cli import cli
from tests.test_golden import CASES, load_case, policy_for

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "clusters"
EKS = ["topology.k8s.aws/network-node-layer-3", "topology.k8s.aws/network-node-layer-2"]


def nodes(name: str) -> list[Any]:
    path = ROOT / name if "/" in name else FIXTURES / f"{name}.yaml"
    items: list[Any] = yaml.safe_load(path.read_text(encoding="utf-8"))["items"]
    return items


def build(objs: list[Any], policy: Any = None) -> inventory_mod.Inventory:
    return inventory_mod.build(copy.deepcopy(objs), policy_for(policy))


@pytest.mark.parametrize(
    ("cluster", "keys", "largest"),
    [
        ("eks-p5-p6", [*EKS, "topology.k8s.aws/network-node-layer-1", "topology.kubernetes.io/zone"], [8, 16, 48, 48]),
        ("gb200-nvl72", ["nvidia.com/gpu.clique", "topology.kubernetes.io/rack", "topology.kubernetes.io/zone"],
         [12, 12, 24]),
        ("gke", ["cloud.google.com/gce-topology-subblock", "cloud.google.com/gce-topology-block",
                 "topology.kubernetes.io/zone"], [16, 32, 32]),
        ("examples/cluster/nodes.yaml", ["topology.kubernetes.io/rack", "topology.kubernetes.io/zone"], [16, 32]),
        ("aks", [], []),  # a zone alone is no fabric level
        ("gpu-operator-default", [], []),
    ],
)  # fmt: skip
def test_levels_are_detected_narrowest_first(cluster: str, keys: list[str], largest: list[int]) -> None:
    inv = build(nodes(cluster))
    assert [lv.key for lv in inv.levels] == keys
    assert [lv.largest_gpus for lv in inv.levels] == largest


def test_the_narrowest_level_that_holds_the_job_by_total_capacity() -> None:
    inv = build(nodes("eks-p5-p6"))
    assert [inv.level_for(g, known=True) for g in (8, 16, 17, 48, 49)] == [0, 1, 2, 2, None]
    assert inv.level_for(64, known=False) == 0  # size unknown: the rack, as before levels


def test_a_clique_on_some_nodes_only_is_no_level_and_one_warning() -> None:
    case = load_case(CASES / "clusters" / "clique-on-some-nodes-only-not-a-level.yaml")
    inv = build(case["nodes"])
    assert [lv.key for lv in inv.levels] == ["topology.kubernetes.io/rack"]
    assert inv.nvlink_key == "nvidia.com/gpu.clique"
    assert inv.warnings == (
        "nvidia.com/gpu.clique is on 2 of 4 whole-card GPU nodes: NVLink domains are not used to place jobs "
        "(claims of a ComputeDomain channel still are)",
    )


def test_levels_that_nest_wrongly_are_dropped_with_one_warning() -> None:
    case = load_case(CASES / "clusters" / "levels-that-nest-wrongly-are-dropped.yaml")
    inv = build(case["nodes"])
    assert [lv.key for lv in inv.levels] == [
        "topology.k8s.aws/network-node-layer-3",
        "topology.k8s.aws/network-node-layer-1",
    ]
    assert len(inv.warnings) == 1 and "\n" not in inv.warnings[0]
    assert (
        "a topology.k8s.aws/network-node-layer-3 domain spans several topology.k8s.aws/network-node-layer-2"
        in (inv.warnings[0])
    )


def test_declared_levels_replace_detection_and_are_checked() -> None:
    inv = build(nodes("eks-p5-p6"), {"topology": {"levels": [EKS[1], "example.com/no-such-level"]}})
    assert [lv.key for lv in inv.levels] == [EKS[1]]
    assert inv.warnings == (
        "no whole-card GPU node carries 'example.com/no-such-level' (topology.levels): level not used",
    )


@pytest.mark.parametrize(
    ("levels", "rack", "fragment"),
    [
        ("rack", "auto", "must be a list of node label keys"),
        ([EKS[0], EKS[0]], "auto", "lists a key twice"),
        ([EKS[1]], EKS[0], "must include topology.rack"),
        ([""], "auto", "must be a list of node label keys"),
    ],
)
def test_bad_levels_are_policy_errors(levels: Any, rack: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as err:
        policy_for({"topology": {"levels": levels, "rack": rack}})
    assert fragment in str(err.value)


def test_check_prints_inconsistent_labels_as_one_line(tmp_path: Path) -> None:
    case = load_case(CASES / "clusters" / "levels-that-nest-wrongly-are-dropped.yaml")
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": case["nodes"]}))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(case["input"]))
    r = cli("check", "-f", str(tmp_path / "job.yaml"), "--nodes", str(tmp_path / "nodes.yaml"))
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "nest wrongly" in line]
    assert len(lines) == 1 and lines[0].startswith("gpu-admission: warning: topology levels nest wrongly"), r.stderr
    assert "Traceback" not in r.stderr


def test_level_report_quotes_a_penalty_per_level() -> None:
    pol = policy_for({"comm": {"nvlinkGbps": 7200}})
    report = inventory_mod.level_report(inventory_mod.build(nodes("gb200-nvl72"), pol), pol)
    assert [r["key"] for r in report] == [
        "nvidia.com/gpu.clique",
        "topology.kubernetes.io/rack",
        "topology.kubernetes.io/zone",
    ]
    assert "slower across NVLink cliques than in one" in report[0]["penalty"]
    assert "slower across racks" in report[1]["penalty"] and "slower across zones" in report[2]["penalty"]


def test_levels_follow_node_changes_applied_one_at_a_time() -> None:
    """Inventory.apply (the watch path): levels and warnings match a build from scratch after each change."""
    pol = policy_for(None)
    objs = nodes("gb200-nvl72")
    inv = inventory_mod.empty(pol)
    for i, obj in enumerate(objs):
        node = inventory_mod.node_from_object(copy.deepcopy(obj))
        assert node is not None
        inv = inv.apply({node.name: node})
        fresh = inventory_mod.build(copy.deepcopy(objs[: i + 1]), pol)
        assert inv.levels == fresh.levels and inv.warnings == fresh.warnings, i
    inv = inv.apply({"gb200-r2-t03": None})
    assert [lv.largest_gpus for lv in inv.levels] == [12, 12, 20]
