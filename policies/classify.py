"""Workload class: training, inference, batch, or unclassified (spec §3, first match wins)."""

from __future__ import annotations

from typing import Any

from policies.workloads import KUBEFLOW_REPLICA_SPECS, Json

TRAINING_KINDS = frozenset({*KUBEFLOW_REPLICA_SPECS, "JobSet", "VolcanoJob", "RayJob", "TrainJob"})
# RayService and KServe serve requests: online inference (docs/policy.md, "Workload kinds").
INFERENCE_KINDS = frozenset(
    {"Deployment", "StatefulSet", "ReplicaSet", "LeaderWorkerSet"}
    | {"RayService", "InferenceService", "LLMInferenceService"}
)
BATCH_KINDS = frozenset({"CronJob", "RayCluster"})

# Bare-pod evidence (gpu-resources.md §6): labels set by each controller on the pods it creates.
_TRAINING_POD_LABELS = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-completion-index",  # an indexed Job: distributed training
)
_RAY_ORIGIN_CLASS = {"RayService": "inference", "RayJob": "training"}
_OWNER_CLASS = {
    "ReplicaSet": "inference",
    "StatefulSet": "inference",
    "LeaderWorkerSet": "inference",
    "Job": "batch",
    "CronJob": "batch",
    "RayCluster": "batch",
    "JobSet": "training",
    "RayJob": "training",
    "RayService": "inference",
    "InferenceService": "inference",
    "LLMInferenceService": "inference",
    "TrainJob": "training",
    **{kind: "training" for kind in KUBEFLOW_REPLICA_SPECS},
}


def by_kind(kind: str, obj: Json) -> str | None:
    if kind in TRAINING_KINDS:
        return "training"
    if kind in INFERENCE_KINDS:
        return "inference"
    if kind in BATCH_KINDS:
        return "batch"
    if kind == "Job":
        spec = obj.get("spec")
        par: Any = spec.get("parallelism") if isinstance(spec, dict) else None
        return "training" if isinstance(par, int) and not isinstance(par, bool) and par > 1 else "batch"
    return None


def by_pod(pod: Json) -> str | None:
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return None
    labels = meta.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    if not labels.keys().isdisjoint(_TRAINING_POD_LABELS):
        return "training"
    if "leaderworkerset.sigs.k8s.io/name" in labels or "serving.kserve.io/inferenceservice" in labels:
        return "inference"
    # KubeRay names the kind a RayCluster was made for on its pods (ray.io/originated-from-crd).
    origin = _RAY_ORIGIN_CLASS.get(str(labels.get("ray.io/originated-from-crd")))
    if origin:
        return origin
    if "batch.kubernetes.io/job-name" in labels or "job-name" in labels or "ray.io/cluster" in labels:
        return "batch"
    owners = meta.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else []:
        if isinstance(owner, dict) and owner.get("controller") is not False:
            found = _OWNER_CLASS.get(str(owner.get("kind")))
            if found:
                return found
    return None


def classify(kind: str, obj: Json, explicit: str | None) -> str | None:
    """The workload class; `explicit` is the gpu-admission.io/workload label if the user set one."""
    if explicit:
        return explicit
    if kind == "Pod":
        return by_pod(obj)
    return by_kind(kind, obj)


def default_latency(workload: str | None) -> str:
    return "online" if workload == "inference" else "offline"
