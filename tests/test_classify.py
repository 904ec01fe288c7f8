"""How a bare Pod is classified from what its controller wrote on it (docs/policy.md, classification): the
labels each controller sets first, then the controlling owner's kind. Pods reach the webhook one by one from
every controller, so each label and each owner kind is a case of its own."""

from __future__ import annotations

from typing import Any

import pytest

from policies.classify import by_pod


def pod(labels: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "labels": labels or {}}
    if owners is not None:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"training.kubeflow.org/job-name": "j"}, "training"),
        ({"jobset.sigs.k8s.io/jobset-name": "j"}, "training"),
        ({"volcano.sh/job-name": "j"}, "training"),
        ({"batch.kubernetes.io/job-completion-index": "0"}, "training"),  # an indexed Job
        ({"leaderworkerset.sigs.k8s.io/name": "lws"}, "inference"),
        ({"batch.kubernetes.io/job-name": "j"}, "batch"),
        ({"job-name": "j"}, "batch"),  # the Job controller's legacy label
        ({"ray.io/cluster": "c"}, "batch"),
        ({"serving.kserve.io/inferenceservice": "isvc", "component": "predictor"}, "inference"),
        # KubeRay names the kind a cluster was made for: a RayService serves, a RayJob trains
        ({"ray.io/cluster": "c", "ray.io/originated-from-crd": "RayService"}, "inference"),
        ({"ray.io/cluster": "c", "ray.io/originated-from-crd": "RayJob"}, "training"),
        ({"ray.io/cluster": "c", "ray.io/originated-from-crd": "RayCluster"}, "batch"),
        ({"app": "web"}, None),
        # training labels win over the others a training pod also carries
        ({"batch.kubernetes.io/job-name": "j", "batch.kubernetes.io/job-completion-index": "1"}, "training"),
    ],
)
def test_controller_labels(labels: dict[str, str], expected: str | None) -> None:
    assert by_pod(pod(labels)) == expected


@pytest.mark.parametrize(
    ("owner", "expected"),
    [
        ({"kind": "ReplicaSet", "name": "o", "controller": True}, "inference"),
        ({"kind": "StatefulSet", "name": "o"}, "inference"),  # controller unset counts as the controller
        ({"kind": "Job", "name": "o", "controller": True}, "batch"),
        ({"kind": "RayCluster", "name": "o", "controller": True}, "batch"),
        ({"kind": "PyTorchJob", "name": "o", "controller": True}, "training"),
        ({"kind": "TrainJob", "name": "o", "controller": True}, "training"),
        ({"kind": "RayService", "name": "o", "controller": True}, "inference"),
        ({"kind": "InferenceService", "name": "o", "controller": True}, "inference"),
        ({"kind": "LLMInferenceService", "name": "o", "controller": True}, "inference"),
        ({"kind": "ReplicaSet", "name": "o", "controller": False}, None),  # an owner, not the controller
        ({"kind": "ConfigMap", "name": "o", "controller": True}, None),
    ],
)
def test_controlling_owner(owner: dict[str, Any], expected: str | None) -> None:
    assert by_pod(pod(owners=[owner])) == expected


def test_malformed_metadata_is_unclassified() -> None:
    assert by_pod({"kind": "Pod", "metadata": []}) is None
    assert by_pod(pod(owners=["not-a-mapping", {"kind": "Job", "controller": True}])) == "batch"  # type: ignore[list-item]
    assert by_pod({"kind": "Pod", "metadata": {"labels": "x", "ownerReferences": {"kind": "Job"}}}) is None
