"""The engine's caches never change a decision.

- `Subject` caches what it derives from the pod specs (ask, candidates, rack constraint, job); after a
  mutation it forgets what that mutation declares it touches (`Mutation.touches`). Checked on every golden
  case and on generated workloads: with every cache filled before each mutation, every cached value after it
  equals a fresh derivation.
- Rules see what the mutations of the same review added.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from policies import inventory as inventory_mod
from policies.engine import ReviewContext, review
from policies.mutations import MUTATIONS, _rack_constraint, has_rack_constraint
from policies.resources import pod_ask
from policies.selectors import node_filter
from policies.subject import EVERYTHING, Subject, _derive_job, build
from policies.workloads import TEMPLATE_KINDS, effective_kind
from tests import test_golden as golden
from tests.test_properties import FULL, INVENTORY, POLICY, SETTINGS, wire, workloads

RACK = "topology.kubernetes.io/rack"


def golden_input(case: str) -> dict[str, Any]:
    obj: dict[str, Any] = golden.load_case(golden.CASES / f"{case}.yaml")["input"]
    return obj


# A 2x8 PyTorchJob; a Job whose one-GPU container gpu-slice pins to time-sliced nodes; a pod of a 2x8 job
# created from an unmutated template.
PYTORCHJOB = golden_input("kinds/pytorchjob")
TWO_CONTAINER_JOB = golden_input("rules/shared-gpu-single-pinned-by-gpu-slice")
TRAINING_POD: dict[str, Any] = yaml.safe_load(
    """
apiVersion: v1
kind: Pod
metadata:
  name: detr-coco-worker-0
  namespace: vision
  labels: {training.kubeflow.org/job-name: detr-coco, training.kubeflow.org/replica-type: worker,
           kueue.x-k8s.io/queue-name: vision}
  annotations: {gpu-admission.io/job-gpus: "16"}
spec:
  containers: [{name: pytorch, image: img, resources: {limits: {nvidia.com/gpu: 8}}}]
"""
)


# --- Subject caches under mutation ------------------------------------------------------------------------


def _fill(s: Subject) -> None:
    """Read every cache, so whatever a mutation edits without declaring it is left stale."""
    _ = s.job, s.gpu_pods
    for p in s.pods:
        _ = p.ask, p.candidates(s.inventory), has_rack_constraint(s, p)


def _assert_fresh(s: Subject, after: str) -> None:
    for p in s.pods:
        where = f"after {after}, {p.template.role or 'pod'}"
        assert p.ask == pod_ask(p.pod), f"{where}: stale ask"
        allowed = node_filter(p.pod)
        assert p.candidates(s.inventory) == [n for n in s.inventory.nodes if allowed(n.labels, n.name)], (
            f"{where}: stale candidates"
        )
        assert has_rack_constraint(s, p) == _rack_constraint(s, p), f"{where}: stale rack constraint"
    assert s.job == _derive_job(s.kind, s.obj, s.name, s.pods, s._obj_keys), f"after {after}: stale job"
    assert s.gpu_pods == [p for p in s.pods if pod_ask(p.pod).asks_gpu or p.keys.gpu_memory is not None], (
        f"after {after}: stale gpu_pods"
    )


def mutate_with_full_caches(obj: Any, policy: Any, inv: inventory_mod.Inventory) -> None:
    """The engine's mutation loop, with every cache filled before each mutation and checked after it."""
    if not isinstance(obj, dict) or effective_kind(obj) not in TEMPLATE_KINDS:
        return
    s = build(copy.deepcopy(obj), policy, inv, ReviewContext())
    for m in MUTATIONS:
        if not policy.mutations.get(m.id, False):
            continue
        _fill(s)
        changed = False
        for p in s.pods:
            changed |= m.fn(s, p)
        if changed:
            s.invalidate(m.touches)
        _assert_fresh(s, m.id)


GOLDEN = [pytest.param(path, id=golden.case_id(path)) for path in golden.case_files()]


@pytest.mark.parametrize("path", GOLDEN)
def test_mutations_declare_what_they_touch_golden(path: Any) -> None:
    case = golden.load_case(path)
    policy = golden.policy_for(case.get("policy"))
    inv = golden.inventory_for(case.get("nodes", golden.DEFAULT_NODES), policy)
    mutate_with_full_caches(case["input"], policy, inv)


@SETTINGS
@given(obj=workloads(), full=st.booleans())
def test_mutations_declare_what_they_touch_generated(obj: dict[str, Any], full: bool) -> None:
    mutate_with_full_caches(wire(obj), FULL if full else POLICY, INVENTORY)


def test_every_mutation_declares_known_parts() -> None:
    for m in MUTATIONS:
        assert m.touches and m.touches <= EVERYTHING, m.id


def test_rack_constraint_is_forgotten_when_node_affinity_pins_a_rack() -> None:
    """training-pool to a pool inside one rack makes the pods' node affinity a rack constraint: the cached
    'no constraint' read before it must not survive."""
    policy = golden.policy_for(
        {"pools": [{"name": "rack-a", "nodeSelector": {RACK: "rack-a"}}], "training": {"pool": "rack-a"}}
    )
    inv = golden.inventory_for(golden.DEFAULT_NODES, policy)
    s = build(copy.deepcopy(PYTORCHJOB), policy, inv, ReviewContext())
    assert [has_rack_constraint(s, p) for p in s.pods] == [False, False]
    training_pool = next(m for m in MUTATIONS if m.id == "training-pool")
    assert all([training_pool.fn(s, p) for p in s.pods])
    s.invalidate(training_pool.touches)
    assert [has_rack_constraint(s, p) for p in s.pods] == [True, True]


# --- what the rules see in the same review ----------------------------------------------------------------


SAME_REVIEW: list[tuple[str, dict[str, Any], Any, bool, list[str], list[str]]] = [
    # (what, object, policy overrides, allowed, denials, mutations)
    ("gpu-slice pins the template to time-sliced L4s: shared-gpu-single sees the pin and denies 2 shares",
     TWO_CONTAINER_JOB, None, False, ["shared-gpu-single"], ["gpu-slice"]),
    ("training-rack adds rack podAffinity to both templates: training-same-rack sees it",
     PYTORCHJOB, None, True, [], ["training-pool", "training-rack"]),
    ("the same job without training-rack: training-same-rack denies (the rule does look)",
     PYTORCHJOB, {"mutations": {"training-rack": False}}, False, ["training-same-rack"], ["training-pool"]),
    ("training-pool pins a pool inside one rack: that is the rack constraint, training-rack adds nothing",
     PYTORCHJOB, {"pools": [{"name": "rack-a", "nodeSelector": {RACK: "rack-a"}}], "training": {"pool": "rack-a"}},
     True, [], ["training-pool"]),
    ("a controller's pod gets training-pool then training-rack: training-same-rack sees the podAffinity",
     TRAINING_POD, None, True, [], ["training-pool", "training-rack"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "overrides", "allowed", "denials", "mutations"),
    [pytest.param(*row[1:], id=row[0]) for row in SAME_REVIEW],
)
def test_rules_see_the_mutations_of_the_same_review(
    obj: dict[str, Any], overrides: Any, allowed: bool, denials: list[str], mutations: list[str]
) -> None:
    policy = golden.policy_for(overrides)
    shared = golden.inventory_for(golden.DEFAULT_NODES, policy)
    # A fresh inventory each time, then one inventory three times: empty, then holding both the selection of
    # the object as given and of the object as mutated.
    for inv in [golden.inventory_for(golden.DEFAULT_NODES, policy) for _ in range(2)] + [shared] * 3:
        r = review(copy.deepcopy(obj), policy=policy, inventory=inv)
        got = (r.allowed, sorted({d.rule for d in r.denials}), list(r.mutations))
        assert got == (allowed, denials, mutations), [d.message for d in r.denials]
    again = review(r.object, policy=policy, inventory=shared)
    assert again.allowed == allowed and not again.mutations
