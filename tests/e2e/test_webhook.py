"""gpu-admission where it lives: the real kube-apiserver calls it over TLS, the real scheduler places what
it mutated, the real kubectl shows users its denials and warnings."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
import yaml

from tests.e2e import crds
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP, Webhook
from tests.serverproc import ROOT

pytestmark = pytest.mark.e2e

RACK = "topology.kubernetes.io/rack"


def apply(cp: ControlPlane, ns: str, docs: list[dict[str, Any]] | str, *flags: str) -> subprocess.CompletedProcess[str]:
    text = docs if isinstance(docs, str) else yaml.safe_dump_all(docs)
    return cp.kubectl("apply", "-n", ns, "-f", "-", *flags, input=text, check=False)


def gpu_container(gpus: int | str = 8, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {
        "name": "main",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "command": ["torchrun", "train.py"],
        "resources": {
            "limits": {resource: str(gpus), "cpu": "8", "memory": "64Gi"},
            "requests": {"cpu": "8", "memory": "64Gi"},
        },
    }


def training_pods(job: str, n: int, gpus: int, extra_labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Pods as the Kubeflow training operator creates them (job-identity labels, queue label)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job}-worker-{i}",
                "labels": {
                    "training.kubeflow.org/job-name": job,
                    "training.kubeflow.org/replica-type": "worker",
                    "training.kubeflow.org/replica-index": str(i),
                    "kueue.x-k8s.io/queue-name": "research",
                    **(extra_labels or {}),
                },
                "annotations": {"gpu-admission.io/job-gpus": str(n * gpus)},
            },
            "spec": {"containers": [gpu_container(gpus)]},
        }
        for i in range(n)
    ]


def racks_of(cp: ControlPlane, ns: str, pods: list[str]) -> dict[str, str]:
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in cp.get_json("nodes")["items"]}
    out = {}
    for p in pods:
        node = cp.wait_for_scheduled(ns, p, timeout=60)
        out[p] = nodes[node].get(RACK, "?") + "/" + node
    return out


# --- placement: mutations stored by the API server, honoured by the scheduler ---------------------------


def test_training_job_lands_in_one_rack_and_without_the_webhook_it_does_not(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    # Without the webhook (enforcement off in this namespace): 4 pods of 4 GPUs spread over the fabric,
    # and some land on the time-sliced L4 or the MIG node, since plain nvidia.com/gpu fits there too.
    cp.kubectl("label", "namespace", namespace, "gpu-admission.io/enforcement=off")
    r = apply(cp, namespace, training_pods("baseline", 4, 4))
    assert r.returncode == 0, r.stderr
    before = racks_of(cp, namespace, [f"baseline-worker-{i}" for i in range(4)])
    print("without the webhook:", before)
    stored = cp.get_json("pod", "baseline-worker-0", "-n", namespace)
    assert "affinity" not in stored["spec"]
    assert len({v.split("/")[0] for v in before.values()}) > 1, f"baseline did not cross racks: {before}"
    cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")

    cp.kubectl("label", "namespace", namespace, "gpu-admission.io/enforcement=enforce", "--overwrite")
    r = apply(cp, namespace, training_pods("llama", 4, 4))
    assert r.returncode == 0, r.stderr
    stored = cp.get_json("pod", "llama-worker-0", "-n", namespace)
    req = stored["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert req[0]["topologyKey"] == RACK
    assert req[0]["labelSelector"]["matchLabels"] == {"training.kubeflow.org/job-name": "llama"}
    node_terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "nvidia.com/gpu.slices.gi", "operator": "DoesNotExist"} in node_terms["nodeSelectorTerms"][0][
        "matchExpressions"
    ]
    after = racks_of(cp, namespace, [f"llama-worker-{i}" for i in range(4)])
    print("with the webhook:", after)
    assert len({v.split("/")[0] for v in after.values()}) == 1, f"job crossed racks: {after}"
    assert all(v.split("/")[1].startswith("h100-") for v in after.values()), after


def test_mig_slice_inference_pod(control_plane: ControlPlane, webhook: Webhook, namespace: str) -> None:
    cp = control_plane
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "embedder",
            "labels": {"app": "embedder"},
            "annotations": {"gpu-admission.io/gpu-memory": "10Gi"},
        },
        "spec": {
            "containers": [
                {"name": "srv", "image": "vllm/vllm-openai:v0.6.3", "resources": {"limits": {"nvidia.com/gpu": 1}}}
            ]
        },
    }
    r = apply(cp, namespace, [pod])
    assert r.returncode == 0, r.stderr
    stored = cp.get_json("pod", "embedder", "-n", namespace)
    limits = stored["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": "1"}
    assert cp.wait_for_scheduled(namespace, "embedder") == "a100-mig-1"


def test_inference_deployment_pods_are_spread(control_plane: ControlPlane, webhook: Webhook, namespace: str) -> None:
    cp = control_plane
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "llm"}},
            "template": {
                "metadata": {"labels": {"app": "llm"}},
                "spec": {
                    "containers": [
                        {
                            "name": "srv",
                            "image": "vllm/vllm-openai:v0.6.3",
                            "resources": {"limits": {"nvidia.com/gpu": 2}},
                        }
                    ]
                },
            },
        },
    }
    r = apply(cp, namespace, [deploy])
    assert r.returncode == 0, r.stderr
    stored = cp.get_json("deployment", "llm", "-n", namespace)
    tsc = stored["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in tsc} >= {"kubernetes.io/hostname"}
    pods = cp.wait_for_pods(namespace, "app=llm", 3, scheduled=True, timeout=60)
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 3, f"replicas not spread: {nodes}"
    assert not any(n.startswith("l4-ts") for n in nodes), "online inference landed on a time-sliced node"


# --- what users see --------------------------------------------------------------------------------------


def test_denial_shows_rule_id_and_message(control_plane: ControlPlane, webhook: Webhook, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "chat", "labels": {"gpu-admission.io/workload": "inference"}},
        "spec": {"containers": [gpu_container(2, "nvidia.com/gpu.shared")]},
    }
    r = apply(control_plane, namespace, [pod])
    assert r.returncode != 0
    assert 'admission webhook "pods.admit.gpu-admission.io" denied the request' in r.stderr
    assert "shared-gpu-single:" in r.stderr and "Fix:" in r.stderr
    assert control_plane.kubectl("get", "pod", "chat", "-n", namespace, check=False).returncode != 0


def test_warnings_are_printed_and_dry_run_is_recorded(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    pods = training_pods("warned", 2, 8)
    for p in pods:
        del p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    r = apply(control_plane, namespace, pods[:1], "--dry-run=server")
    assert r.returncode == 0, r.stderr
    assert "Warning: training-queue-priority:" in r.stderr
    assert control_plane.kubectl("get", "pod", "warned-worker-0", "-n", namespace, check=False).returncode != 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        recs = [
            x for x in webhook.audit_records() if x.get("namespace") == namespace and x["name"] == "warned-worker-0"
        ]
        if {x["webhook"] for x in recs} == {"admit"}:  # one call: mutated and judged
            assert all(x["dryRun"] is True for x in recs)
            return
        time.sleep(0.1)
    pytest.fail("dry-run decisions missing from the audit log")


# --- workload kinds with pod templates ------------------------------------------------------------------


def test_workload_templates_are_mutated_and_denied_at_apply(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    crds.install(cp)
    tpl = {"spec": {"containers": [gpu_container(8)]}}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "llama-70b", "labels": {"kueue.x-k8s.io/queue-name": "research"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": tpl},
                "Worker": {"replicas": 1, "template": tpl},
            }
        },
    }
    deadline = time.monotonic() + 30
    while True:  # the new CRD's REST mapping takes a moment to reach kubectl's discovery
        r = apply(cp, namespace, [job])
        if r.returncode == 0 or time.monotonic() > deadline or "no matches for kind" not in r.stderr:
            break
        time.sleep(0.5)
    assert r.returncode == 0, r.stderr
    stored = cp.get_json("pytorchjob", "llama-70b", "-n", namespace)
    worker = stored["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    term = worker["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term == {
        "labelSelector": {"matchLabels": {"training.kubeflow.org/job-name": "llama-70b"}},
        "topologyKey": RACK,
    }

    elastic = json.loads(json.dumps(job))
    elastic["metadata"]["name"] = "elastic"
    elastic["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 4}
    r = apply(cp, namespace, [elastic])
    assert r.returncode != 0 and "training-elastic-shrink:" in r.stderr

    # batch/v1 Job with parallelism 4: training; the Job controller creates pods from the mutated template
    bjob = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "sweep"},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "research"}},
                "spec": {"restartPolicy": "Never", "containers": [gpu_container(4)]},
            },
        },
    }
    r = apply(cp, namespace, [bjob])
    assert r.returncode == 0, r.stderr
    pods = cp.wait_for_pods(namespace, "batch.kubernetes.io/job-name=sweep", 2, scheduled=True, timeout=60)
    racks = {cp.get_json("node", p["spec"]["nodeName"])["metadata"]["labels"].get(RACK) for p in pods}
    assert len(racks) == 1, racks

    # a Deployment of online inference asking 2 time-sliced units: denied at apply, not as FailedCreate later
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "chat"}},
            "template": {
                "metadata": {"labels": {"app": "chat"}},
                "spec": {"containers": [gpu_container(2, "nvidia.com/gpu.shared")]},
            },
        },
    }
    r = apply(cp, namespace, [bad])
    assert r.returncode != 0 and 'workloads.validate.gpu-admission.io" denied' in r.stderr


# --- fail-safety -----------------------------------------------------------------------------------------


def test_system_and_own_namespaces_are_never_intercepted(control_plane: ControlPlane, webhook: Webhook) -> None:
    cp = control_plane
    for ns in ("kube-system", NAMESPACE):
        container = gpu_container(2, "nvidia.com/gpu.shared")
        # our namespace enforces Pod Security "restricted": the probe must pass that, and only that
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"gpu-{ns}", "namespace": ns, "annotations": {"gpu-admission.io/gpu-memry": "typo"}},
            "spec": {"containers": [container]},
        }
        r = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=pod, check=False)
        assert r.returncode == 0, f"{ns}: {r.stderr}"
        assert not [x for x in webhook.audit_records() if x.get("namespace") == ns]


def test_failure_policy_when_the_webhook_is_down(control_plane: ControlPlane, webhook: Webhook, namespace: str) -> None:
    cp = control_plane
    gpu_pod = training_pods("down", 1, 1)[0]
    cpu_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
    }
    webhook.stop_server()
    try:
        t0 = time.monotonic()
        r = apply(cp, namespace, [gpu_pod])
        took = time.monotonic() - t0
        assert r.returncode != 0 and "failed calling webhook" in r.stderr  # failurePolicy: Fail
        assert took < 15, f"kubectl waited {took:.1f}s"
        r = apply(cp, namespace, [cpu_pod])  # matchConditions: a non-GPU pod never calls us
        assert r.returncode == 0, r.stderr
    finally:
        webhook.start_server()
    webhook.wait_effective()


def test_slow_webhook_never_leaves_a_request_hanging(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    """A rule slower than the API server's timeout: our internal deadline answers first (fail closed)."""
    webhook.stop_server()
    webhook.start_server("--fault-injection", "slow-rule:20000")
    try:
        t0 = time.monotonic()
        r = apply(control_plane, namespace, training_pods("slow", 1, 1))
        took = time.monotonic() - t0
        assert r.returncode != 0 and "no decision within" in r.stderr, r.stderr
        assert took < 10, f"took {took:.1f}s"
    finally:
        webhook.stop_server()
        webhook.start_server()
        webhook.wait_effective()


@pytest.mark.parametrize("tree", ["deploy", "deploy/overlays/validate-pods"])
def test_deploy_manifests_are_accepted_by_the_real_api_server(control_plane: ControlPlane, tree: str) -> None:
    # A server dry run of namespaced objects needs their namespace to exist (the webhook fixture makes it).
    control_plane.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "namespace.yaml"))
    r = control_plane.kubectl("apply", "-k", str(ROOT / tree), "--dry-run=server", check=False)
    assert r.returncode == 0, r.stderr
    kinds = {line.split("/")[0] for line in r.stdout.splitlines() if "(server dry run)" in line}
    assert {
        "deployment.apps",
        "service",
        "configmap",
        "poddisruptionbudget.policy",
        "clusterrole.rbac.authorization.k8s.io",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io",
        "validatingwebhookconfiguration.admissionregistration.k8s.io",
    } <= kinds, r.stdout


# --- policy from the ConfigMap ---------------------------------------------------------------------------


def _policy_text(cp: ControlPlane) -> str:
    return str(cp.get_json("configmap", POLICY_CONFIGMAP, "-n", NAMESPACE)["data"]["policy.yaml"])


def _set_policy(cp: ControlPlane, text: str) -> subprocess.CompletedProcess[str]:
    patch = json.dumps({"data": {"policy.yaml": text}})
    return cp.kubectl("patch", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--type=merge", "-p", patch, check=False)


def test_configmap_edit_changes_enforcement_within_two_seconds(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    original = _policy_text(cp)
    typo = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "typo", "annotations": {"gpu-admission.io/gpu-memry": "10Gi"}},
        "spec": {"containers": [gpu_container(1)]},
    }
    r = cp.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=typo, check=False)
    assert r.returncode != 0 and "gpu-admission-annotations" in r.stderr
    try:
        r = _set_policy(cp, original.replace("gpu-admission-annotations: enforce", "gpu-admission-annotations: warn"))
        assert r.returncode == 0, r.stderr
        t0 = time.monotonic()
        while True:
            r = cp.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=typo, check=False)
            if r.returncode == 0:
                break
            assert time.monotonic() - t0 < 10, "edit never took effect"
            time.sleep(0.05)
        took = time.monotonic() - t0
        print(f"policy edit enforced after {took * 1000:.0f} ms")
        assert took <= 2.0
        assert "Warning: gpu-admission-annotations:" in r.stderr

        # an invalid edit is refused at kubectl time, naming the field path
        bad = original.replace("training-same-rack: enforce", "training-same-rack: deny")
        r = _set_policy(cp, bad)
        assert r.returncode != 0
        assert "rules.training-same-rack" in r.stderr and "policy.validate.gpu-admission.io" in r.stderr

        # a restarted webhook serves the ConfigMap's current policy (warn), not the built-in one
        webhook.stop_server()
        webhook.start_server()
        webhook.wait_effective()
        r = cp.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=typo, check=False)
        assert r.returncode == 0 and "Warning: gpu-admission-annotations:" in r.stderr
    finally:
        _set_policy(cp, original)
