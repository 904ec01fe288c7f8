"""cluster/nodes.NodeRecord: what the node Reflector keeps of a cut-down Node gives the same slim object back,
compares like it (same_content), and shares the resource sections of nodes with the same resources."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cluster.nodes import NodeTransform, as_object, record, same_content
from tests.bench import clustergen


def tainted() -> dict[str, Any]:
    node = clustergen.node(3, heavy=True)
    node["spec"] = {"unschedulable": True, "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    return node


NODES = [clustergen.node(i, heavy=True) for i in (0, 1, 16 * 13, 16 * 15, 16 * 16, 16 * 19)] + [tainted()]


@pytest.mark.parametrize("node", NODES, ids=lambda n: n["metadata"]["name"])
def test_a_record_gives_the_slim_object_back(node: dict[str, Any]) -> None:
    slim = NodeTransform()(node)
    rec = record(slim)
    assert rec is not None and rec.as_object() == slim and as_object(rec) == slim
    assert rec.labels is slim["metadata"]["labels"]  # shared with the inventory's GpuNode, not copied


def test_records_compare_like_the_slim_objects() -> None:
    transform = NodeTransform()
    a = clustergen.node(0, heavy=True)
    heartbeat = copy.deepcopy(a)
    heartbeat["metadata"]["resourceVersion"] = "99999"
    heartbeat["status"]["conditions"] = []
    relabelled = copy.deepcopy(heartbeat)
    relabelled["metadata"]["labels"]["gpu-admission.example/health"] = "degraded"
    regpu = copy.deepcopy(heartbeat)
    regpu["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    for other, same in ((heartbeat, True), (relabelled, False), (regpu, False), (tainted(), False)):
        slims = transform(a), transform(other)
        assert same_content(*slims) is same
        assert same_content(record(slims[0]), record(slims[1])) is same
    assert not same_content(None, record(transform(a)))


def test_nodes_with_the_same_resources_share_one_section() -> None:
    transform = NodeTransform()
    one, two = (record(transform(clustergen.node(i, heavy=True))) for i in (0, 1))
    assert one is not None and two is not None and one.status is two.status
    mig = record(transform(clustergen.node(16 * 15, heavy=True)))  # rack 15: A100 MIG mixed
    assert mig is not None and mig.status is not one.status and "nvidia.com/mig-1g.10gb" in mig.status["allocatable"]
