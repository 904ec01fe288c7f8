"""`gpu-admission.io/` keys on CPU-only objects, through the real kube-apiserver and the deploy/ configurations.

The engine rejects an unknown or unparsable `gpu-admission.io/` key even on an object that asks for no GPU
(rule `gpu-admission-annotations`, spec §2: never silently ignored). That only helps if the API server calls
us: the judging webhooks' CEL matchConditions (the validating ones; for Pods, pods.admit, which mutates and
judges in one call) must match such objects, in every family, while CPU-only objects without our keys must
still be skipped inside the API server. The template families' mutating webhooks keep the narrower
condition (nothing to mutate on a CPU object).

"Never called" is measured with the server's request counter (`gpu_admission_requests_total`): the audit log
alone cannot prove it, since the server writes no record for an object it allows untouched.
"""

from __future__ import annotations

import copy
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.e2e import crds
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import Webhook, calls_since, served

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
TYPO_ANNOTATION = {"gpu-admission.io/gpu-memry": "10Gi"}
BAD_LABEL = {"gpu-admission.io/workload": "trainig"}


def apply(cp: ControlPlane, ns: str, docs: list[Obj], *flags: str) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("apply", "-n", ns, "-f", "-", *flags, input=yaml.safe_dump_all(docs), check=False)


def container() -> Obj:
    return {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sleep", "3600"],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
    }


def template(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> Obj:
    """A CPU-only pod template, optionally with extra labels / annotations."""
    metadata: Obj = {"labels": {"app": "cpu", **(labels or {})}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata, "spec": {"containers": [container()]}}


def _pod(name: str, t: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **t["metadata"]}, "spec": t["spec"]}


def _apps(kind: str) -> Callable[[str, Obj], Obj]:
    def build(name: str, t: Obj) -> Obj:
        spec: Obj = {"replicas": 1, "selector": {"matchLabels": {"app": "cpu"}}, "template": t}
        if kind == "StatefulSet":
            spec["serviceName"] = name
        if kind == "DaemonSet":
            del spec["replicas"]
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}

    return build


def _job(name: str, t: Obj) -> Obj:
    t["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"template": t}}


def _cronjob(name: str, t: Obj) -> Obj:
    t["spec"]["restartPolicy"] = "Never"
    spec = {"schedule": "@daily", "jobTemplate": {"spec": {"template": t}}}
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name}, "spec": spec}


def _kubeflow(api_version: str, kind: str, field: str, chief: str) -> Callable[[str, Obj], Obj]:
    def build(name: str, t: Obj) -> Obj:
        replicas = {chief: {"replicas": 1, "template": template()}, "Worker": {"replicas": 2, "template": t}}
        return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": {field: replicas}}

    return build


def _jobset(name: str, t: Obj) -> Obj:
    jobs = [
        {"name": "driver", "replicas": 1, "template": {"spec": {"template": template()}}},
        {"name": "workers", "replicas": 2, "template": {"spec": {"template": t}}},
    ]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"replicatedJobs": jobs}}  # fmt: skip


def _lws(role: str) -> Callable[[str, Obj], Obj]:
    def build(name: str, t: Obj) -> Obj:
        other = "leaderTemplate" if role == "workerTemplate" else "workerTemplate"
        lwt = {"size": 2, role: t, other: template()}
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": name},
                "spec": {"replicas": 1, "leaderWorkerTemplate": lwt}}  # fmt: skip

    return build


def _volcano(name: str, t: Obj) -> Obj:
    tasks = [{"name": "ps", "replicas": 1, "template": template()}, {"name": "worker", "replicas": 2, "template": t}]
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name},
            "spec": {"minAvailable": 3, "tasks": tasks}}  # fmt: skip


def _ray_cluster_spec(t: Obj, role: str) -> Obj:
    head, worker = (t, template()) if role == "head" else (template(), t)
    return {"headGroupSpec": {"template": head}, "workerGroupSpecs": [{"groupName": "g", "replicas": 1,
                                                                       "template": worker}]}  # fmt: skip


def _ray(kind: str, role: str) -> Callable[[str, Obj], Obj]:
    def build(name: str, t: Obj) -> Obj:
        spec = _ray_cluster_spec(t, role)
        if kind == "RayJob":
            spec = {"entrypoint": "python train.py", "rayClusterSpec": spec}
        return {"apiVersion": "ray.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}

    return build


# case -> (webhook family, build(name, the pod template that may carry our keys) -> object)
KINDS: dict[str, tuple[str, Callable[[str, Obj], Obj]]] = {
    "Pod": ("pods", _pod),
    **{k: ("workloads", _apps(k)) for k in ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet")},
    "Job": ("workloads", _job),
    "CronJob": ("cronjobs", _cronjob),
    "PyTorchJob": ("kubeflow", _kubeflow("kubeflow.org/v1", "PyTorchJob", "pytorchReplicaSpecs", "Master")),
    "TFJob": ("kubeflow", _kubeflow("kubeflow.org/v1", "TFJob", "tfReplicaSpecs", "Chief")),
    "MPIJob": ("kubeflow", _kubeflow("kubeflow.org/v2beta1", "MPIJob", "mpiReplicaSpecs", "Launcher")),
    "XGBoostJob": ("kubeflow", _kubeflow("kubeflow.org/v1", "XGBoostJob", "xgbReplicaSpecs", "Master")),
    "PaddleJob": ("kubeflow", _kubeflow("kubeflow.org/v1", "PaddleJob", "paddleReplicaSpecs", "Master")),
    "JobSet": ("jobsets", _jobset),
    "LeaderWorkerSet-leader": ("leaderworkersets", _lws("leaderTemplate")),
    "LeaderWorkerSet-worker": ("leaderworkersets", _lws("workerTemplate")),
    "VolcanoJob": ("volcanojobs", _volcano),
    "RayCluster-head": ("ray", _ray("RayCluster", "head")),
    "RayCluster-worker": ("ray", _ray("RayCluster", "worker")),
    "RayJob-worker": ("ray", _ray("RayJob", "worker")),
}


def judge(family: str) -> str:
    """The webhook (its server path) that judges a family: Pods are mutated and judged in one call."""
    return "admit" if family == "pods" else "validate"


def denied_by(r: subprocess.CompletedProcess[str], family: str) -> bool:
    return (
        r.returncode != 0
        and f'admission webhook "{family}.{judge(family)}.gpu-admission.io" denied the request' in r.stderr
        and "gpu-admission-annotations" in r.stderr
    )


# --- the three user stories ------------------------------------------------------------------------------


def test_cpu_pod_with_a_misspelled_annotation_is_denied(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    pod = _pod("typo", template(annotations=TYPO_ANNOTATION))
    before = served(webhook)
    r = apply(cp, namespace, [pod])
    assert denied_by(r, "pods"), r.stderr
    assert "gpu-admission.io/gpu-memry" in r.stderr
    assert "did you mean gpu-admission.io/gpu-memory?" in r.stderr, r.stderr
    assert cp.kubectl("get", "pod", "typo", "-n", namespace, check=False).returncode != 0
    # One call, by pods.admit (which also judges): the typo key alone makes a CPU pod reach the webhook.
    assert calls_since(before, webhook) == {("admit", "deny"): 1}


def test_cpu_deployment_with_a_bad_template_label_is_denied(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    deploy = _apps("Deployment")("web", template(labels=BAD_LABEL))
    r = apply(cp, namespace, [deploy])
    assert denied_by(r, "workloads"), r.stderr
    assert "gpu-admission.io/workload='trainig'" in r.stderr and "training, inference, batch" in r.stderr
    assert cp.kubectl("get", "deployment", "web", "-n", namespace, check=False).returncode != 0


def test_cpu_pod_without_our_keys_never_reaches_the_webhook(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    before = served(webhook)
    r = apply(cp, namespace, [_pod("plain", template(labels={"team": "shop"}))])
    assert r.returncode == 0, r.stderr
    assert cp.get_json("pod", "plain", "-n", namespace)["metadata"]["name"] == "plain"
    assert calls_since(before, webhook) == {}, "the API server called the webhook for a CPU pod without our keys"

    # The audit log has no record of it either. Records are written asynchronously and in order: wait for the
    # record of a later, keyed pod first, so that an earlier record would have been written by then.
    r = apply(cp, namespace, [_pod("marker", template(annotations=TYPO_ANNOTATION))])
    assert denied_by(r, "pods"), r.stderr
    deadline = time.monotonic() + 10
    while True:
        mine = [x for x in webhook.audit_records() if x.get("namespace") == namespace]
        if any(x.get("name") == "marker" for x in mine):
            break
        assert time.monotonic() < deadline, "the keyed pod's denial never reached the audit log"
        time.sleep(0.1)
    assert not [x for x in mine if x.get("name") == "plain"], mine


# --- every family, through the real API server's CEL (server-side dry run) --------------------------------


@pytest.fixture(scope="module")
def crds_installed(control_plane: ControlPlane) -> None:
    crds.install(control_plane)


def dry_run(cp: ControlPlane, ns: str, obj: Obj) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 30
    while True:  # a new CRD's REST mapping takes a moment to reach kubectl's discovery
        r = apply(cp, ns, [obj], "--dry-run=server")
        if r.returncode == 0 or time.monotonic() > deadline or "no matches for kind" not in r.stderr:
            return r
        time.sleep(0.5)


@pytest.mark.parametrize("case", sorted(KINDS))
def test_every_family_sees_our_keys_on_cpu_objects_and_nothing_else(
    control_plane: ControlPlane, webhook: Webhook, crds_installed: None, namespace: str, case: str
) -> None:
    cp = control_plane
    family, build = KINDS[case]

    # No key of ours (look-alikes only): skipped inside the API server, in both configurations.
    lookalike = template(labels={"gpu-admission.io": "x", "team.gpu-admission.io/owner": "x"},
                         annotations={"note": "gpu-admission.io/gpu-memory: 10Gi"})  # fmt: skip
    for name, t in (("plain", template()), ("lookalike", lookalike)):
        before = served(webhook)
        r = dry_run(cp, namespace, build(name, t))
        assert r.returncode == 0, f"{case} {name}: {r.stderr}"
        assert calls_since(before, webhook) == {}, f"{case} {name}: the API server called the webhook"

    # A key on the pod template (for a Pod: on the Pod itself): called once, denied, by the judging webhook.
    for name, t in (("typo", template(annotations=TYPO_ANNOTATION)), ("badlabel", template(labels=BAD_LABEL))):
        before = served(webhook)
        r = dry_run(cp, namespace, build(name, t))
        assert denied_by(r, family), f"{case} {name}: {r.returncode} {r.stderr}"
        assert calls_since(before, webhook) == {(judge(family), "deny"): 1}, case

    # A key on the object's own metadata, every pod template clean.
    if case != "Pod":
        for name, meta in (("objtypo", {"annotations": TYPO_ANNOTATION}), ("objlabel", {"labels": BAD_LABEL})):
            obj = build(name, template())
            obj["metadata"].update(copy.deepcopy(meta))
            r = dry_run(cp, namespace, obj)
            assert denied_by(r, family), f"{case} {name}: {r.returncode} {r.stderr}"
