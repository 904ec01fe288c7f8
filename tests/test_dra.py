"""DRA (resource.k8s.io/v1) read into the device-plugin vocabulary: classes, slices, claims, and how the server
keeps them (golden cases in tests/cases/dra/ are the behaviour; these pin the parts)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.dra import SliceIndex, slim_slice, slim_spec
from cluster.reflector import Change
from policies import dra
from policies import inventory as inventory_mod
from policies.document import default_policy
from policies.resources import GPU, GPU_SHARED, pod_ask
from webhook.state import State

ROOT = Path(__file__).resolve().parent.parent
DRA_CLUSTER = ROOT / "examples" / "cluster" / "dra.yaml"


def _cluster() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load(DRA_CLUSTER.read_text())["items"]
    return items


def _device(kind: str, product: str = "NVIDIA H100 80GB HBM3", memory: str = "80Gi", **attrs: str) -> dict[str, Any]:
    a = {"type": {"string": kind}, "productName": {"string": product}, **{k: {"string": v} for k, v in attrs.items()}}
    return {"name": f"{kind}-x", "attributes": a, "capacity": {"memory": {"value": memory}}}


def _slice(node: str, devices: list[dict[str, Any]], driver: str = "gpu.nvidia.com", name: str = "") -> dict[str, Any]:
    return {
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-slice"},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": devices},
    }


# -- classes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cel", "name", "kind", "profile"),
    [
        ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'", "a", "gpu", ""),
        ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'", "b", "mig", ""),
        (
            "device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == "
            "'2g.20gb'",
            "c",
            "mig",
            "2g.20gb",
        ),
        ("device.attributes['gpu.nvidia.com'].type == 'vfio'", "d", "other", ""),
        ("device.driver == 'compute-domain.nvidia.com'", "x-channel", "channel", ""),
        ("device.driver == 'compute-domain.nvidia.com'", "compute-domain-daemon.nvidia.com", "other", ""),
        ("device.driver == 'nic.example.com'", "e", "other", ""),
    ],
)
def test_a_class_is_read_by_what_its_cel_selects(cel: str, name: str, kind: str, profile: str) -> None:
    obj = {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": cel}}]}}
    c = dra.class_from_object(obj)
    assert c is not None and (c.kind, c.profile) == (kind, profile)


@pytest.mark.parametrize("meta", ["not-a-mapping", {}, {"name": ""}, {"name": 5}, {"name": ["x"]}])
def test_a_class_without_a_name_string_is_none_not_an_error(meta: Any) -> None:
    assert dra.class_from_object({"metadata": meta, "spec": {"extendedResourceName": "example.com/gpu"}}) is None


@pytest.mark.parametrize(("extended", "read"), [("example.com/gpu", "example.com/gpu"), (5, ""), (None, ""), ([], "")])
def test_an_extended_resource_name_that_is_not_a_string_is_none(extended: Any, read: str) -> None:
    c = dra.class_from_object({"metadata": {"name": "c"}, "spec": {"extendedResourceName": extended}})
    assert c is not None and c.extended == read


def test_classes_served_know_only_their_own_names_and_the_first_sorted_owns_an_extended_resource() -> None:
    served = dra.classes_from_objects(
        [
            {"metadata": {"name": "z-gpu"}, "spec": {"extendedResourceName": "example.com/gpu"}},
            {"metadata": {"name": "a-gpu"}, "spec": {"extendedResourceName": "example.com/gpu"}},
            {"metadata": {}, "spec": {}},  # no name: skipped
        ]
    )
    assert served.get("gpu.nvidia.com") is None and served.get("a-gpu") is not None
    mapped = served.for_extended("example.com/gpu")
    assert mapped is not None and mapped.name == "a-gpu"
    assert dra.Classes().get("gpu.nvidia.com") == dra.BUILT_IN["gpu.nvidia.com"]  # not served: the driver's


# -- slices -----------------------------------------------------------------------------------------------


def test_slices_become_device_plugin_offers_per_node() -> None:
    found = dra.node_devices(
        [
            _slice("n1", [_device("gpu"), _device("gpu", memory="94Gi")]),
            _slice("n1", [_device("mig", "NVIDIA A100", "9856Mi", profile="1g.10gb")], name="n1-b"),
            _slice("n2", [_device("vfio")]),  # passthrough devices are not pod GPUs
            _slice("n3", [_device("gpu")], driver="compute-domain.nvidia.com"),  # another driver
            {"spec": {"driver": "gpu.nvidia.com", "devices": [_device("gpu")]}},  # no node: network-attached
            {"spec": "garbage"},
        ]
    )
    assert set(found) == {"n1"}
    n1 = found["n1"]
    assert n1.resources == {GPU: 2, "nvidia.com/mig-1g.10gb": 1}
    assert n1.product == "NVIDIA-H100-80GB-HBM3" and n1.memory_bytes == 94 * 2**30


def test_the_inventory_counts_slice_gpus_and_keeps_node_allocatable_first() -> None:
    inv = inventory_mod.build_cluster(_cluster(), default_policy())
    by_name = {n.name: n for n in inv.nodes}
    assert by_name["dra-a-1"].whole_gpus == 8 and by_name["dra-a-1"].whole_card
    assert by_name["dra-mig-1"].partitioned
    offers = {o.resource for o in by_name["dra-mig-1"].offers}
    assert offers == {GPU, "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"}
    assert inv.max_rack_gpus == 16 and inv.classes.served
    node = {"metadata": {"name": "n", "labels": {}}, "status": {"allocatable": {GPU: "4"}}}
    both = inventory_mod.node_from_object(node, (), dra.NodeDevices({GPU: 8}, "", 0))
    assert both is not None and both.whole_gpus == 4  # the Node's own allocatable wins


# -- claims -----------------------------------------------------------------------------------------------


def _lookup(*objects: dict[str, Any], classes: dra.Classes | None = None) -> dra.Lookup:
    index = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
    return dra.Lookup(classes or dra.Classes(), lambda k, ns, n: index.get((k, ns, n)), "ml")


def _template(name: str, requests: list[Any], config: list[Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if config is not None:
        devices["config"] = config
    return {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"spec": {"devices": devices}},
    }


MPS = {"strategy": "MPS"}


def test_a_claim_shared_by_two_containers_counts_once_and_names_its_request() -> None:
    t = _template(
        "t",
        [
            {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
            {"name": "b", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}},
        ],
        [
            {
                "requests": ["b"],
                "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig", "sharing": MPS}},
            }
        ],
    )
    pod = {
        "spec": {
            "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}],
            "containers": [
                {"name": "one", "resources": {"claims": [{"name": "g", "request": "b"}]}},
                {"name": "two", "resources": {"claims": [{"name": "g"}]}},
                {"name": "three", "resources": {"claims": [{"name": "g"}]}},
            ],
        }
    }
    ask = pod_ask(pod, _lookup(t))
    claimed = {c.name: dict(c.claimed) for c in ask.containers}
    assert claimed == {"one": {GPU_SHARED: 1}, "two": {GPU: 2}, "three": {}}
    assert ask.whole_gpus == 2 and ask.units() == {GPU: 2, GPU_SHARED: 1}
    assert [a.sharing for a in ask.claim_asks()] == ["", "MPS"]


def test_a_pod_without_claims_is_not_read_for_them() -> None:
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {GPU: 1}}}]}}
    assert pod_ask(pod, _lookup()).claims is None


@pytest.mark.parametrize("section", ["limits", "requests"])
@pytest.mark.parametrize("name", [dra.EXTENDED_PREFIX + "whole-gpu", "example.com/gpu"])
def test_a_dra_extended_resource_alone_makes_the_pod_read_for_claims(section: str, name: str) -> None:
    """pod_ask notices a DeviceClass's extended resource (the implicit prefix, or a class's
    extendedResourceName) in the same pass that reads nvidia.com/ names, in limits or requests alone."""
    gpu = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    served = dra.classes_from_objects(
        [
            {
                "metadata": {"name": "whole-gpu"},
                "spec": {"selectors": [{"cel": {"expression": gpu}}], "extendedResourceName": "example.com/gpu"},
            }
        ]
    )
    pod = {"spec": {"containers": [{"name": "c", "resources": {section: {"cpu": "1", name: "2"}}}]}}
    ask = pod_ask(pod, _lookup(classes=served))
    assert ask.claims is not None and ask.whole_gpus == 2 and ask.asks_gpu
    assert pod_ask(pod).claims is None and pod_ask(pod).whole_gpus == 0  # no lookup: device-plugin names only
    other = {"spec": {"containers": [{"name": "c", "resources": {section: {"example.com/other": "2"}}}]}}
    assert pod_ask(other, _lookup(classes=served)).claims is None


# -- the server's caches ------------------------------------------------------------------------------------


def test_slices_are_cut_down_and_indexed_by_node() -> None:
    full = _slice("n1", [{**_device("gpu"), "attributes": {**_device("gpu")["attributes"], "uuid": {"string": "u"}}}])
    slim = slim_slice(full)
    assert slim is not None and "uuid" not in slim["spec"]["devices"][0]["attributes"]
    index = SliceIndex()
    assert index.apply(Change("ADDED", "n1-slice", None, slim)) == {"n1"}
    assert len(index.slices("n1")) == 1
    assert index.apply(Change("DELETED", "n1-slice", slim, None)) == {"n1"} and index.slices("n1") == []
    claim = slim_spec({"kind": "ResourceClaim", "metadata": {"name": "c", "managedFields": [1]}, "status": {"x": 1}})
    assert claim == {"kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": None}


def test_serve_nodes_file_reads_slices_and_classes_like_check() -> None:
    state = State()
    state.set_nodes(_cluster(), "file:dra.yaml")
    inv = state.snapshot().inventory
    assert inv.max_whole_gpus == 8 and inv.classes.served
    assert state.ready()[1]["dra"]["nodesWithDevices"] == 5


# -- check ----------------------------------------------------------------------------------------------


def test_check_judges_the_dra_examples() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "check", "-f", "examples/dra", "--nodes", str(DRA_CLUSTER), "-o", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    out = {f"{e['kind']}/{e['name']}": e for e in json.loads(result.stdout)}
    job = out["Job/llama3-8b-dra"]
    assert job["allowed"] and job["mutations"] == ["training-rack", "job-size"]
    assert [d["rule"] for d in out["Deployment/chat-api"]["denials"]] == ["online-no-timeslice"]
    assert [d["rule"] for d in out["Pod/llama3-70b-eval"]["denials"]] == ["gpu-request-fits"]


def test_check_names_a_kind_a_cluster_file_cannot_hold(tmp_path: Path) -> None:
    bad = tmp_path / "nodes.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "check", "-f", "examples/dra", "--nodes", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gpu-admission: error: nodes {bad}: expected Node, ResourceSlice, DeviceClass (or Pod) objects, found kind "
        "'ConfigMap'"
    ]


# -- hostile shapes ---------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 20) | st.text(max_size=12) | st.sampled_from(["gpu", "mig", "g"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=12,
)


def _plant(value: Any, path: tuple[Any, ...], into: Any) -> Any:
    """A copy of `into` with `value` at `path` (created where missing)."""
    out = copy.deepcopy(into)
    cur = out
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return out


GOOD_TEMPLATE = _template(
    "t",
    [
        {
            "name": "gpus",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2, "selectors": [{"cel": {"expression": "x"}}]},
        }
    ],
    [
        {
            "requests": ["gpus"],
            "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig", "sharing": MPS}},
        }
    ],
)
GOOD_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ml"},
    "spec": {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}],
        "containers": [
            {
                "name": "c",
                "resources": {"claims": [{"name": "gpus"}], "limits": {dra.EXTENDED_PREFIX + "gpu.nvidia.com": 1}},
            }
        ],
    },
}
POD_PATHS = [
    ("spec", "resourceClaims"),
    ("spec", "resourceClaims", 0),
    ("spec", "resourceClaims", 0, "name"),
    ("spec", "resourceClaims", 0, "resourceClaimTemplateName"),
    ("spec", "containers", 0, "resources", "claims"),
    ("spec", "containers", 0, "resources", "claims", 0, "name"),
    ("spec", "containers", 0, "resources", "limits"),
]
TEMPLATE_PATHS = [
    ("spec", "spec", "devices"),
    ("spec", "spec", "devices", "requests", 0),
    ("spec", "spec", "devices", "requests", 0, "exactly"),
    ("spec", "spec", "devices", "requests", 0, "exactly", "count"),
    ("spec", "spec", "devices", "requests", 0, "exactly", "deviceClassName"),
    ("spec", "spec", "devices", "requests", 0, "exactly", "selectors"),
    ("spec", "spec", "devices", "config", 0, "requests"),
    ("spec", "spec", "devices", "config", 0, "opaque", "parameters", "sharing"),
]


@settings(max_examples=150, deadline=None)
@given(value=JSON, pod_path=st.sampled_from(POD_PATHS), tpl_path=st.sampled_from(TEMPLATE_PATHS), where=st.booleans())
def test_any_value_anywhere_in_a_claim_gives_a_verdict(value: Any, pod_path: Any, tpl_path: Any, where: bool) -> None:
    pod = _plant(value, pod_path, GOOD_POD) if where else GOOD_POD
    tpl = GOOD_TEMPLATE if where else _plant(value, tpl_path, GOOD_TEMPLATE)
    lookup = _lookup(tpl, classes=dra.classes_from_objects([{"metadata": {"name": "gpu.nvidia.com"}, "spec": value}]))
    ask = pod_ask(pod, dra.Lookup(lookup.classes, lookup.resolve, "ml", lambda e: None if e == "x" else "bad"))
    assert all(isinstance(n, int) and n >= 0 for c in ask.containers for n in c.claimed.values())
    assert dra.node_devices([_slice("n", [value]), {"spec": value}, value]) is not None


def test_a_builtin_class_without_a_selector_keeps_its_kind_and_only_a_gpu_class_has_a_memory_floor() -> None:
    builtin = dra.class_from_object({"metadata": {"name": "gpu.nvidia.com"}, "spec": {}})
    assert builtin is not None and builtin.kind == "gpu"
    floor = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
    mig_cel = f"device.attributes['gpu.nvidia.com'].type == 'mig' && {floor}"
    selectors = [{"cel": {"expression": mig_cel}}]
    mig_class = dra.class_from_object({"metadata": {"name": "m"}, "spec": {"selectors": selectors}})
    assert mig_class is not None and (mig_class.kind, mig_class.memory) == ("mig", 0)


def _published(devices: list[dict[str, Any]]) -> dra.NodeDevices:
    spec = {"driver": "gpu.nvidia.com", "nodeName": "n", "devices": devices}
    return dra.node_devices([{"kind": "ResourceSlice", "spec": spec}])["n"]


def _dev(kind: str, memory: str | None = None, profile: str | None = None, product: str | None = None) -> Any:
    attrs: dict[str, Any] = {"type": {"string": kind}}
    if profile:
        attrs["profile"] = {"string": profile}
    if product:
        attrs["productName"] = {"string": product}
    caps = {"memory": {"value": memory}} if memory else {}
    return {"name": f"{kind}-{memory}-{profile}", "attributes": attrs, "capacity": caps}


def test_node_devices_count_every_device_and_keep_the_largest_gpu_memory() -> None:
    two = _published([_dev("vfio"), _dev("gpu", "94Gi"), _dev("gpu", "80Gi"), _dev("mig", profile="1g.10gb"),
                      _dev("mig", profile="1g.10gb")])  # fmt: skip
    assert two.resources == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 2}
    assert two.memory_bytes == 94 * 2**30  # the largest, whatever the order
    assert two.product == ""  # no productName published: unknown, not None
    no_memory = _published([_dev("gpu", None, product="NVIDIA H100 80GB HBM3")])
    assert (no_memory.memory_bytes, no_memory.product) == (0, "NVIDIA-H100-80GB-HBM3")
    mig_only = _published([_dev("mig", profile="3g.40gb")])
    assert mig_only.memory_bytes == 0
    garbage = [{**_dev("gpu"), "capacity": "junk"}, {**_dev("gpu"), "capacity": {"memory": {"value": [1]}}},
               {**_dev("gpu"), "capacity": {"memory": {"value": 1.5}}}]  # fmt: skip
    assert _published(garbage).memory_bytes == 0  # unreadable capacity: no memory, never an exception


def test_only_string_attributes_name_a_device_type_profile_and_product() -> None:
    """The driver publishes `type`, `profile` and `productName` as `string` attributes (resourceslice-attributes.md):
    a value in another form, or a `string` that holds no string, is not that attribute."""
    odd = [
        {"attributes": {"type": {"version": "gpu"}}},
        {"attributes": {"type": {"string": "mig"}, "profile": {"string": 7}}},
        {"attributes": {"type": {"string": "mig"}, "profile": {"int": 7}}},
        {"attributes": {"type": {"string": "gpu"}, "productName": {"string": 5}}},
        {"attributes": {"type": {"string": "gpu"}, "productName": {"version": "NVIDIA H100 80GB HBM3"}}},
    ]
    read = _published(odd)
    assert (dict(read.resources), read.product) == ({GPU: 2}, "")


def test_slices_of_other_drivers_or_of_no_node_are_passed_over_not_the_end_of_the_list() -> None:
    """A node's ComputeDomain slice, a pool bound to no node name and a slice without a device list may come
    before the GPU slices: each is skipped, and the slices after it are still read."""
    gpu = _dev("gpu", "80Gi")
    slices = [
        {"spec": {"driver": dra.CHANNEL_DRIVER, "nodeName": "a", "devices": [gpu]}},
        {"spec": {"driver": dra.NVIDIA_DRIVER, "nodeName": "", "devices": [gpu]}},
        {"spec": {"driver": dra.NVIDIA_DRIVER, "nodeName": 5, "devices": [gpu]}},
        {"spec": {"driver": dra.NVIDIA_DRIVER, "nodeName": "b", "devices": "gpu-0"}},
        {"spec": {"driver": dra.NVIDIA_DRIVER, "nodeName": "c", "devices": [gpu]}},
    ]
    assert list(dra.node_devices(slices)) == ["c"]
