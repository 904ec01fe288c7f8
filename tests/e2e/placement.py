"""Gang placement on the real control plane: the rack layouts, jobs and waits shared by the placement e2e
tests (tests/e2e/test_placement_e2e.py) and the placement benchmark (tests/bench/placement.py)."""

from __future__ import annotations

import copy
import json
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import ControlPlane, ControlPlaneError, build_binaries
from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP, Webhook

ROOT = Path(__file__).resolve().parent.parent.parent
RACK = "topology.kubernetes.io/rack"
RACKS_FILE = ROOT / "examples" / "placement" / "racks.yaml"


def h100_node(name: str, rack: str) -> dict[str, Any]:
    """An 8x H100 node of the example layout, renamed into `rack`."""
    doc = yaml.safe_load(RACKS_FILE.read_text())
    node = copy.deepcopy(doc["items"][0])
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, RACK: rack})
    return node


def layout(sizes: dict[str, int]) -> list[dict[str, Any]]:
    """Racks of 8-GPU nodes: {"rack-a": 4, "rack-b": 2} -> 6 nodes named <rack>-<i>."""
    return [h100_node(f"{rack}-{i}", rack) for rack, n in sizes.items() for i in range(1, n + 1)]


def start_cluster(nodes: list[dict[str, Any]]) -> ControlPlane:
    cp = ControlPlane(build_binaries())
    try:
        cp.start()
        cp.create_nodes(nodes)
    except ControlPlaneError:
        cp.stop()
        raise
    return cp


@contextmanager
def racks(sizes: dict[str, int]) -> Iterator[ControlPlane]:
    """A control plane of its own with racks of 8-GPU H100 nodes (`layout`), stopped at the end."""
    cp = start_cluster(layout(sizes))
    try:
        yield cp
    finally:
        cp.stop()


def indexed_job(name: str, pods: int, gpus: int) -> dict[str, Any]:
    """An Indexed Job of `pods` pods x `gpus` GPUs (the controller creates the pods; the scheduler binds)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "research"}},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"bench": "placement"}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "train",
                            "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def busy_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod already bound to `node` (nodeName set: no scheduling), holding `gpus` GPUs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "busy"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }


def fill_rack(cp: ControlPlane, wh: Webhook, racks: dict[str, str], rack: str) -> str:
    """Every node of `rack` taken whole by a pod of a namespace the webhook leaves alone; once the webhook's pod
    view has them, the namespace."""
    busy_ns = new_namespace(cp, "busy", {"gpu-admission.io/enforcement": "off"})
    nodes = sorted(n for n, r in racks.items() if r == rack)
    busy = [busy_pod(f"busy-{i}", n, 8) for i, n in enumerate(nodes)]
    cp.kubectl("apply", "-n", busy_ns, "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": busy})
    wait_pod_view(wh, cp)
    return busy_ns


def new_namespace(cp: ControlPlane, prefix: str, labels: dict[str, str] | None = None) -> str:
    name = f"{re.sub(r'[^a-z0-9-]+', '-', prefix)[:40]}-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", name)
    for k, v in (labels or {}).items():
        cp.kubectl("label", "namespace", name, f"{k}={v}", "--overwrite")
    return name


def job_pods(cp: ControlPlane, ns: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.get_json("pods", "-n", ns, "-l", f"batch.kubernetes.io/job-name={job}")["items"]
    return items


def apply_job(cp: ControlPlane, ns: str, job: dict[str, Any], pinned_to: str | None = None) -> str:
    """Apply a Job and wait until all its pods exist (they may be held unbound); with `pinned_to`, first assert
    that its stored template is pinned to that rack. kubectl's stderr (the warnings)."""
    name, pods = job["metadata"]["name"], job["spec"]["parallelism"]
    r = cp.kubectl("apply", "-n", ns, "-f", "-", input=job, check=False)
    assert r.returncode == 0, r.stderr
    if pinned_to is not None:
        stored = cp.get_json("job", name, "-n", ns)["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        terms = stored["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": RACK, "operator": "In", "values": [pinned_to]} in terms[0]["matchExpressions"]
    deadline = time.monotonic() + 30
    while len(job_pods(cp, ns, name)) < pods and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(job_pods(cp, ns, name)) == pods
    return r.stderr


def gated(job: dict[str, Any]) -> dict[str, Any]:
    """The Job with a scheduling gate on its pods (they stay unbound until it is removed: a slow scheduler)."""
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    return job


def wait_placed(
    cp: ControlPlane, ns: str, job: str, pods: int, timeout: float = 60.0, settle: float = 3.0
) -> dict[str, Any]:
    """Wait until the job's `pods` pods exist and are all bound, or until, with all of them created, nothing
    changed for `settle` seconds while some stay unbound (stranded). Returns {bound: {pod: node}, pending}."""
    deadline = time.monotonic() + timeout
    last: tuple[Any, ...] = ()
    since = time.monotonic()
    while True:
        items = job_pods(cp, ns, job)
        bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName")}
        state = (len(items), tuple(sorted(bound.items())))
        if state != last:
            last, since = state, time.monotonic()
        if len(items) >= pods and len(bound) >= pods:
            return {"bound": bound, "pending": 0}
        now = time.monotonic()
        if (len(items) >= pods and now - since > settle) or now > deadline:
            return {"bound": bound, "pending": max(pods - len(bound), 0)}
        time.sleep(0.2)


def racks_of(nodes: dict[str, str], bound: dict[str, str]) -> set[str]:
    return {nodes[n] for n in bound.values()}


def node_racks(cp: ControlPlane) -> dict[str, str]:
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(RACK, "?") for n in cp.get_json("nodes")["items"]}


def delete_job(cp: ControlPlane, ns: str, job: str, timeout: float = 30.0) -> None:
    """Delete the Job and force-delete its pods (no kubelet finishes a graceful deletion); wait until gone."""
    cp.kubectl("delete", "job", job, "-n", ns, "--cascade=orphan", "--wait=false", check=False)
    deadline = time.monotonic() + timeout
    while job_pods(cp, ns, job) and time.monotonic() < deadline:
        cp.kubectl(
            "delete", "pods", "-n", ns, "-l", f"batch.kubernetes.io/job-name={job}", "--grace-period=0", "--force",
            "--wait=false", check=False,
        )  # fmt: skip
        time.sleep(0.2)


def _metrics(wh: Webhook) -> str:
    assert wh.server is not None
    with wh.server.client() as c:
        return c.get("/metrics").text


def pod_view_gpu_pods(wh: Webhook) -> float:
    """The webhook's own count of GPU pods in its pod view (gpu_admission_pod_view_gpu_pods)."""
    m = re.search(r"^gpu_admission_pod_view_gpu_pods (\S+)$", _metrics(wh), re.M)
    return float(m.group(1)) if m else -1.0


def bind_checks(wh: Webhook) -> dict[str, float]:
    """The binds the webhook judged so far, by "outcome/reason" (gpu_admission_bind_checks_total)."""
    pattern = r'^gpu_admission_bind_checks_total\{outcome="([^"]*)",reason="([^"]*)"\} (\S+)$'
    return {f"{outcome}/{reason}": float(n) for outcome, reason, n in re.findall(pattern, _metrics(wh), re.M)}


def live_reservations(wh: Webhook) -> float:
    """Jobs whose reservation still holds GPUs (gpu_admission_placement_reservations)."""
    m = re.search(r"^gpu_admission_placement_reservations (\S+)$", _metrics(wh), re.M)
    return float(m.group(1)) if m else -1.0


def reservations_ended(wh: Webhook) -> dict[str, float]:
    """Reservations the webhook ended so far, by reason (gpu_admission_placement_reservations_ended_total)."""
    pattern = r'^gpu_admission_placement_reservations_ended_total\{reason="([^"]*)"\} (\S+)$'
    return {reason: float(n) for reason, n in re.findall(pattern, _metrics(wh), re.M)}


def set_placement(cp: ControlPlane, wh: Webhook, **fields: int) -> None:
    """Set `placement.<field>: <seconds>` fields in the policy ConfigMap (each must be in it already) and wait
    until the server serves that policy (its /version hash changes)."""
    assert wh.server is not None
    text = cp.get_json("configmap", POLICY_CONFIGMAP, "-n", NAMESPACE)["data"]["policy.yaml"]
    edited = text
    for key, value in fields.items():
        edited = re.sub(rf"^(  {key}:) \S+$", rf"\g<1> {value}", edited, count=1, flags=re.M)
        assert re.search(rf"^  {key}: {value}$", edited, re.M), key
    if edited == text:
        return
    with wh.server.client() as c:
        before = c.get("/version").json()["policyHash"]
        patch = json.dumps({"data": {"policy.yaml": edited}})
        cp.kubectl("patch", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--type=merge", "-p", patch)
        deadline = time.monotonic() + 60
        while c.get("/version").json()["policyHash"] == before:
            assert time.monotonic() < deadline, "the policy edit never took effect"
            time.sleep(0.3)


def wait_pod_view(wh: Webhook, cp: ControlPlane, timeout: float = 20.0) -> None:
    """Until the webhook's pod view counts exactly the GPU pods the API server has (deletions seen)."""
    deadline = time.monotonic() + timeout
    while True:
        want = sum(
            1
            for p in cp.get_json("pods", "-A")["items"]
            if (
                any("nvidia.com/gpu" in (c.get("resources", {}).get("limits") or {}) for c in p["spec"]["containers"])
                or p["spec"].get("resourceClaims")  # kept too: their GPUs are counted from their claims
            )
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        )
        if pod_view_gpu_pods(wh) == want:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pod view never caught up: {pod_view_gpu_pods(wh)} vs {want}")
        time.sleep(0.2)
