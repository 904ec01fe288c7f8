"""The cut-down Node decoders (cluster/nodes.py: decode_list, decode_event) against decoding whole objects:
after the transform, every page and watch line gives exactly what orjson's whole objects give, for the
generated heavy Nodes, hostile ones and pages of unexpected shape; deep nesting is refused as orjson refuses it."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from cluster.kubeclient import KubeError, decode_watch_event
from cluster.nodes import NodeTransform, decode_event, decode_list, same_content
from tests.bench import clustergen
from tests.test_node_watch import hostile


def odd_nodes() -> list[Any]:
    """Valid JSON in shapes a Node never has: each must reach the transform as it is."""
    base = clustergen.node(5, heavy=True)
    out: list[Any] = []
    for path, value in [
        (("metadata", "labels"), ["a", "list"]),
        (("metadata", "labels"), {"n": 7, "t": True, "none": None}),
        (("metadata", "name"), 42),
        (("metadata", "resourceVersion"), 9),
        (("spec", "taints"), "NoSchedule"),
        (("spec", "unschedulable"), "yes"),
        (("status", "allocatable"), None),
        (("status", "capacity"), [1, 2]),
    ]:
        obj = copy.deepcopy(base)
        obj[path[0]][path[1]] = value
        out.append(obj)
    no_status = copy.deepcopy(base)
    del no_status["status"]
    spec_string = copy.deepcopy(base)
    spec_string["spec"] = "a string"
    return [*out, no_status, spec_string, {"metadata": None}, {}, None, 5]


def transformed(page: Any) -> list[Any]:
    t = NodeTransform()
    return [t(item) for item in page.get("items") or []] + [t.snapshot()]


@pytest.mark.parametrize(
    "items",
    [
        [clustergen.node(i, heavy=True) for i in range(0, 400, 7)],
        [clustergen.node(i) for i in range(0, 400, 7)],
        [clustergen.node(1, heavy=True), *hostile()],
        *([clustergen.node(2, heavy=True), odd] for odd in odd_nodes()),
    ],
    ids=lambda items: f"{len(items)}-items",
)
def test_a_cut_down_page_transforms_to_what_the_whole_page_does(items: list[Any]) -> None:
    page = orjson.dumps({"kind": "NodeList", "metadata": {"resourceVersion": "7", "continue": "x"}, "items": items})
    cut = decode_list(page)
    assert cut["metadata"] == {"resourceVersion": "7", "continue": "x"}
    assert transformed(cut) == transformed(orjson.loads(page))


def test_a_cut_down_item_holds_only_what_the_transform_reads() -> None:
    page = orjson.dumps({"metadata": {}, "items": [clustergen.node(3, heavy=True)]})
    (item,) = decode_list(page)["items"]
    assert set(item) == {"metadata", "spec", "status"}
    assert set(item["metadata"]) == {"name", "resourceVersion", "labels"}
    assert set(item["status"]) == {"allocatable", "capacity"}  # no images, conditions, nodeInfo
    assert decode_list(b'{"items": null}')["items"] is None


@pytest.mark.parametrize("kind", ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "SURPRISE"])
@pytest.mark.parametrize("obj", [clustergen.node(9, heavy=True), *hostile()[:4], *odd_nodes()[:3]])
def test_a_cut_down_watch_event_transforms_to_what_the_whole_event_does(kind: str, obj: Any) -> None:
    if kind == "ERROR":
        obj = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    line = orjson.dumps({"type": kind, "object": obj})
    whole, cut = decode_watch_event(line), decode_watch_event(line, decode_event)
    assert cut["type"] == whole["type"]
    if kind in ("ADDED", "MODIFIED", "DELETED"):
        assert NodeTransform()(cut["object"]) == NodeTransform()(whole["object"])
    else:
        assert cut == whole  # bookmarks, errors and the unknown are decoded whole


@pytest.mark.parametrize("line", [b'{"type": "MODIFIED", "object": 5}', b'{"type": "MODIFIED"}', b"[1]", b"{"])
def test_a_line_that_is_no_event_is_refused_as_before(line: bytes) -> None:
    with pytest.raises(KubeError) as whole:
        decode_watch_event(line)
    with pytest.raises(KubeError) as cut:
        decode_watch_event(line, decode_event)
    assert cut.value.reason == whole.value.reason == "InvalidWatchEvent"


def test_nesting_past_the_limit_is_refused_not_a_crash() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    page = b'{"items": [{"metadata": {"name": "a"}, "status": {"images": ' + deep + b"}}]}"
    with pytest.raises(orjson.JSONDecodeError):
        decode_list(page)
    with pytest.raises(orjson.JSONDecodeError):
        decode_event(b'{"type": "ADDED", "object": {"status": {"images": ' + deep + b"}}}")


def _edited(edit: Any) -> dict[str, Any] | None:
    obj = clustergen.node(5, heavy=True)
    edit(obj)
    return NodeTransform()(obj)


@pytest.mark.parametrize(
    ("edit", "same"),
    [
        (lambda o: o["metadata"].update(resourceVersion="99"), True),
        (lambda o: o["status"].update(conditions=[{"type": "Ready", "status": "False"}], images=[]), True),
        (lambda o: o["metadata"]["labels"].update({"gpu-admission.example/health": "degraded"}), False),
        (lambda o: o["metadata"]["labels"].pop("topology.kubernetes.io/rack"), False),
        (lambda o: o["status"]["allocatable"].update({"nvidia.com/gpu": "7"}), False),
        (lambda o: o.setdefault("spec", {}).update(unschedulable=True), False),
        (lambda o: o.setdefault("spec", {}).update(taints=[{"key": "k", "effect": "NoSchedule"}]), False),
    ],
    ids=["version", "status", "label-value", "label-gone", "gpus", "cordoned", "tainted"],
)
def test_an_update_is_dropped_only_when_nothing_the_inventory_reads_changed(edit: Any, same: bool) -> None:
    before = _edited(lambda o: None)
    assert same_content(before, _edited(edit)) is same
    assert not same_content(None, before) and not same_content(before, None)  # added, deleted
