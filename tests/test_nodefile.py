"""`serve --nodes FILE` (webhook/nodefile.py): a JSON NodeList is decoded cut down and gives the inventory
the manifest loader's whole objects give; other files go through the manifest loader; bad files are one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from cluster.nodes import NodeRecord, NodeTransform
from policies.document import default_policy, parse_policy_text
from tests.bench import clustergen
from tests.serverproc import ServerProcess
from tests.test_node_watch import hostile
from tests.test_nodeindex import summary
from webhook import nodefile
from webhook import state as state_mod
from webhook.manifests import Limits, ManifestError, load_objects
from webhook.state import State

NODES = [clustergen.node(i, heavy=True) for i in range(0, 640, 20)]


def inventory_of(objs: list[Any]) -> dict[str, Any]:
    state = State(default_policy())
    state.set_nodes(objs, "test")
    return summary(state.snapshot().inventory)


def test_a_json_node_list_is_cut_down_to_the_inventory_of_whole_objects(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "NodeList", "items": NODES}))
    items = nodefile.load_node_file(str(path))
    assert len(items) == len(NODES) and all("images" not in str(item) for item in items)  # never built
    assert inventory_of(items) == inventory_of(load_objects([str(path)], Limits(max_bytes=2**30)))


def test_hostile_nodes_in_a_node_list_are_judged_as_the_watch_judges_them(tmp_path: Path) -> None:
    page = {"kind": "NodeList", "items": [*NODES[:8], *hostile()]}
    path = tmp_path / "nodes.json"
    path.write_bytes(orjson.dumps(page))
    cut, whole = NodeTransform(), NodeTransform()
    assert [cut(n) for n in nodefile.load_node_file(str(path))] == [
        whole(n) for n in orjson.loads(path.read_bytes())["items"]
    ]
    assert cut.snapshot() == whole.snapshot() and cut.snapshot()["too-many-labels"] == 1


@pytest.mark.parametrize("kind", ["yaml", "one-json-node"])
def test_other_files_go_through_the_manifest_loader(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nodes"
    if kind == "yaml":
        path.write_text(yaml.safe_dump_all(NODES[:3]))
    else:
        path.write_bytes(orjson.dumps(NODES[0]))
    assert nodefile.load_node_file(str(path)) == load_objects([str(path)])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"items": [', "invalid JSON"),
        (b'{"items": ' + b"[" * 5000 + b"]" * 5000 + b"}", "invalid JSON"),
        (orjson.dumps({"kind": "NodeList", "items": [clustergen.node(i) for i in range(4)]}), "more than 3 nodes"),
    ],
)
def test_bad_node_files_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, message: str
) -> None:
    monkeypatch.setattr(nodefile, "MAX_NODES", 3)
    path = tmp_path / "nodes.json"
    path.write_bytes(content)
    with pytest.raises(ManifestError) as info:
        nodefile.load_node_file(str(path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_large_file_that_is_no_json_node_list_says_how_to_write_one(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_bytes(b"---\n" + b"# padding\n" * (4 * 2**20))  # 40 MiB
    with pytest.raises(ManifestError) as info:
        nodefile.load_node_file(str(path))
    assert str(info.value) == (
        f"{path}: larger than 33554432 bytes and not a JSON NodeList (write it with kubectl get nodes -o json)"
    )


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="No such file"):
        nodefile.load_node_file(str(tmp_path / "nope.json"))


def test_set_nodes_keeps_only_the_cut_down_objects() -> None:
    state = State(default_policy())
    state.set_nodes([*NODES[:4], "not a node"], "test")
    kept = list(state._node_objects())
    assert len(kept) == 4 and all(isinstance(n, NodeRecord) for n in kept)
    assert all(set(n.as_object()["metadata"]) <= {"name", "labels", "resourceVersion"} for n in kept)
    assert state.node_transform.snapshot() == {"not-an-object": 1}


def test_a_nodes_file_trims_the_heap_and_a_policy_edit_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """malloc_trim holds glibc's arena locks while it walks the heap, and the event loop's allocations wait for
    them (a 152 ms trim on a policy reload stalled the soak's loop 152 ms): only a bulk load trims."""
    trims: list[int] = []
    monkeypatch.setattr(state_mod, "_trim", lambda: trims.append(1))
    state = State(default_policy())
    state.set_nodes(NODES[:4], "test")
    assert trims == [1]
    head = "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\n"
    state.set_policy(parse_policy_text(head + "inference: {warmPool: 2}\n"), "file:p")
    assert state.snapshot().policy.hash != default_policy().hash and state.snapshot().inventory.node_count == 4
    assert trims == [1]


def test_a_policy_edit_freezes_only_a_large_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    """gc.freeze() pins every object alive at that moment for good (open connections, TLS buffers): a bulk
    load freezes, a rebuild freezes only an inventory of FREEZE_MIN_NODES or more, whose full collections
    would otherwise cost the requests they interrupt."""
    freezes: list[int] = []
    monkeypatch.setattr(state_mod.gc, "freeze", lambda: freezes.append(1))
    state = State(default_policy())
    state.set_nodes(NODES[:4], "test")
    assert freezes == [1]
    head = "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\n"
    state.set_policy(parse_policy_text(head + "inference: {warmPool: 2}\n"), "file:p")
    assert state.snapshot().inventory.node_count == 4 and freezes == [1]
    monkeypatch.setattr(state_mod, "FREEZE_MIN_NODES", 4)  # the boundary: 4 nodes now freeze, 3 would not
    state.set_policy(parse_policy_text(head + "inference: {warmPool: 3}\n"), "file:p")
    assert freezes == [1, 1]
    monkeypatch.setattr(state_mod, "FREEZE_MIN_NODES", 5)
    state.set_policy(parse_policy_text(head + "inference: {warmPool: 4}\n"), "file:p")
    assert freezes == [1, 1]


def test_serve_builds_its_inventory_from_a_json_node_list(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "NodeList", "items": NODES}))
    srv = ServerProcess(nodes=path)
    try:
        with srv.client() as c:
            ready = c.get("/readyz").json()
    finally:
        srv.stop()
    inv = ready.get("details", ready)["inventory"]
    assert inv["source"] == f"file:{path}" and inv["gpuNodes"] == len(inventory_of(NODES)["nodes"])
