"""Minimal CustomResourceDefinitions for the workload kinds gpu-admission handles (spec §7).

No operator runs here, so a structural schema that preserves unknown fields is enough for the API server to
store the objects and call our webhooks on them — which is what the tests and the demo need. Group, version,
kind and plural follow the upstream projects.
"""

from __future__ import annotations

from typing import Any

KINDS: tuple[tuple[str, str, str, str], ...] = (
    # group, version(s) (the last one stored; several are served alike, as unknown fields are preserved),
    # kind, plural
    ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
    ("kubeflow.org", "v1", "TFJob", "tfjobs"),
    ("kubeflow.org", "v2beta1", "MPIJob", "mpijobs"),
    ("kubeflow.org", "v1", "XGBoostJob", "xgboostjobs"),
    ("kubeflow.org", "v1", "PaddleJob", "paddlejobs"),
    ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets"),
    ("batch.volcano.sh", "v1alpha1", "Job", "jobs"),
    ("ray.io", "v1", "RayJob", "rayjobs"),
    ("ray.io", "v1", "RayCluster", "rayclusters"),
    ("ray.io", "v1", "RayService", "rayservices"),
    ("serving.kserve.io", "v1beta1", "InferenceService", "inferenceservices"),
    ("serving.kserve.io", "v1alpha1,v1alpha2", "LLMInferenceService", "llminferenceservices"),
    ("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs"),
    ("trainer.kubeflow.org", "v1alpha1", "TrainingRuntime", "trainingruntimes"),
    ("trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes"),
    ("keda.sh", "v1alpha1", "ScaledObject", "scaledobjects"),
)
CLUSTER_SCOPED = frozenset({"ClusterTrainingRuntime"})


def crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": kind + "List"},
            "scope": "Cluster" if kind in CLUSTER_SCOPED else "Namespaced",
            "versions": [
                {
                    "name": name,
                    "served": True,
                    "storage": i == len(versions) - 1,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
                for versions in [version.split(",")]
                for i, name in enumerate(versions)
            ],
        },
    }


def all_crds() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": [crd(*k) for k in KINDS]}


def install(cp: Any) -> None:
    """Create the CRDs and wait until the API server serves them."""
    cp.kubectl("apply", "-f", "-", input=all_crds())
    names = [f"crd/{plural}.{group}" for group, _, _, plural in KINDS]
    cp.kubectl("wait", "--for=condition=Established", *names, "--timeout=60s")
