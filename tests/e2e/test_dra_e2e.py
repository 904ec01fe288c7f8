"""GPUs through Dynamic Resource Allocation on the real control plane (Kubernetes >= 1.34: resource.k8s.io/v1):
fake GPU nodes whose GPUs are published as ResourceSlices of the NVIDIA driver (no kubelet, no driver: the
slices and DeviceClasses of examples/cluster/dra.yaml are created as the driver would create them), the
resourceclaim controller making each pod's claims from its templates, the real scheduler allocating devices and
binding, and the webhook judging and mutating what the API server stores.

This module runs its own Kubernetes 1.37 control plane (tests/e2e/cluster.py LATEST) with only the DRA nodes."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e import placement as pl
from tests.e2e.cluster import LATEST, ControlPlane, ControlPlaneError, build_binaries
from tests.e2e.test_webhook import RACK, apply, training_pods
from tests.e2e.webhook import Webhook
from tests.serverproc import ROOT

pytestmark = pytest.mark.e2e

DRA_FILE = ROOT / "examples" / "cluster" / "dra.yaml"
# CPU the test pods request: the a-2 / b-2 nodes get too little for a pod beside what they have, so without the
# webhook the scheduler (least allocated) puts a 2-pod job's pods on a-1 and b-1: across racks, every time.
POD_CPU = "100"
SMALL_NODES = ("dra-a-2", "dra-b-2")


def dra_objects() -> dict[str, list[dict[str, Any]]]:
    items = yaml.safe_load(DRA_FILE.read_text())["items"]
    out: dict[str, list[dict[str, Any]]] = {"Node": [], "ResourceSlice": [], "DeviceClass": []}
    for o in items:
        o = copy.deepcopy(o)
        if o["kind"] == "Node" and o["metadata"]["name"] in SMALL_NODES:
            for key in ("capacity", "allocatable"):
                o["status"][key]["cpu"] = "120"
        out[o["kind"]].append(o)
    return out


@pytest.fixture(scope="module")
def dra_cluster() -> Iterator[ControlPlane]:
    """Its own Kubernetes 1.37 control plane (DRA with DeviceClass extended resources), whatever the default."""
    cp = ControlPlane(build_binaries(release=LATEST))
    objs = dra_objects()
    try:
        cp.start()
        cp.create_nodes(objs["Node"])
        for kind in ("DeviceClass", "ResourceSlice"):
            cp.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": objs[kind]})
    except ControlPlaneError:
        cp.stop()
        raise
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def webhook(dra_cluster: ControlPlane) -> Iterator[Webhook]:
    wh = Webhook(dra_cluster)
    try:
        yield wh
    finally:
        wh.close()


@pytest.fixture
def namespace(dra_cluster: ControlPlane, webhook: Webhook, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; afterwards its pods are force-deleted (no kubelet finishes a graceful deletion) and
    the webhook's pod view has seen them go, so the next test finds every rack free."""
    cp = dra_cluster
    name = pl.new_namespace(cp, request.node.name.lower())
    try:
        yield name
    finally:
        cp.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=0", "--force", check=False)
        cp.kubectl("delete", "namespace", name, "--wait=false", check=False)
        pl.wait_pod_view(webhook, cp)


def wait_devices(wh: Webhook, nodes: int, timeout: float = 30.0) -> dict[str, Any]:
    """Until the webhook's inventory has the slices' devices of `nodes` nodes (a watch on ResourceSlices)."""
    assert wh.server is not None
    deadline = time.monotonic() + timeout
    got: Any = None
    with wh.server.client() as c:
        while time.monotonic() < deadline:
            got = c.get("/readyz").json()
            dra = got.get("dra", {})
            if (
                dra.get("nodesWithDevices") == nodes
                and dra.get("deviceClasses")
                and got["inventory"]["gpuNodes"] >= nodes
            ):
                return dict(got)
            time.sleep(0.2)
    raise AssertionError(f"webhook DRA inventory never showed {nodes} nodes: {got}")


def template(name: str, count: int = 1, sharing: str = "") -> dict[str, Any]:
    devices: dict[str, Any] = {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]
    }
    if sharing:
        params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": sharing}}
        devices["config"] = [{"requests": ["gpus"], "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


def claim_pods(job: str, n: int, gpus: int, *, claims: bool = True, limits: dict[str, str] | None = None) -> list[Any]:
    """The Kubeflow-style pods of tests/e2e/test_webhook.py taking their GPUs through the template `gpus-<job>`
    (or, with `limits`, through extended resources a DeviceClass serves) instead of device-plugin resources."""
    pods = training_pods(job, n, gpus)
    for pod in pods:
        spec = pod["spec"]
        spec["terminationGracePeriodSeconds"] = 0
        container = spec["containers"][0]
        container["resources"] = {"requests": {"cpu": POD_CPU}, "limits": {"cpu": POD_CPU, **(limits or {})}}
        if claims:
            spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": f"gpus-{job}"}]
            container["resources"]["claims"] = [{"name": "gpus"}]
    return pods


def racks(cp: ControlPlane, ns: str, pods: list[str]) -> dict[str, str]:
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in cp.get_json("nodes")["items"]}
    out = {}
    for p in pods:
        node = cp.wait_for_scheduled(ns, p, timeout=90)
        out[p] = f"{labels[node].get(RACK, '?')}/{node}"
    return out


def allocated_devices(cp: ControlPlane, ns: str) -> dict[str, int]:
    """Devices the scheduler allocated, per node (from the ResourceClaims' status)."""
    out: dict[str, int] = {}
    for claim in cp.get_json("resourceclaims", "-n", ns)["items"]:
        for r in (claim.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", []):
            out[r["pool"]] = out.get(r["pool"], 0) + 1
    return out


def test_claim_based_2x8_training_lands_in_one_rack_and_without_the_webhook_it_does_not(
    dra_cluster: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = dra_cluster
    wait_devices(webhook, 5)
    cp.kubectl("label", "namespace", namespace, "gpu-admission.io/enforcement=off")
    r = apply(cp, namespace, [template("gpus-baseline", 8), *claim_pods("baseline", 2, 8)])
    assert r.returncode == 0, r.stderr
    before = racks(cp, namespace, ["baseline-worker-0", "baseline-worker-1"])
    print("without the webhook:", before, allocated_devices(cp, namespace))
    assert "affinity" not in cp.get_json("pod", "baseline-worker-0", "-n", namespace)["spec"]
    assert len({v.split("/")[0] for v in before.values()}) == 2, f"baseline did not cross racks: {before}"
    cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
    cp.kubectl("delete", "resourceclaims", "--all", "-n", namespace, "--wait=true")

    cp.kubectl("label", "namespace", namespace, "gpu-admission.io/enforcement=enforce", "--overwrite")
    r = apply(cp, namespace, [template("gpus-llama", 8)])
    assert r.returncode == 0, r.stderr
    time.sleep(1.0)  # the webhook reads templates from its watch cache: let the template reach it
    r = apply(cp, namespace, claim_pods("llama", 2, 8))
    assert r.returncode == 0, r.stderr
    stored = cp.get_json("pod", "llama-worker-0", "-n", namespace)["spec"]
    req = stored["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert req[0]["topologyKey"] == RACK
    assert req[0]["labelSelector"]["matchLabels"] == {"training.kubeflow.org/job-name": "llama"}
    after = racks(cp, namespace, ["llama-worker-0", "llama-worker-1"])
    devices = allocated_devices(cp, namespace)
    print("with the webhook:", after, devices)
    assert len({v.split("/")[0] for v in after.values()}) == 1, f"job crossed racks: {after}"
    assert sorted(devices.values()) == [8, 8], devices  # the scheduler allocated 8 GPUs on each node


def gpu_claims_seen(wh: Webhook) -> int:
    """ResourceClaims the webhook's pod view counts as holding GPUs on a node (/readyz podView.gpuClaims)."""
    assert wh.server is not None
    with wh.server.client() as c:
        return int(c.get("/readyz").json()["podView"].get("gpuClaims", -1))


@pytest.mark.parametrize("held_rack", ["rack-a", "rack-b"])
def test_gpus_held_through_claims_steer_the_next_job_to_the_free_rack(
    dra_cluster: ControlPlane, webhook: Webhook, namespace: str, held_rack: str
) -> None:
    """A pod holding a node's 8 GPUs through a claim (the scheduler's allocation in the claim's status; the pod
    asks no device-plugin GPU) leaves its rack 8 GPUs short: the webhook's pod view counts the claim, so a 2x8
    job is given the other rack and binds whole there. Both racks in turn: a view blind to claims sees two
    equal racks and picks the same one both times, stranding a pod in one of the two runs."""
    cp = dra_cluster
    wait_devices(webhook, 5)
    node = {"rack-a": "dra-a-1", "rack-b": "dra-b-1"}[held_rack]
    busy = pl.new_namespace(cp, "held", {"gpu-admission.io/enforcement": "off"})
    try:
        hog = claim_pods("hog", 1, 8)[0]
        hog["metadata"] = {"name": "hog"}
        hog["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        hog["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
        hog["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1"
        r = apply(cp, busy, [template("gpus-hog", 8), hog])
        assert r.returncode == 0, r.stderr
        assert cp.wait_for_scheduled(busy, "hog", timeout=90) == node
        assert allocated_devices(cp, busy) == {node: 8}
        deadline = time.monotonic() + 30
        while gpu_claims_seen(webhook) != 1:
            assert time.monotonic() < deadline, f"the pod view never counted the claim: {gpu_claims_seen(webhook)}"
            time.sleep(0.2)

        r = apply(cp, namespace, [template("gpus-next", 8)])
        assert r.returncode == 0, r.stderr
        time.sleep(1.0)  # the webhook reads templates from its watch cache: let the template reach it
        r = apply(cp, namespace, claim_pods("next", 2, 8))
        assert r.returncode == 0, r.stderr
        placed = racks(cp, namespace, ["next-worker-0", "next-worker-1"])
        print(f"{held_rack} held on {node}:", placed, allocated_devices(cp, namespace))
        free_rack = {"rack-a": "rack-b", "rack-b": "rack-a"}[held_rack]
        assert {v.split("/")[0] for v in placed.values()} == {free_rack}, placed
    finally:  # both namespaces' claims gone from the view too: the other rack's run starts from free racks
        for ns in (busy, namespace):
            cp.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)
            cp.kubectl("delete", "resourceclaims", "--all", "-n", ns, "--wait=true", check=False)
        cp.kubectl("delete", "namespace", busy, "--wait=false", check=False)
        deadline = time.monotonic() + 30
        while gpu_claims_seen(webhook) != 0 and time.monotonic() < deadline:
            time.sleep(0.2)


def test_claim_based_time_sliced_gpu_for_online_inference_is_denied(
    dra_cluster: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = dra_cluster
    r = apply(cp, namespace, [template("shared-gpu", 1, sharing="TimeSlicing")])
    assert r.returncode == 0, r.stderr
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat-api"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "chat-api"}},
            "template": {
                "metadata": {"labels": {"app": "chat-api"}},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "shared-gpu"}],
                    "containers": [
                        {
                            "name": "server",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            },
        },
    }
    deadline = time.monotonic() + 20
    while True:  # until the template is in the webhook's cache (before, the claim is allowed with a warning)
        r = apply(cp, namespace, [deployment])
        if r.returncode != 0 or time.monotonic() > deadline:
            break
        cp.kubectl("delete", "deployment", "chat-api", "-n", namespace, "--wait=true")
        time.sleep(0.5)
    assert r.returncode != 0, f"time-sliced claim for online inference was allowed: {r.stdout} {r.stderr}"
    assert (
        "denied the request: online-no-timeslice: online inference asks a time-sliced/MPS GPU through claim gpu "
        "request gpus (1 x nvidia.com/gpu.shared, GpuConfig sharing TimeSlicing)" in r.stderr
    ), r.stderr
    assert "Fix: drop the GpuConfig sharing from the claim" in r.stderr


@pytest.mark.parametrize(
    "resource", ["nvidia.com/gpu", "deviceclass.resource.kubernetes.io/gpu.nvidia.com"], ids=["mapped", "class"]
)
def test_extended_resource_pods_through_a_device_class_are_handled_like_device_plugin_pods(
    dra_cluster: ControlPlane, webhook: Webhook, namespace: str, resource: str
) -> None:
    """nvidia.com/gpu: 8 that the gpu.nvidia.com DeviceClass serves (extendedResourceName, GA in 1.37), and the
    class's own name: the same same-rack placement as a device-plugin job, the scheduler allocating the GPUs."""
    cp = dra_cluster
    wait_devices(webhook, 5)
    r = apply(cp, namespace, claim_pods("ext", 2, 8, claims=False, limits={resource: "8"}))
    assert r.returncode == 0, r.stderr
    stored = cp.get_json("pod", "ext-worker-0", "-n", namespace)["spec"]
    req = stored["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert req[0]["topologyKey"] == RACK
    after = racks(cp, namespace, ["ext-worker-0", "ext-worker-1"])
    print(resource, after, allocated_devices(cp, namespace))
    assert len({v.split("/")[0] for v in after.values()}) == 1, f"job crossed racks: {after}"
    assert all(v.split("/")[1].startswith("dra-") and "mig" not in v for v in after.values()), after


def memory_pod(name: str, memory: str) -> dict[str, Any]:
    """A bare pod asking one nvidia.com/gpu with gpu-admission.io/gpu-memory (no claims, no DRA name)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-admission.io/gpu-memory": memory}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}, "requests": {"cpu": "1"}},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def memory_tiers(dra_cluster: ControlPlane, webhook: Webhook) -> Iterator[list[str]]:
    """The DeviceClasses `gpu-admission policy deviceclasses` prints for the DRA nodes' slices, applied (and
    removed afterwards); the webhook's inventory has them once /readyz counts them."""
    cp = dra_cluster
    gen = subprocess.run(
        [sys.executable, "-m", "webhook", "policy", "deviceclasses", "--nodes", str(DRA_FILE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    names = [o["metadata"]["name"] for o in yaml.safe_load_all(gen.stdout) if o]
    before = len(cp.get_json("deviceclasses")["items"])
    cp.kubectl("apply", "-f", "-", input=gen.stdout)
    assert webhook.server is not None
    deadline = time.monotonic() + 30
    with webhook.server.client() as c:
        while c.get("/readyz").json().get("dra", {}).get("deviceClasses") != before + len(names):
            assert time.monotonic() < deadline, "the webhook never saw the generated DeviceClasses"
            time.sleep(0.2)
    try:
        yield names
    finally:
        cp.kubectl("delete", "deviceclasses", *names, "--wait=false", check=False)


@pytest.mark.parametrize(
    ("memory", "tier", "device"),
    [
        ("10Gi", "mig-1g.10gb.gpu-admission.io", r"dra-mig-1/gpu-0-mig-1g10gb-[0-6]"),
        ("20Gi", "mig-3g.40gb.gpu-admission.io", r"dra-mig-1/gpu-1-mig-3g40gb-[01]"),
        ("60Gi", "gpu-80gi.gpu-admission.io", r"dra-[a-z0-9-]+/gpu-[0-7]"),
    ],
)
def test_gpu_memory_pod_gets_the_best_fit_device_class_and_the_scheduler_allocates_it(
    dra_cluster: ControlPlane, webhook: Webhook, memory_tiers: list[str], namespace: str, memory: str, tier: str,
    device: str,
) -> None:  # fmt: skip
    """gpu-memory on a DRA-only cluster: the webhook rewrites nvidia.com/gpu: 1 to the generated class of the
    best-fit MIG profile or memory tier (deviceclass.resource.kubernetes.io/<class>, KEP-5004, GA in 1.37), and
    the real scheduler binds the pod with a device that class's CEL selects (MIG slices of the right profile;
    a whole GPU for 60Gi): the classes' CEL (memory compareTo, profile) runs in the real scheduler."""
    cp = dra_cluster
    wait_devices(webhook, 5)
    assert tier in memory_tiers
    r = apply(cp, namespace, [memory_pod("sized", memory)])
    assert r.returncode == 0, r.stderr
    limits = cp.get_json("pod", "sized", "-n", namespace)["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "1", f"deviceclass.resource.kubernetes.io/{tier}": "1"}, limits
    node = cp.wait_for_scheduled(namespace, "sized", timeout=90)
    got = [
        f"{r['pool']}/{r['device']}"
        for claim in cp.get_json("resourceclaims", "-n", namespace)["items"]
        for r in (claim.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", [])
    ]
    print(memory, tier, node, got)
    assert len(got) == 1 and re.fullmatch(device, got[0]) and got[0].startswith(f"{node}/"), got
