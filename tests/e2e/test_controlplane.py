"""Smoke tests of the real control plane itself, all through the real kubectl (no webhook involved)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import DEFAULT_NODES_FILE, ControlPlane, pinned_versions, wait_until

pytestmark = pytest.mark.e2e

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: no kubelet runs


def pod(
    name: str, limits: dict[str, str] | None = None, *, node_selector: dict[str, str] | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if limits:
        resources["limits"] = dict(limits)
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": resources}]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}}, "spec": spec}


def node_labels(cp: ControlPlane, node: str) -> dict[str, str]:
    labels: dict[str, str] = cp.get_json("node", node)["metadata"]["labels"]
    return labels


def test_version_is_pinned(control_plane: ControlPlane) -> None:
    want = pinned_versions()["kubernetes"]
    out = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    server = out["serverVersion"]
    assert server["gitVersion"] == want
    assert (server["major"], server["minor"]) == ("1", want.split(".")[1])
    assert control_plane.server_version()["gitVersion"] == want


def test_nodes_are_schedulable(control_plane: ControlPlane) -> None:
    expected = {n["metadata"]["name"]: n for n in yaml.safe_load(DEFAULT_NODES_FILE.read_text())["items"]}
    control_plane.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=10s")
    nodes = {n["metadata"]["name"]: n for n in control_plane.get_json("nodes")["items"]}
    assert set(nodes) == set(expected)
    for name, node in nodes.items():
        assert not node["spec"].get("taints"), f"{name} is tainted: {node['spec']['taints']}"
        assert not node["spec"].get("unschedulable")
        alloc = node["status"]["allocatable"]
        assert alloc["pods"] == "110"
        for res, qty in expected[name]["status"]["allocatable"].items():
            if res.startswith("nvidia.com/"):
                assert alloc.get(res) == qty, f"{name} {res}: {alloc.get(res)} != {qty}"
        assert node["metadata"]["labels"] == expected[name]["metadata"]["labels"]


def test_eight_gpus_bind_to_an_h100_node(control_plane: ControlPlane, namespace: str) -> None:
    # Whole cards only: without this selector the time-sliced l4-ts-1 (16 units of nvidia.com/gpu) fits
    # eight "GPUs" too, and the scheduler may pick it -- exactly the mistake the webhook exists to stop.
    # Among the unshared nodes only the H100s have 8 (a100-mig-1 keeps 2 whole cards).
    control_plane.kubectl(
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        input=pod("trainer", {"nvidia.com/gpu": "8"}, node_selector={"nvidia.com/gpu.sharing-strategy": "none"}),
    )
    node = control_plane.wait_for_scheduled(namespace, "trainer")
    assert node_labels(control_plane, node)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    obj = control_plane.get_json("pod", "trainer", "-n", namespace)
    scheduled = [c for c in obj["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled and scheduled[0]["status"] == "True"
    assert obj["status"]["phase"] == "Pending"  # no kubelet: bound, never started


def test_mig_slice_binds_to_the_mig_node(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=pod("slice", {"nvidia.com/mig-1g.10gb": "1"}))
    assert control_plane.wait_for_scheduled(namespace, "slice") == "a100-mig-1"


def test_unsatisfiable_request_stays_unscheduled(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl(
        "create", "-n", namespace, "-f", "-", input=pod("greedy", {"nvidia.com/gpu": "17"})
    )  # l4-ts-1 has 16

    def unschedulable() -> str | None:
        obj = control_plane.get_json("pod", "greedy", "-n", namespace)
        for c in obj["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return str(c.get("message", ""))
        return None

    message = wait_until(unschedulable, timeout=30, what="the scheduler to give up on the pod")
    assert "Insufficient nvidia.com/gpu" in message


def test_deployment_is_expanded_into_pods(control_plane: ControlPlane, namespace: str) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod("unused")["spec"]},
        },
    }
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=deployment)
    pods = control_plane.wait_for_pods(namespace, "app=web", 2, scheduled=True)
    assert len(pods) == 2
    for p in pods:
        owners = p["metadata"].get("ownerReferences", [])
        assert [o["kind"] for o in owners] == ["ReplicaSet"]


def test_job_is_expanded_into_a_pod(control_plane: ControlPlane, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"template": {"spec": {**pod("unused")["spec"], "restartPolicy": "Never"}}},
    }
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=job)
    pods = control_plane.wait_for_pods(namespace, "batch.kubernetes.io/job-name=train", 1)
    assert pods[0]["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "train"


def test_bound_pod_is_deleted_with_grace_period_zero(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=pod("victim", {"nvidia.com/gpu": "1"}))
    control_plane.wait_for_scheduled(namespace, "victim")
    # --force is required: kubectl turns a bare --grace-period=0 into 1s, and without a kubelet a graceful
    # deletion of a bound pod never completes.
    control_plane.kubectl("delete", "pod", "victim", "-n", namespace, "--grace-period=0", "--force")
    res = control_plane.kubectl("get", "pod", "victim", "-n", namespace, check=False)
    assert res.returncode != 0 and "NotFound" in res.stderr
