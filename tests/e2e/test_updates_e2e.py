"""UPDATE and DELETE through the real kube-apiserver: the `oldObject` branches of deploy/'s matchConditions.

Every webhook of deploy/ that handles UPDATE has a `create-or-relevant-update` condition: an UPDATE reaches
us only when the spec, the labels or the annotations changed (or appeared, or went away), so that status and
finalizer writes by controllers never call us. The policy ConfigMap's `is-the-policy-configmap` condition also
reads `oldObject` (DELETE has no `object`). cel-python evaluates these in tests/test_deploy.py; here the API
server that operators run evaluates them (cel-go, its own `oldObject` and `request`), for one kind of each
webhook family, mutating and validating configurations alike.

Each change is a server-side dry run (`kubectl patch --dry-run=server`, `kubectl delete --dry-run=server`):
admission runs as for a real write, nothing is stored, so every case starts from the same stored object.
Whether a webhook was called is read from the server's request counter, by webhook path.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.e2e import crds
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP, Webhook, calls_since, served

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
LABELS = {"team": "research"}
BOTH = {"mutate", "validate"}
ANNOTATIONS = {"example.com/owner": "alice"}


def template() -> Obj:
    gpu = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sleep", "3600"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return {"metadata": {"labels": {"app": "gpu"}}, "spec": {"restartPolicy": "Never", "containers": [gpu]}}


def _statefulset(name: str) -> Obj:  # replicas 0: no controller writes that would call us meanwhile
    t = template()
    t["spec"]["restartPolicy"] = "Always"
    spec = {"replicas": 0, "serviceName": name, "selector": {"matchLabels": {"app": "gpu"}}, "template": t}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name}, "spec": spec}


def _cronjob(name: str) -> Obj:
    spec = {"schedule": "@daily", "suspend": True, "jobTemplate": {"spec": {"template": template()}}}
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name}, "spec": spec}


def _pytorchjob(name: str) -> Obj:
    replicas = {"Master": {"replicas": 1, "template": template()}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": replicas},
    }


def _jobset(name: str) -> Obj:
    jobs = [{"name": "w", "replicas": 1, "template": {"spec": {"template": template()}}}]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {"replicatedJobs": jobs},
    }


def _lws(name: str) -> Obj:
    lwt = {"size": 1, "workerTemplate": template()}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "leaderWorkerTemplate": lwt},
    }


def _volcano(name: str) -> Obj:
    tasks = [{"name": "w", "replicas": 1, "template": template()}]
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"minAvailable": 1, "tasks": tasks},
    }


def _raycluster(name: str) -> Obj:
    spec = {"headGroupSpec": {"template": template()}, "workerGroupSpecs": []}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name}, "spec": spec}


def _isvc(name: str) -> Obj:
    t = template()
    spec = {"predictor": {**t["spec"], "labels": t["metadata"]["labels"]}}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def _llmisvc(name: str) -> Obj:
    spec = {"model": {"uri": "hf://Qwen/Qwen3-8B"}, "template": template()["spec"]}
    return {
        "apiVersion": "serving.kserve.io/v1alpha2",
        "kind": "LLMInferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def _trainjob(name: str) -> Obj:  # no such runtime: judged from spec.trainer, one node, allowed
    trainer = {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"}}}
    spec = {"runtimeRef": {"name": "absent"}, "trainer": trainer}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}


def _hpa(name: str) -> Obj:
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "absent"},
        "minReplicas": 1,
        "maxReplicas": 2,
    }
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name}, "spec": spec}


def _scaledobject(name: str) -> Obj:
    spec = {
        "scaleTargetRef": {"name": "absent"},
        "minReplicaCount": 1,
        "triggers": [{"type": "cpu", "metadata": {"value": "50"}}],
    }
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name}, "spec": spec}


# family -> (build(name) -> object, resource for kubectl, a spec change that the API server keeps, the
# webhooks (server paths) that family has in deploy/)
FAMILIES: dict[str, tuple[Callable[[str], Obj], str, Obj, set[str]]] = {
    "workloads": (_statefulset, "statefulsets.apps", {"minReadySeconds": 5}, BOTH),
    "cronjobs": (_cronjob, "cronjobs.batch", {"startingDeadlineSeconds": 60}, BOTH),
    "kubeflow": (_pytorchjob, "pytorchjobs.kubeflow.org", {"runPolicy": {"backoffLimit": 2}}, BOTH),
    "jobsets": (_jobset, "jobsets.jobset.x-k8s.io", {"suspend": True}, BOTH),
    "leaderworkersets": (_lws, "leaderworkersets.leaderworkerset.x-k8s.io", {"startupPolicy": "LeaderReady"}, BOTH),
    "volcanojobs": (_volcano, "jobs.batch.volcano.sh", {"maxRetry": 2}, BOTH),
    "ray": (_raycluster, "rayclusters.ray.io", {"suspend": True}, BOTH),
    "inferenceservices": (_isvc, "inferenceservices.serving.kserve.io", {"predictor": {"minReplicas": 2}}, BOTH),
    "llminferenceservices": (_llmisvc, "llminferenceservices.serving.kserve.io", {"replicas": 2}, BOTH),
    "trainjobs": (_trainjob, "trainjobs.trainer.kubeflow.org", {"suspend": True}, BOTH),
    "horizontalpodautoscalers": (_hpa, "horizontalpodautoscalers.autoscaling", {"maxReplicas": 3}, {"validate"}),
    "scaledobjects": (_scaledobject, "scaledobjects.keda.sh", {"maxReplicaCount": 3}, {"validate"}),
}


@pytest.fixture(scope="module")
def crds_installed(control_plane: ControlPlane) -> None:
    crds.install(control_plane)


def create(cp: ControlPlane, ns: str, obj: Obj) -> None:
    deadline = time.monotonic() + 30
    while True:  # a new CRD's REST mapping takes a moment to reach kubectl's discovery
        r = cp.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(obj), check=False)
        if r.returncode == 0:
            return
        assert time.monotonic() < deadline and "no matches for kind" in r.stderr, r.stderr
        time.sleep(0.5)


def patch(cp: ControlPlane, ns: str, resource: str, name: str, change: Obj) -> subprocess.CompletedProcess[str]:
    return cp.kubectl(
        "patch", resource, name, "-n", ns, "--type=merge", "-p", json.dumps(change), "--dry-run=server", check=False
    )


def called(before: dict[tuple[str, str], float], webhook: Webhook) -> dict[str, float]:
    """Calls since `before`, by webhook path (whatever the verdict)."""
    out: dict[str, float] = {}
    for (path, _), n in calls_since(before, webhook).items():
        out[path] = out.get(path, 0.0) + n
    return out


def settled(webhook: Webhook) -> dict[tuple[str, str], float]:
    """The counter once nothing has called us for half a second (the creates' own calls are all counted)."""
    last = served(webhook)
    while True:
        time.sleep(0.5)
        now = served(webhook)
        if now == last:
            return now
        last = now


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_updates_reach_the_webhooks_only_when_spec_labels_or_annotations_change(
    control_plane: ControlPlane, webhook: Webhook, crds_installed: None, namespace: str, family: str
) -> None:
    cp = control_plane
    build, resource, spec_change, paths = FAMILIES[family]
    bare = build("bare")  # no labels, no annotations: the has(...) != has(...) branches
    dressed = build("dressed")
    dressed["metadata"].update(labels=dict(LABELS), annotations=dict(ANNOTATIONS))
    for obj in (bare, dressed):
        create(cp, namespace, obj)
    once = {path: 1.0 for path in paths}

    cases: list[tuple[str, str, Obj, dict[str, float]]] = [
        ("spec changed", "dressed", {"spec": spec_change}, once),
        ("labels appear", "bare", {"metadata": {"labels": LABELS}}, once),
        ("annotations appear", "bare", {"metadata": {"annotations": ANNOTATIONS}}, once),
        ("a label changes", "dressed", {"metadata": {"labels": {"team": "platform"}}}, once),
        ("labels go away", "dressed", {"metadata": {"labels": {"team": None}}}, once),
        ("an annotation changes", "dressed", {"metadata": {"annotations": {"example.com/owner": "bob"}}}, once),
        ("a finalizer only", "dressed", {"metadata": {"finalizers": ["example.com/keep"]}}, {}),
        ("a finalizer only, no labels", "bare", {"metadata": {"finalizers": ["example.com/keep"]}}, {}),
    ]
    if family not in ("workloads", "cronjobs", "horizontalpodautoscalers"):  # CRDs here have no status subresource
        cases.append(("status only", "dressed", {"status": {"phase": "Running"}}, {}))
    before = settled(webhook)
    for what, name, change, expected in cases:
        r = patch(cp, namespace, resource, name, change)
        assert r.returncode == 0, f"{family} {what}: {r.stderr}"
        got = called(before, webhook)
        assert got == expected, f"{family} {what}: webhook calls {got}, expected {expected}"
        before = served(webhook)


def test_the_policy_configmap_is_guarded_on_update_and_delete(control_plane: ControlPlane, webhook: Webhook) -> None:
    cp = control_plane
    other = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "unrelated", "namespace": NAMESPACE},
        "data": {"k": "v"},
    }
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(other))
    try:
        label = json.dumps({"metadata": {"labels": {"edited": "yes"}}})
        before = settled(webhook)
        for name, expected in ((POLICY_CONFIGMAP, {"validate": 1.0}), ("unrelated", {})):
            r = cp.kubectl(
                "patch",
                "configmap",
                name,
                "-n",
                NAMESPACE,
                "--type=merge",
                "-p",
                label,
                "--dry-run=server",
                check=False,
            )
            assert r.returncode == 0, r.stderr
            assert called(before, webhook) == expected, f"UPDATE of {name}"
            before = served(webhook)
            # DELETE: no `object`, only `oldObject` and request.name; a dry run leaves the ConfigMap in place
            r = cp.kubectl("delete", "configmap", name, "-n", NAMESPACE, "--dry-run=server", check=False)
            assert r.returncode == 0, r.stderr
            assert called(before, webhook) == expected, f"DELETE of {name}"
            before = served(webhook)
        assert cp.get_json("configmap", POLICY_CONFIGMAP, "-n", NAMESPACE)["data"]["policy.yaml"]

        # With the server down, failurePolicy Fail shows the call: the policy ConfigMap cannot be deleted,
        # any other ConfigMap of the namespace can.
        webhook.stop_server()
        try:
            r = cp.kubectl("delete", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--dry-run=server", check=False)
            assert r.returncode != 0 and "policy.validate.gpu-admission.io" in r.stderr, r.stderr
            r = cp.kubectl("delete", "configmap", "unrelated", "-n", NAMESPACE, "--dry-run=server", check=False)
            assert r.returncode == 0, r.stderr
        finally:
            webhook.start_server()
        webhook.wait_effective()
    finally:
        cp.kubectl("delete", "configmap", "unrelated", "-n", NAMESPACE, "--ignore-not-found", check=False)
