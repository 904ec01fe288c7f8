"""gpu-memory on DRA clusters: the DeviceClasses `gpu-admission policy deviceclasses` generates (policies/dra.py
tier_classes), how they are read back, and the gpu-memory-class mutation's best fit (policies/mutations.py
choose_class). The golden cases tests/cases/dra/gpu-memory-class-*.yaml show whole verdicts; the e2e test in
tests/e2e/test_dra_e2e.py shows the real scheduler allocating the chosen class's devices."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.dra import slim_class
from policies import dra, mig
from policies import inventory as inventory_mod
from policies.document import default_policy
from policies.engine import review
from policies.mutations import choose_class

ROOT = Path(__file__).resolve().parent.parent
TIERS_CLUSTER = ROOT / "examples" / "cluster" / "dra-memory.yaml"
GIB = 2**30


def _objects(path: Path = TIERS_CLUSTER) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load(path.read_text())["items"]
    return items


def _slices(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "ResourceSlice"]


def _device(name: str, kind: Any, memory: Any = "80Gi", profile: Any = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {"type": {"string": kind}}
    if profile is not None:
        attrs["profile"] = {"string": profile}
    return {"name": name, "attributes": attrs, "capacity": {"memory": {"value": memory}}}


def _slice(node: str, devices: list[Any], driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"kind": "ResourceSlice", "spec": {"driver": driver, "nodeName": node, "devices": devices}}


INVENTORY = inventory_mod.build_cluster(_objects(), default_policy())


# -- generated classes --------------------------------------------------------------------------------------


def test_one_class_per_gpu_memory_size_and_mig_profile_read_back_as_tiers() -> None:
    generated = dra.tier_classes(_slices(_objects()))
    names = [c["metadata"]["name"] for c in generated]
    assert names == [
        "gpu-48gi.gpu-admission.io",
        "gpu-80gi.gpu-admission.io",
        "mig-1g.10gb.gpu-admission.io",
        "mig-3g.40gb.gpu-admission.io",
    ]
    read = [dra.class_from_object(c) for c in generated]
    assert [(c.kind, c.memory, c.profile, c.tier) for c in read if c] == [
        ("gpu", 48 * GIB, "", True),
        ("gpu", 80 * GIB, "", True),
        ("mig", 0, "1g.10gb", True),
        ("mig", 0, "3g.40gb", True),
    ]
    # What the file holds is what the command prints for its slices (the golden cases depend on it).
    in_file = [o for o in _objects() if o["kind"] == "DeviceClass" and o["metadata"]["name"] in names]
    assert in_file == generated


def test_malformed_devices_other_drivers_and_media_profiles_make_no_class() -> None:
    slices = [
        _slice(
            "n1",
            [
                _device("a", "gpu", memory="lots"),
                _device("b", "gpu", memory=None),
                _device("c", "mig", profile=None),
                _device("d", "mig", profile="1g.10gb+me"),
                _device("e", "mig", profile="1G.10GB"),
                _device("f", "vfio"),
                _device("g", "gpu", memory="81559Mi"),
                _device("h", "gpu", memory="1000"),
                _device("i", "mig", profile="2g.20gb"),
                "not a device",
            ],
        ),
        _slice("n2", [_device("x", "gpu", memory="40Gi")], driver="gpu.example.com"),
        {"kind": "ResourceSlice", "spec": {"driver": "gpu.nvidia.com", "devices": [_device("y", "gpu", "24Gi")]}},
        {"kind": "ResourceSlice", "spec": ["not", "a", "mapping"]},
        "garbage",
    ]
    generated = dra.tier_classes(slices)  # type: ignore[arg-type]
    assert [c["metadata"]["name"] for c in generated] == [
        "gpu-1000.gpu-admission.io",
        "gpu-81559mi.gpu-admission.io",
        "mig-2g.20gb.gpu-admission.io",
    ]
    assert [c["metadata"]["labels"][dra.TIER_LABEL] for c in generated] == ["1000", "81559Mi", "2g.20gb"]
    assert "quantity('81559Mi')) >= 0" in generated[1]["spec"]["selectors"][0]["cel"]["expression"]


def test_any_positive_memory_capacity_is_a_tier_and_zero_is_none() -> None:
    devices = [_device("zero", "gpu", memory="0"), _device("one-byte", "gpu", memory="1")]
    assert [c["metadata"]["name"] for c in dra.tier_classes([_slice("n", devices)])] == ["gpu-1.gpu-admission.io"]


def test_at_most_max_tiers_classes() -> None:
    devices = [_device(f"g{i}", "gpu", memory=f"{i + 1}Gi") for i in range(dra.MAX_TIERS + 5)]
    assert len(dra.tier_classes([_slice("n", devices)])) == dra.MAX_TIERS


def test_only_labelled_classes_whose_cel_reads_as_a_tier_are_tiers() -> None:
    def cls(name: str, cel: str, labelled: bool = True) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if labelled:
            meta["labels"] = {dra.TIER_LABEL: "x"}
        return {"kind": "DeviceClass", "metadata": meta, "spec": {"selectors": [{"cel": {"expression": cel}}]}}

    gpu, mig_ = "device.attributes['gpu.nvidia.com'].type == 'gpu'", "device.attributes['gpu.nvidia.com'].type == 'mig'"
    at_least = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
    classes = dra.classes_from_objects(
        [
            cls("admin-mig", f"{mig_} && device.attributes['gpu.nvidia.com'].profile == '1g.10gb'", labelled=False),
            cls("admin-40", f"{gpu} && {at_least}", labelled=False),
            cls("no-floor", gpu),
            cls("no-profile", mig_),
            cls("t-40", f"{gpu} && {at_least}"),
            cls("t-mig", f"{mig_} && device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"),
        ]
    )
    assert [c.name for c in classes.tiers] == ["t-40", "t-mig"]


def test_the_server_keeps_a_class_labels() -> None:
    full = {
        "kind": "DeviceClass",
        "metadata": {"name": "c", "labels": {dra.TIER_LABEL: "80Gi"}, "managedFields": [{"x": 1}], "uid": "u"},
        "spec": {"selectors": []},
        "status": {},
    }
    assert slim_class(full) == {
        "kind": "DeviceClass",
        "metadata": {"name": "c", "labels": {dra.TIER_LABEL: "80Gi"}},
        "spec": {"selectors": []},
    }
    assert slim_class("garbage") is None
    assert slim_class({"kind": "DeviceClass", "metadata": {"name": "c", "labels": "bad"}})["metadata"] == {"name": "c"}


# -- best fit -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ask", "chosen"),
    [
        ("1Mi", "mig-1g.10gb"),
        ("10Gi", "mig-1g.10gb"),  # the profile's nominal size, as gpu-slice reads MIG names (docs/policy.md)
        ("10241Mi", "mig-3g.40gb"),
        ("40Gi", "mig-3g.40gb"),
        ("40961Mi", "gpu-48gi"),
        ("48Gi", "gpu-48gi"),
        ("49153Mi", "gpu-80gi"),
        ("80Gi", "gpu-80gi"),
        ("81921Mi", None),
    ],
)
def test_the_smallest_device_that_holds_the_ask_is_chosen(ask: str, chosen: str | None) -> None:
    from policies.quantity import parse_bytes

    cls = choose_class(INVENTORY.candidates({}), INVENTORY.classes.tiers, parse_bytes(ask), allow_shared=True)
    assert (cls.name.removesuffix(".gpu-admission.io") if cls else None) == chosen


def _h100(memory: str, tiers: list[str]) -> inventory_mod.Inventory:
    """One DRA H100 node whose slice publishes `memory` per GPU, and generated tier classes of these floors."""
    objs: list[dict[str, Any]] = [
        {
            "kind": "Node",
            "metadata": {"name": "h", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"allocatable": {"cpu": "8"}},
        },
        _slice("h", [_device("gpu-0", "gpu", memory=memory)]),
        {
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"extendedResourceName": "nvidia.com/gpu"},
        },
    ]
    for floor in tiers:
        generated = dra.tier_classes([_slice("x", [_device("g", "gpu", memory=floor)])])
        objs += generated
    return inventory_mod.build_cluster(objs, default_policy())


def test_a_tier_is_chosen_by_the_memory_the_slice_publishes_not_the_nominal_size() -> None:
    """An H100 "80GB" publishes 81559Mi: its generated class asks at least that, so an 80Gi ask (81920Mi) cannot
    be promised by it (left to gpu-slice: a whole GPU through gpu.nvidia.com); a 79Gi ask can."""
    inv = _h100("81559Mi", ["81559Mi"])
    cls = choose_class(inv.candidates({}), inv.classes.tiers, 80 * GIB, allow_shared=True)
    assert cls is None
    cls = choose_class(inv.candidates({}), inv.classes.tiers, 79 * GIB, allow_shared=True)
    assert cls is not None and cls.name == "gpu-81559mi.gpu-admission.io"
    # A floor above what any slice publishes (a class left from removed GPUs) selects nothing here.
    stale = _h100("81559Mi", ["94Gi"])
    assert choose_class(stale.candidates({}), stale.classes.tiers, 40 * GIB, allow_shared=True) is None
    # The smallest floor that covers the ask, not the largest the GPU reaches.
    two = _h100("80Gi", ["24Gi", "48Gi", "80Gi"])
    cls = choose_class(two.candidates({}), two.classes.tiers, 30 * GIB, allow_shared=True)
    assert cls is not None and cls.name == "gpu-48gi.gpu-admission.io"


# -- whole reviews: idempotent, never a class that does not hold the ask --------------------------------------


def _pod(memory: str, kind: str) -> dict[str, Any]:
    container = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    spec: dict[str, Any] = {"containers": [container]}
    ann = {"gpu-admission.io/gpu-memory": memory}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": ann}, "spec": spec}
    template = {"metadata": {"annotations": ann, "labels": {"app": "a"}}, "spec": {**spec, "restartPolicy": "Never"}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": template}}


def _size(cls: dra.DeviceClass) -> int:
    """The memory a class promises: its floor, or its MIG profile's nominal size."""
    if cls.kind == "gpu":
        return cls.memory
    parsed = mig.parse_mig_resource(f"nvidia.com/mig-{cls.profile}")
    assert parsed is not None
    return parsed.memory_gb * GIB


@settings(max_examples=150, deadline=None)
@given(mib=st.integers(min_value=1, max_value=100 * 1024), kind=st.sampled_from(["Pod", "Job"]))
def test_gpu_memory_class_holds_the_ask_best_fit_and_a_second_pass_changes_nothing(mib: int, kind: str) -> None:
    policy = default_policy()
    obj = _pod(f"{mib}Mi", kind)
    first = review(copy.deepcopy(obj), policy=policy, inventory=INVENTORY)
    second = review(copy.deepcopy(first.object), policy=policy, inventory=INVENTORY)
    assert second.patch == () and second.mutations == ()
    ask = mib * 2**20
    if ask > 80 * GIB:
        assert not first.allowed and "gpu-memory-class" not in first.mutations
        return
    assert first.allowed and first.mutations == ("gpu-memory-class",), first
    spec = first.object["spec"] if kind == "Pod" else first.object["spec"]["template"]["spec"]
    (name,) = spec["containers"][0]["resources"]["limits"]
    cls = INVENTORY.classes.get(name.removeprefix(dra.EXTENDED_PREFIX))
    assert cls is not None and cls.usable_tier and _size(cls) >= ask
    assert _size(cls) == min(_size(c) for c in INVENTORY.classes.tiers if _size(c) >= ask)


# -- the command ------------------------------------------------------------------------------------------------


def _deviceclasses(path: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", "policy", "deviceclasses", "--nodes", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_policy_deviceclasses_prints_applicable_classes_or_a_one_line_error(tmp_path: Path) -> None:
    ok = _deviceclasses(TIERS_CLUSTER)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("# gpu-admission policy deviceclasses: 4 DeviceClasses; apply with kubectl apply -f -")
    printed = [o for o in yaml.safe_load_all(ok.stdout) if o]
    assert printed == dra.tier_classes(_slices(_objects()))

    none = _deviceclasses(ROOT / "examples" / "cluster" / "nodes.yaml")  # a device-plugin cluster: no slices
    assert none.returncode == 1 and none.stdout == ""
    assert none.stderr.strip().endswith("no GPU or MIG device in a gpu.nvidia.com ResourceSlice: nothing to generate")

    missing = _deviceclasses(tmp_path / "absent.yaml")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1

    wrong = tmp_path / "cm.yaml"
    wrong.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    bad = _deviceclasses(wrong)
    assert bad.returncode == 2 and "found kind 'ConfigMap'" in bad.stderr and "Traceback" not in bad.stderr


def test_the_documented_example_gets_the_3g_40gb_class() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "webhook", "check", "-f", "examples/dra-memory", "--nodes", str(TIERS_CLUSTER)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["ALLOW Pod research/notebook [-]", "  mutated  gpu-memory-class (2 patch ops)"]


def test_a_device_only_a_claim_reaches_and_no_class_selects_is_never_the_best_fit() -> None:
    """MIG 1g.10gb devices published without their class (only the 80Gi tier was applied): a 10Gi ask cannot get
    them by any name, so the best fit among what it can get is the 48Gi tier (the L40S), not "leave it to gpu-slice"."""
    objs = [o for o in _objects() if o["kind"] != "DeviceClass" or not o["metadata"]["name"].startswith("mig-")]
    inv = inventory_mod.build_cluster(objs, default_policy())
    cls = choose_class(inv.candidates({}), inv.classes.tiers, 10 * GIB, allow_shared=True)
    assert cls is not None and cls.name == "gpu-48gi.gpu-admission.io"


def test_no_class_for_a_gpu_the_node_labels_time_sliced() -> None:
    """GFD's time-slicing label on a DRA node makes its GPUs shared units (memory / replicas): no memory tier
    promises a share's memory, so the pod stays on gpu-slice's path."""
    inv = _h100("80Gi", ["80Gi"])
    objs: list[dict[str, Any]] = [
        {
            "kind": "Node",
            "metadata": {
                "name": "h",
                "labels": {
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "nvidia.com/gpu.sharing-strategy": "time-slicing",
                    "nvidia.com/gpu.replicas": "2",
                },
            },
            "status": {"allocatable": {"cpu": "8"}},
        },
        _slice("h", [_device("gpu-0", "gpu", memory="80Gi")]),
        *[o for o in _objects() if o["kind"] == "DeviceClass"],
    ]
    shared = inventory_mod.build_cluster(objs, default_policy())
    assert choose_class(inv.candidates({}), inv.classes.tiers, 30 * GIB, allow_shared=True) is not None
    assert choose_class(shared.candidates({}), shared.classes.tiers, 30 * GIB, allow_shared=True) is None


def test_a_resource_the_node_allocatable_names_stays_the_device_plugins() -> None:
    """A node whose device plugin advertises nvidia.com/gpu while a DRA driver publishes slices too: the Node's
    allocatable wins (as for the offers), so its GPUs get no class: gpu-slice's path."""
    objs: list[dict[str, Any]] = [
        {
            "kind": "Node",
            "metadata": {"name": "h", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8"}},
        },
        _slice("h", [_device(f"gpu-{i}", "gpu", memory="80Gi") for i in range(8)]),
        *[o for o in _objects() if o["kind"] == "DeviceClass"],
    ]
    inv = inventory_mod.build_cluster(objs, default_policy())
    assert choose_class(inv.candidates({}), inv.classes.tiers, 30 * GIB, allow_shared=True) is None


def test_a_node_is_as_large_as_the_memory_its_slices_publish() -> None:
    """A card publishing more memory than its product's nominal size (94Gi on an "80GB" H100 label): the node
    holds a gpu-memory ask up to what is published, which gpu-request-fits compares."""
    inv = _h100("94Gi", ["80Gi"])
    assert inv.max_memory_bytes == 94 * GIB
    assert [n.memory_bytes for n in inv.nodes] == [94 * GIB]
    asked = review(_pod("90Gi", "Pod"), policy=default_policy(), inventory=inv)
    assert not [d for d in asked.denials if d.rule == "gpu-request-fits"], asked.denials
    smaller = _h100("79Gi", ["79Gi"])  # less than nominal: the nominal size stays the node's
    assert smaller.max_memory_bytes == 80 * GIB


def test_whole_gpus_no_class_serves_by_name_stay_claim_only_after_their_memory_is_read() -> None:
    """No DeviceClass maps nvidia.com/gpu (no gpu.nvidia.com class applied): the published whole GPUs are
    reachable by claims only. An L40S (48Gi) that no generated floor fits for a 30Gi ask is then no offer at
    all, so the 80Gi tier of the H100 is the best fit, not "leave it to gpu-slice"."""
    objs: list[dict[str, Any]] = []
    for name, product, memory in (("l", "NVIDIA-L40S", "48Gi"), ("h", "NVIDIA-H100-80GB-HBM3", "80Gi")):
        objs.append(
            {
                "kind": "Node",
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
                "status": {"allocatable": {"cpu": "8"}},
            }
        )
        objs.append(_slice(name, [_device("gpu-0", "gpu", memory=memory)]))
    objs += dra.tier_classes([_slice("x", [_device("g", "gpu", memory="80Gi")])])
    inv = inventory_mod.build_cluster(objs, default_policy())
    assert all(o.claim_only for n in inv.nodes for o in n.offers), [n.offers for n in inv.nodes]
    cls = choose_class(inv.candidates({}), inv.classes.tiers, 30 * GIB, allow_shared=True)
    assert cls is not None and cls.name == "gpu-80gi.gpu-admission.io"
