"""Mutation-testing gaps of policies/mutations.py (issue #20, session 11, second half of the module): behaviour
the golden cases cannot show (two reviews against one pod-view snapshot), or shows only one case at a time."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from policies import mutations, subject
from policies.document import compile_policy
from policies.engine import ReviewContext
from tests.test_placement import HELD, INV, _default_text, _gang_pod, bound_pod, capacity, run


def test_the_only_reserved_gpus_answer_is_kept_per_pod_size_on_one_snapshot() -> None:
    """The server reviews many pods against one pod-view snapshot, and `only_reserved_gpus` memoizes its answer
    there, keyed by what decides it. rack-big has one node with 4 GPUs free: an 8-GPU pod of a gang no rack holds
    could run only on rack-small's GPUs reserved for another gang (held), a 4-GPU pod of the same gang fits on
    that node (let through). The second answer is not the first one's, in either order."""
    half = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8 - 4 * (i == 1)) for i in (1, 2, 3, 4)))
    first = run(_gang_pod("g-1", 8, 32), half, (HELD,))
    assert not first.allowed and [d.rule for d in first.denials] == ["training-same-rack"]
    assert "fits only on GPUs reserved for another job's gang in rack rack-small" in first.denials[0].message
    assert run(_gang_pod("g-2", 4, 32), half, (HELD,)).allowed

    other = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8 - 4 * (i == 1)) for i in (1, 2, 3, 4)))
    assert run(_gang_pod("g-2", 4, 32), other, (HELD,)).allowed
    assert not run(_gang_pod("g-1", 8, 32), other, (HELD,)).allowed


# --- claims_nvlink_domain: what says a job needs one NVLink domain (a ComputeDomain's IMEX channel) ----------


def _pod_with(claims: Any = None, terms: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}
    if claims is not None:
        spec["resourceClaims"] = claims
    if terms is not None:
        required = {"nodeSelectorTerms": terms}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml-research"}, "spec": spec}


def _exists(key: str, operator: str = "Exists") -> dict[str, Any]:
    expr: dict[str, Any] = {"key": key, "operator": operator}
    if operator == "In":
        expr["values"] = ["5f1e.0"]
    return {"matchExpressions": [expr]}


@pytest.mark.parametrize(
    ("pod", "claims"),
    [
        # A channel hint in any one of the claim's three names is enough.
        (_pod_with([{"name": "imex-channel", "resourceClaimTemplateName": "qwen-cd"}]), True),
        (_pod_with([{"name": "nvl", "resourceClaimTemplateName": "qwen-compute-domain-channel"}]), True),
        (_pod_with([{"name": "nvl", "resourceClaimName": "qwen-IMEX"}]), True),
        (_pod_with([{"name": "scratch", "resourceClaimTemplateName": "nvme-scratch"}]), False),
        (_pod_with(["imex-channel"]), False),  # not a mapping (the API server refuses it): read as no claim
        # The documented placement of a ComputeDomain's pods: required `nvidia.com/gpu.clique Exists`.
        (_pod_with(terms=[_exists("nvidia.com/gpu.clique")]), True),
        (_pod_with(terms=[_exists("accelerator.topograph.run/domain")]), True),
        (_pod_with(terms=[_exists("nvidia.com/gpu.present")]), False),
        (_pod_with(terms=[_exists("nvidia.com/gpu.clique", "In")]), False),  # a pin, not the ComputeDomain form
        (_pod_with(terms=["nvidia.com/gpu.clique"]), False),
        (_pod_with(terms=[{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]), False),
    ],
)
def test_what_claims_an_nvlink_domain(pod: dict[str, Any], claims: bool) -> None:
    policy = compile_policy(yaml.safe_load(_default_text()))
    s = subject.build(pod, policy, INV, ReviewContext(namespace="ml-research"))
    assert mutations.claims_nvlink_domain(s) is claims


def test_reserved_keep_off_answers_each_pod_on_one_snapshot_and_never_keeps_a_job_off_its_own_reservation() -> None:
    """rack-small is reserved for job `held`: a 4-GPU pod of another job is kept off it (required NotIn), while an
    unpinned pod of `held` itself gets nothing, though reviewed next against the same snapshot (the keep-off
    answer is memoized there, per job and gang)."""
    cap = capacity()
    other = run(bound_pod("p", "", 4), cap, (HELD,))
    assert other.mutations == ("reserved-keep-off",)
    own = run(bound_pod("held-x", "", 4, job_name="held"), cap, (HELD,))
    assert own.allowed and own.mutations == () and own.patch == ()
