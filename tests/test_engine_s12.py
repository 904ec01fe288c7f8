"""policies/engine.py in process, for session 11's open `review` mutants (session 12, issue #20): the
`serve --native-mutations` paths the golden cases cannot reach (their harness has no native context) — an
object the MutatingAdmissionPolicies see only in part, and a pod with no GPU but a misspelt key."""

from __future__ import annotations

import copy
from typing import Any

from policies import native
from policies.engine import review
from policies.subject import ReviewContext
from tests.test_golden import inventory_for, policy_for

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# gpu-toleration and scheduler-queue can both be MutatingAdmissionPolicies under this policy.
POLICY = policy_for(
    {
        "gpuNodes": {"tolerations": [TOLERATION]},
        "training": {"schedulerName": "volcano", "priorityClassName": "training"},
    }
)
NATIVE = ReviewContext(native=native.NATIVE_RULES | native.native_mutations(POLICY))


def _replica(resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "replicas": 1,
        "template": {
            "spec": {
                "containers": [{"name": "pytorch", "image": "nvcr.io/nvidia/pytorch:24.05-py3", "resources": resources}]
            }
        },
    }


def test_the_native_mutations_cover_a_toleration_here() -> None:
    assert "gpu-toleration" in native.native_mutations(POLICY)


def test_a_pod_the_native_policies_see_is_skipped_and_the_next_one_still_mutated() -> None:
    """A PyTorchJob whose Master asks nvidia.com/gpu (the MutatingAdmissionPolicy's CEL sees it and tolerates it
    in the API server) and whose Worker asks the DRA DeviceClass's extended resource (the CEL does not see it):
    the webhook skips the Master and goes on to tolerate the Worker itself (kills review 126, `break` for
    `continue`, which left every template after a covered one untolerated)."""
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "llama-ft",
            "namespace": "ml-research",
            "labels": {"kueue.x-k8s.io/queue-name": "research"},
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": _replica({"limits": {"nvidia.com/gpu": 8}}),
                "Worker": _replica({"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 8}}),
            }
        },
    }
    inv = inventory_for("examples/cluster/dra.yaml", POLICY)
    r = review(copy.deepcopy(job), policy=POLICY, inventory=inv, ctx=NATIVE)
    assert "gpu-toleration" in r.mutations
    specs = r.object["spec"]["pytorchReplicaSpecs"]
    assert "tolerations" not in specs["Master"]["template"]["spec"]  # the API server's policy tolerates it
    assert specs["Worker"]["template"]["spec"]["tolerations"] == [TOLERATION]
    # Without the native context the webhook tolerates both.
    full = review(copy.deepcopy(job), policy=POLICY, inventory=inv)
    tolerated = full.object["spec"]["pytorchReplicaSpecs"]
    assert tolerated["Master"]["template"]["spec"]["tolerations"] == [TOLERATION]


def test_a_pod_with_only_a_misspelt_key_gets_no_mutation_result_under_native_mutations() -> None:
    """The misspelt-key path judges a pod that asks no GPU by gpu-admission-annotations alone and mutates nothing:
    under `serve --native-mutations` too, where a mutation that ran would report itself as left to the API server
    (`native`) for a pod the CEL does not see (kills review 94, `mutate` left on in that path)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "prep", "namespace": "ml", "annotations": {"gpu-admission.io/gpu-memroy": "10Gi"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "1"}}}]},
    }
    original = copy.deepcopy(pod)
    inv = inventory_for("examples/cluster/nodes.yaml", POLICY)
    r = review(pod, policy=POLICY, inventory=inv, ctx=NATIVE)
    assert [(x.rule, x.outcome) for x in r.results] == [("gpu-admission-annotations", "deny")]
    assert r.mutations == () and r.patch == () and r.object is pod and pod == original
