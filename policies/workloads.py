"""Where the pods of each workload kind are described, and how many of them a job runs.

Pod rules apply to the pod templates inside controllers too (spec §7), so `kubectl apply` of a Deployment or
a PyTorchJob is denied at apply time instead of failing later as FailedCreate events. Every accessor here
works on plain JSON and tolerates missing or mistyped fields: a malformed object yields fewer templates,
never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]

KUBEFLOW_REPLICA_SPECS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
}
APPS_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"})
# Kinds whose pods are described by a view built from the object (and, for a TrainJob, its runtime) rather
# than by a pod template inside it: policies/podviews.py.
VIEW_KINDS = frozenset({"TrainJob", "InferenceService", "LLMInferenceService"})
TEMPLATE_KINDS = frozenset(
    {"Pod", "Job", "CronJob", "JobSet", "LeaderWorkerSet", "RayJob", "RayCluster", "RayService", "VolcanoJob"}
    | APPS_KINDS
    | set(KUBEFLOW_REPLICA_SPECS)
    | VIEW_KINDS
)
ELASTICITY_KINDS = frozenset({"HorizontalPodAutoscaler", "ScaledObject"})

# The label each controller puts on the pods of one job (gpu-resources.md §6), by workload kind.
JOB_IDENTITY_LABEL = {
    "Job": "batch.kubernetes.io/job-name",
    "CronJob": "",  # each run is a new Job with a generated name: decided when its pods are created
    "JobSet": "jobset.sigs.k8s.io/jobset-name",
    "VolcanoJob": "volcano.sh/job-name",
    "TrainJob": "jobset.sigs.k8s.io/jobset-name",  # its JobSet has the TrainJob's name
    **{kind: "training.kubeflow.org/job-name" for kind in KUBEFLOW_REPLICA_SPECS},
}
# Labels that identify one job on bare pods, most specific first.
POD_JOB_LABELS = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",
    "leaderworkerset.sigs.k8s.io/name",
    "ray.io/cluster",
)


Resolver = Callable[[str, str, str], Json | None]  # (kind, namespace, name) -> object or None
Fold = Callable[[Json], None]


@dataclass(frozen=True)
class Template:
    """One pod description inside an object: `path` leads from the root to the pod-like mapping that has
    `metadata` and `spec` (the root itself for a Pod).

    A view (policies/podviews.py) is a pod-like mapping built for kinds that carry no pod template: `path` is
    where its pod spec lives, and `fold` writes what mutations added to the view back into the object (None:
    the view shares every mapping with the object, or `readonly`). A `readonly` view is judged, never mutated."""

    path: tuple[str | int, ...]
    pod: Json
    replicas: int
    role: str
    fold: Fold | None = None
    readonly: bool = False


def effective_kind(obj: Mapping[str, Any]) -> str:
    """The kind, with Volcano's `Job` told apart from batch/v1 `Job` by its API group."""
    kind = obj.get("kind")
    if not isinstance(kind, str):
        return ""
    api = obj.get("apiVersion")
    if kind == "Job" and isinstance(api, str) and api.startswith("batch.volcano.sh/"):
        return "VolcanoJob"
    return kind


def _dict(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value


def _at(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def templates(obj: Json, resolve: Resolver | None = None) -> Iterator[Template]:
    """Every pod template in the object (for a Pod: the pod itself). `resolve` finds related objects (a
    TrainJob's runtime)."""
    kind = effective_kind(obj)
    spec = _dict(obj.get("spec"))
    if kind in VIEW_KINDS:
        from policies import podviews  # (podviews builds on this module)

        yield from podviews.templates(kind, obj, resolve)
    elif kind == "Pod":
        yield Template((), obj, 1, "pod")
    elif kind in APPS_KINDS:
        if isinstance(spec.get("template"), dict):
            yield Template(("spec", "template"), spec["template"], _int(spec.get("replicas"), 1), "replica")
    elif kind == "Job":
        if isinstance(spec.get("template"), dict):
            yield Template(("spec", "template"), spec["template"], _int(spec.get("parallelism"), 1), "worker")
    elif kind == "CronJob":
        job_spec = _dict(_at(spec, "jobTemplate", "spec"))
        if isinstance(job_spec.get("template"), dict):
            yield Template(
                ("spec", "jobTemplate", "spec", "template"),
                job_spec["template"],
                _int(job_spec.get("parallelism"), 1),
                "worker",
            )
    elif kind in KUBEFLOW_REPLICA_SPECS:
        key = KUBEFLOW_REPLICA_SPECS[kind]
        for role, rs in _dict(spec.get(key)).items():
            if isinstance(rs, dict) and isinstance(rs.get("template"), dict):
                yield Template(("spec", key, role, "template"), rs["template"], _int(rs.get("replicas"), 1), role)
    elif kind == "JobSet":
        rjs = spec.get("replicatedJobs")
        for i, rj in enumerate(rjs if isinstance(rjs, list) else []):
            job_spec = _dict(_at(rj, "template", "spec"))
            if isinstance(job_spec.get("template"), dict):
                n = _int(_dict(rj).get("replicas"), 1) * _int(job_spec.get("parallelism"), 1)
                name = _dict(rj).get("name")
                yield Template(
                    ("spec", "replicatedJobs", i, "template", "spec", "template"),
                    job_spec["template"],
                    n,
                    name if isinstance(name, str) else f"replicatedJobs[{i}]",
                )
    elif kind == "LeaderWorkerSet":
        lwt = _dict(spec.get("leaderWorkerTemplate"))
        groups = _int(spec.get("replicas"), 1)
        size = _int(lwt.get("size"), 1)
        if isinstance(lwt.get("leaderTemplate"), dict):
            yield Template(("spec", "leaderWorkerTemplate", "leaderTemplate"), lwt["leaderTemplate"], groups, "leader")
            workers = groups * max(size - 1, 0)
        else:
            workers = groups * size
        if isinstance(lwt.get("workerTemplate"), dict):
            yield Template(("spec", "leaderWorkerTemplate", "workerTemplate"), lwt["workerTemplate"], workers, "worker")
    elif kind == "VolcanoJob":
        tasks = spec.get("tasks")
        for i, task in enumerate(tasks if isinstance(tasks, list) else []):
            if isinstance(task, dict) and isinstance(task.get("template"), dict):
                name = task.get("name")
                yield Template(
                    ("spec", "tasks", i, "template"),
                    task["template"],
                    _int(task.get("replicas"), 1),
                    name if isinstance(name, str) else f"tasks[{i}]",
                )
    elif kind in RAY_CLUSTER_SPEC:
        base = RAY_CLUSTER_SPEC[kind]
        cluster = _dict(_at(obj, *[str(p) for p in base]))
        head = _dict(cluster.get("headGroupSpec"))
        if isinstance(head.get("template"), dict):
            yield Template((*base, "headGroupSpec", "template"), head["template"], 1, "head")
        wgs = cluster.get("workerGroupSpecs")
        for i, wg in enumerate(wgs if isinstance(wgs, list) else []):
            if isinstance(wg, dict) and isinstance(wg.get("template"), dict):
                n = ray_group_pods(wg)
                name = wg.get("groupName")
                yield Template(
                    (*base, "workerGroupSpecs", i, "template"),
                    wg["template"],
                    n,
                    name if isinstance(name, str) else f"workerGroupSpecs[{i}]",
                )


# Where each KubeRay kind keeps its RayClusterSpec (ray.io/v1; a RayJob with `clusterSelector` has none).
RAY_CLUSTER_SPEC: dict[str, tuple[str | int, ...]] = {
    "RayCluster": ("spec",),
    "RayJob": ("spec", "rayClusterSpec"),
    "RayService": ("spec", "rayClusterConfig"),
}


def suspended(obj: Json) -> bool:
    """A workload created or kept suspended, whose controller makes no pod until it is resumed (a queue such as
    Kueue admits it): `spec.suspend` (Job, JobSet, TrainJob, RayJob) or `spec.runPolicy.suspend` (the
    Kubeflow training operator's jobs). Never a Pod."""
    if obj.get("kind") == "Pod":
        return False
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return False
    run = spec.get("runPolicy")
    return spec.get("suspend") is True or (isinstance(run, dict) and run.get("suspend") is True)


def ray_group_pods(wg: Json) -> int:
    """Pods of one worker group: `replicas` (else `minReplicas`, else 1) replicas of `numOfHosts` pods each; a
    suspended group has none (KubeRay deletes its pods)."""
    if wg.get("suspend") is True:
        return 0
    return _int(wg.get("replicas"), _int(wg.get("minReplicas"), 1)) * _int(wg.get("numOfHosts"), 1)


def ray_service_selector(obj: Json, role: str) -> Json | None:
    """Labels KubeRay puts on every pod of one group of a RayService's cluster (whose own name is generated):
    the RayService's name and kind, and the group (`headgroup` for the head)."""
    name = _at(obj, "metadata", "name")
    if not isinstance(name, str) or not name or role.startswith("workerGroupSpecs["):
        return None
    group = "headgroup" if role == "head" else role
    labels = {"ray.io/originated-from-crd": "RayService", "ray.io/originated-from-cr-name": name, "ray.io/group": group}
    return {"matchLabels": labels}


def containers(pod: Json, *, init: bool = True) -> Iterator[Json]:
    """Containers (and init containers) of a pod or pod template that are mappings."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    for key in ("initContainers", "containers") if init else ("containers",):
        items = spec.get(key)
        if isinstance(items, list):
            for c in items:
                if isinstance(c, dict):
                    yield c
