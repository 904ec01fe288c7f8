"""The in-tree alternative: a subset of our validation rules as a ValidatingAdmissionPolicy in CEL.

Equivalent, for Pods, to these parts of the product's rules (spec §6):
- shared-gpu-single: at most one unit of a shared GPU resource (`nvidia.com/gpu.shared`,
  `nvidia.com/mig-<profile>.shared`) per container;
- gpu-request-fits: requests equal limits for every `nvidia.com/` resource; no whole GPU and MIG slice in one
  container;
- gpu-admission-annotations: no unknown `gpu-admission.io/` annotation or label key.
What CEL cannot do here is everything that needs the cluster's GPU inventory (which nodes are time-sliced,
the largest node, the MIG profiles on offer) or a mutation; the benchmark compares the cost of evaluating
in-process against calling out to the webhook, not the features.
"""

from __future__ import annotations

from typing import Any

POLICY_NAME = "gpu-admission-cel-subset"
EXCLUDED_NAMESPACES = ["kube-system", "kube-node-lease", "kube-public", "gpu-admission"]
ANNOTATION_KEYS = ["gpu-admission.io/gpu-memory", "gpu-admission.io/latency", "gpu-admission.io/job-gpus"]
LABEL_KEYS = ["gpu-admission.io/workload", "gpu-admission.io/job"]

# Every container of the pod, init containers included (a policy variable, evaluated once per request).
CONTAINERS = "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])"
_ALL = "variables.containers"
_SHARED = "(k == 'nvidia.com/gpu.shared' || (k.startsWith('nvidia.com/mig-') && k.endsWith('.shared')))"


def _res(part: str) -> str:
    """The requests/limits map of container `c` (an empty map when absent)."""
    return f"(has(c.resources) && has(c.resources.{part}) ? c.resources.{part} : {{}})"


def _qty(part: str) -> str:
    return f"quantity(string({_res(part)}[k]))"


def _shared_at_most_one(part: str) -> str:
    return f"{_res(part)}.all(k, !{_SHARED} || {_qty(part)}.compareTo(quantity('1')) <= 0)"


def _equal_to_other(part: str, other: str) -> str:
    """Every nvidia.com/ key of `part` is in `other` with an equal quantity (requests: also required there)."""
    present = f"k in {_res(other)}"
    condition = f"({present} && {_qty(part)}.compareTo({_qty(other)}) == 0)"
    if part == "limits":  # a limit without a request is fine (the request defaults to it)
        condition = f"(!({present}) || {_qty(part)}.compareTo({_qty(other)}) == 0)"
    return f"{_res(part)}.all(k, !k.startsWith('nvidia.com/') || {condition})"


WHOLE = "k == 'nvidia.com/gpu'"
MIG = "k.startsWith('nvidia.com/mig-')"


def _has(key_test: str) -> str:
    return f"({_res('limits')}.exists(k, {key_test}) || {_res('requests')}.exists(k, {key_test}))"


VALIDATIONS: list[dict[str, str]] = [
    {
        "expression": f"{_ALL}.all(c, {_shared_at_most_one('limits')} && {_shared_at_most_one('requests')})",
        "message": "shared-gpu-single: more than one unit of a shared (time-sliced/MPS) GPU resource in a "
        "container gives no extra GPU. Fix: ask for 1",
    },
    {
        "expression": f"{_ALL}.all(c, {_equal_to_other('requests', 'limits')} && "
        f"{_equal_to_other('limits', 'requests')})",
        "message": "gpu-request-fits: GPU requests must equal limits. Fix: set only limits for nvidia.com/ resources",
    },
    {
        "expression": f"{_ALL}.all(c, !({_has(WHOLE)} && {_has(MIG)}))",
        "message": "gpu-request-fits: a container asks for whole GPUs and MIG slices at once. Fix: ask for one kind",
    },
    {
        "expression": "(!has(object.metadata.annotations) || object.metadata.annotations.all(k, "
        f"!k.startsWith('gpu-admission.io/') || k in {ANNOTATION_KEYS!r})) && (!has(object.metadata.labels) || "
        f"object.metadata.labels.all(k, !k.startsWith('gpu-admission.io/') || k in {LABEL_KEYS!r}))",
        "message": "gpu-admission-annotations: unknown gpu-admission.io/ key. Fix: use gpu-memory, latency, "
        "job-gpus (annotations) or workload, job (labels)",
    },
]


def objects() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (Deny), matching Pod CREATE like our webhook does."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": EXCLUDED_NAMESPACES}
                    ]
                },
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ],
            },
            "variables": [{"name": "containers", "expression": CONTAINERS}],
            "validations": VALIDATIONS,
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def violating_pod(namespace: str) -> dict[str, Any]:
    """A pod every configuration with these rules denies (two units of a time-sliced GPU)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cel-probe", "namespace": namespace},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}]
        },
    }
