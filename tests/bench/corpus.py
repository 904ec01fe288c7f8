"""The objects the benchmarks review: realistic GPU workloads as the API server hands them to the webhook.

Pods carry what the API server has set before calling admission webhooks (defaulted fields, the default
tolerations of the DefaultTolerationSeconds plugin) and what their controller set (labels, ownerReferences,
env), so that parsing, copying and diffing cost what they cost in a cluster. Templates come from examples/.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import jsonpatch
import orjson
import yaml

from policies import inventory as inventory_mod
from policies.document import Policy, default_policy
from policies.engine import ReviewContext, review
from policies.inventory import Inventory
from tests.serverproc import ROOT

NODES_FILE = ROOT / "examples" / "cluster" / "nodes.yaml"
Json = dict[str, Any]
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _load(path: str, kind: str | None = None) -> Json:
    docs = [d for d in yaml.safe_load_all((ROOT / path).read_text(encoding="utf-8")) if d]
    for d in docs:
        if kind is None or d.get("kind") == kind:
            return dict(d)
    raise LookupError(f"no {kind} in {path}")


@functools.cache
def policy() -> Policy:
    return default_policy()


@functools.cache
def inventory() -> Inventory:
    docs = [d for d in yaml.safe_load_all(NODES_FILE.read_text(encoding="utf-8")) if d]
    nodes: list[Any] = []
    for d in docs:
        nodes.extend(d["items"] if d.get("kind") == "List" else [d])
    return inventory_mod.build(nodes, policy())


def api_defaults(pod: Json) -> Json:
    """The fields the API server fills in (defaulting, DefaultTolerationSeconds) before webhooks see a Pod."""
    spec = pod.setdefault("spec", {})
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("imagePullPolicy", "Always" if str(c.get("image", "")).endswith(":latest") else "IfNotPresent")
        res = c.setdefault("resources", {})
        limits = res.get("limits") or {}
        requests = res.setdefault("requests", {})
        for k, v in limits.items():  # requests default to limits
            requests.setdefault(k, v)
        # Quantities come in as strings from the API server.
        for part in ("limits", "requests"):
            if part in res:
                res[part] = {k: str(v) for k, v in res[part].items()}
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault(
        "tolerations",
        [
            {"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        ],
    )
    for v in spec.get("volumes", []):
        if "emptyDir" in v:
            v["emptyDir"] = {k: str(x) for k, x in v["emptyDir"].items()}
    return pod


def _fields(value: Any) -> Json:
    """A FieldsV1 set for `value` (keys as f:, named list items as k:), as server-side field tracking writes."""
    if isinstance(value, dict):
        return {f"f:{k}": _fields(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return {f'k:{{"name":"{v["name"]}"}}': {".": {}, **_fields(v)} for v in value}
    return {}


def managed_fields(obj: Json, manager: str) -> Json:
    """What the API server's field manager has set when admission runs (`metadata.managedFields`): it is
    part of every object webhooks receive, and a large share of its bytes."""
    tracked = {k: v for k, v in obj.items() if k in ("metadata", "spec")}
    tracked["metadata"] = {
        k: v for k, v in tracked.get("metadata", {}).items() if k in ("labels", "annotations", "ownerReferences")
    }
    obj["metadata"]["managedFields"] = [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": obj.get("apiVersion", "v1"),
            "time": "2026-11-30T08:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields(tracked),
        }
    ]
    return obj


def _pod(template: Json, name: str, namespace: str, labels: Json, owner: Json | None) -> Json:
    meta = copy.deepcopy(template.get("metadata") or {})
    meta["name"] = name
    meta["namespace"] = namespace
    meta.setdefault("labels", {}).update(labels)
    if owner:
        meta["ownerReferences"] = [dict(owner, controller=True, blockOwnerDeletion=True)]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(template["spec"])}
    return api_defaults(pod)


def applied(obj: Json) -> Json:
    """As `kubectl apply` creates it: the last-applied-configuration annotation and its managedFields."""
    last = orjson.dumps(obj).decode()
    obj.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = last
    return managed_fields(obj, "kubectl-client-side-apply")


def pytorchjob() -> Json:
    return applied(_load("examples/training/pytorchjob-2x8.yaml"))


def jobset() -> Json:
    return applied(_load("examples/training/jobset.yaml"))


def inference_deployment() -> Json:
    return applied(_load("examples/inference/deployment-hpa.yaml", "Deployment"))


def mig_pod() -> Json:
    return applied(api_defaults(_load("examples/inference/mig-slice-pod.yaml")))


def training_pod(*, from_mutated_template: bool = True, name: str = "llama3-8b-sft-worker-0") -> Json:
    """An 8-GPU worker pod of the 2x8 PyTorchJob as the Kubeflow training operator creates it: the operator's
    labels, owner and rendezvous env on the (by default: already mutated) Worker template."""
    job = pytorchjob()
    if from_mutated_template:
        job = review(job, policy=policy(), inventory=inventory()).object
    tpl = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    jname = job["metadata"]["name"]
    labels = {
        "training.kubeflow.org/job-name": jname,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-index": "0",
        "training.kubeflow.org/replica-type": "worker",
    }
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": jname,
        "uid": "6f1c2f4e-0d7b-4a5e-9a57-3b1f0f1b2c3d",
    }
    pod = _pod(tpl, name, job["metadata"]["namespace"], labels, owner)
    pod["spec"]["restartPolicy"] = "OnFailure"
    env = pod["spec"]["containers"][0].setdefault("env", [])
    env += [
        {"name": "MASTER_PORT", "value": "23456"},
        {"name": "MASTER_ADDR", "value": f"{jname}-master-0"},
        {"name": "WORLD_SIZE", "value": "2"},
        {"name": "RANK", "value": "1"},
        {"name": "PET_MASTER_PORT", "value": "23456"},
        {"name": "PET_MASTER_ADDR", "value": f"{jname}-master-0"},
        {"name": "PET_NNODES", "value": "2"},
        {"name": "PET_NODE_RANK", "value": "1"},
        {"name": "PET_NPROC_PER_NODE", "value": "8"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    return managed_fields(pod, "pytorch-operator")


EIGHT_GPUS = {"deviceClassName": "gpu.nvidia.com", "count": 8}
CLAIM_TEMPLATE: Json = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "eight-gpus", "namespace": "ml-research"},
    "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": EIGHT_GPUS}]}}},
}


def training_claim_pod() -> Json:
    """The 8-GPU worker pod taking its GPUs through DRA instead: a claim from CLAIM_TEMPLATE (resolved from
    the case's related objects, as the server resolves it from its cache)."""
    pod = training_pod()
    spec = pod["spec"]
    spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]
    res = spec["containers"][0]["resources"]
    for section in ("limits", "requests"):
        res.get(section, {}).pop("nvidia.com/gpu", None)
    res["claims"] = [{"name": "gpus"}]
    return pod


def context(related: tuple[Json, ...]) -> ReviewContext | None:
    """A review context resolving `related` objects by (kind, namespace, name), or None without any."""
    if not related:
        return None
    index = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in related}
    return ReviewContext(resolve=lambda kind, ns, name: index.get((kind, ns, name)))


def inference_replica_pod(name: str = "llama3-8b-instruct-7d9f8c6b5d-x2x7k") -> Json:
    """A replica of the inference Deployment, as its ReplicaSet creates it (from the mutated template)."""
    dep = review(inference_deployment(), policy=policy(), inventory=inventory()).object
    tpl = dep["spec"]["template"]
    labels = {"pod-template-hash": "7d9f8c6b5d"}
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "llama3-8b-instruct-7d9f8c6b5d",
        "uid": "0b8e2d1c-4b51-4a3e-8d0f-5e1c2f3a4b5c",
    }
    return managed_fields(_pod(tpl, name, dep["metadata"]["namespace"], labels, owner), "kube-controller-manager")


def cpu_pod(name: str = "web-5b7d9c-abcde") -> Json:
    """A pod asking for no GPU: the fast path (allowed untouched, empty patch)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "web", "labels": {"app": "web", "pod-template-hash": "5b7d9c"}},
        "spec": {
            "containers": [
                {
                    "name": "nginx",
                    "image": "nginx:1.27",
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
                }
            ]
        },
    }
    return managed_fields(api_defaults(pod), "kube-controller-manager")


@dataclass(frozen=True)
class Case:
    """One corpus entry: the object as created, and as the validating webhook sees it (after mutation)."""

    name: str
    what: str
    obj: Json
    headline: bool = False
    related: tuple[Json, ...] = ()  # objects the review resolves (a claim's template)

    @functools.cached_property
    def mutated(self) -> Json:
        r = review(self.obj, policy=policy(), inventory=inventory(), ctx=context(self.related), validate=False)
        return jsonpatch.apply_patch(self.obj, list(r.patch)) if r.patch else self.obj


def engine_corpus() -> list[Case]:
    return [
        Case(
            "training-pod-8gpu",
            "8-GPU worker pod of a 2x8 PyTorchJob (template already mutated)",
            training_pod(),
            headline=True,
        ),
        Case(
            "training-pod-8gpu-fresh",
            "the same pod from an unmutated template (mutations apply)",
            training_pod(from_mutated_template=False),
        ),
        Case(
            "training-pod-8gpu-dra",
            "the same worker taking 8 GPUs through a ResourceClaimTemplate (DRA)",
            training_claim_pod(),
            related=(CLAIM_TEMPLATE,),
        ),
        Case("pytorchjob-2x8", "PyTorchJob, Master + Worker templates, 8 GPUs each", pytorchjob()),
        Case("jobset-2x8", "JobSet, 2 x 8 GPUs, Kueue TAS", jobset()),
        Case("inference-mig-pod", "inference pod with gpu-memory 10Gi (becomes a MIG 1g.10gb slice)", mig_pod()),
        Case("inference-deployment", "vLLM Deployment on whole GPUs", inference_deployment()),
        Case("inference-replica-pod", "a replica pod of that Deployment", inference_replica_pod()),
        Case("cpu-pod", "pod without GPU (fast path)", cpu_pod()),
    ]


def server_mix() -> list[tuple[str, Json]]:
    """(webhook, object) pairs for the server benchmark: realistic pods, each sent to /admit as created —
    what the API server sends for a Pod (one call: mutate, then judge the mutated object)."""
    out: list[tuple[str, Json]] = []
    for case in (
        Case("training-pod-8gpu", "", training_pod()),
        Case("training-pod-8gpu-fresh", "", training_pod(from_mutated_template=False)),
        Case("inference-mig-pod", "", mig_pod()),
        Case("inference-replica-pod", "", inference_replica_pod()),
    ):
        out.append(("admit", case.obj))
    return out


def with_placeholder(obj: Json) -> Json:
    """A copy whose metadata.name ends in -{{i}} (the load generator numbers each request)."""
    out = copy.deepcopy(obj)
    out["metadata"]["name"] = f"{out['metadata'].get('name', 'bench')}-{{{{i}}}}"
    return out


UNSCHEDULED = "gpu-admission-bench-unscheduled"  # no scheduler by that name runs: pods stay Pending


def apiserver_pods() -> list[Json]:
    """The GPU pods created through the API server in every configuration (names made unique per request,
    namespace given by the URL): a fresh 8-GPU training pod (mutated: node and pod affinity), the same pod
    from a mutated template (nothing to change), and a MIG inference pod (rewritten to nvidia.com/mig-1g.10gb).

    Without ownerReferences (their owners do not exist: the garbage collector would delete the pods during a
    run) and with a scheduler name no scheduler serves, so that nothing but the creates loads the API server
    and every configuration leaves the same background work (none)."""
    pods = []
    for name, pod in (
        ("train-fresh", training_pod(from_mutated_template=False)),
        ("train", training_pod()),
        ("mig", mig_pod()),
    ):
        meta = pod["metadata"]
        meta["name"] = f"{name}-{{{{i}}}}"
        for key in ("namespace", "managedFields", "ownerReferences"):
            meta.pop(key, None)
        meta.get("annotations", {}).pop(LAST_APPLIED, None)
        pod["spec"]["schedulerName"] = UNSCHEDULED
        pods.append(pod)
    return pods
