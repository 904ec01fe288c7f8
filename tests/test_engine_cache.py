"""The engine's caches never change a decision.

- `Inventory.candidates` is cached per inventory on the pod's node selection: a cached answer is only reused
  for an equal selection, on the inventory that computed it.
- `Subject` caches what it derives from the pod specs (ask, candidates, rack constraint, job); after a
  mutation it forgets what that mutation declares it touches (`Mutation.touches`). Checked on every golden
  case and on generated workloads: with every cache filled before each mutation, every cached value after it
  equals a fresh derivation.
- Rules see what the mutations of the same review added.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from policies import inventory as inventory_mod
from policies.engine import ReviewContext, review
from policies.gpulabels import BASE_EXPRESSIONS
from policies.mutations import MUTATIONS, _rack_constraint, has_rack_constraint
from policies.resources import pod_ask
from policies.selectors import node_filter
from policies.subject import EVERYTHING, Subject, _derive_job, build
from policies.workloads import TEMPLATE_KINDS, effective_kind
from tests import test_golden as golden
from tests.test_properties import FULL, INVENTORY, POLICY, SETTINGS, wire, workloads

# What training-pool selects on the example cluster: the GFD base plus its one mixed-strategy MIG node.
WHOLE_CARD_EXPRESSIONS = (
    *BASE_EXPRESSIONS,
    {"key": "nvidia.com/mig.strategy", "operator": "NotIn", "values": ["mixed"]},
)

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
    _ = s.job, s.job_id(), s.gpu_pods, s.training_pods
    for p in s.pods:
        _ = p.ask, p.candidates(s.inventory), has_rack_constraint(s, p)


def _assert_fresh(s: Subject, after: str) -> None:
    for p in s.pods:
        where = f"after {after}, {p.template.role or 'pod'}"
        assert p.ask == pod_ask(p.pod, p.lookup), f"{where}: stale ask"
        allowed = node_filter(p.pod)
        assert list(p.candidates(s.inventory)) == [n for n in s.inventory.nodes if allowed(n.labels, n.name)], (
            f"{where}: stale candidates"
        )
        assert has_rack_constraint(s, p) == _rack_constraint(s, p), f"{where}: stale rack constraint"
    assert s.job == _derive_job(s.kind, s.obj, s.name, s.pods, s._obj_keys), f"after {after}: stale job"
    assert s.gpu_pods == [p for p in s.pods if pod_ask(p.pod, p.lookup).asks_gpu or p.keys.gpu_memory is not None], (
        f"after {after}: stale gpu_pods"
    )
    assert s.training_pods == [p for p in s.gpu_pods if p.workload == "training"], f"after {after}: stale training"
    job = s.job
    ns = s.ctx.namespace or s.namespace
    fresh_id = None if job.key is None or job.value is None else f"{ns}/{job.key}={job.value}"
    assert s.job_id() == fresh_id, f"after {after}: stale job id"


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


# --- Inventory.candidates across reviews -----------------------------------------------------------------

ALL = ["h100-a-1", "h100-a-2", "h100-b-1", "h100-b-2", "a100-mig-1", "l4-ts-1"]


def inventory() -> inventory_mod.Inventory:
    """The example cluster; l4-ts-1 also carries a label whose value YAML would read as a date."""
    nodes = copy.deepcopy(list(golden._node_objects(golden.DEFAULT_NODES)))
    for n in nodes:
        if n["metadata"]["name"] == "l4-ts-1":
            n["metadata"]["labels"]["day"] = "2026-11-30"
    return inventory_mod.build(nodes, golden.policy_for(None))


def pod(spec: Any = None, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    if spec is not None or fields:
        out["spec"] = spec if spec is not None else fields
    return out


def required(*terms: Any) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
        }
    }


def names(nodes: list[inventory_mod.GpuNode]) -> list[str]:
    return [n.name for n in nodes]


# Selections that look alike to a sloppy key (JSON null for NaN, "4" for 4, a date as its ISO string, [] for
# no terms) but allow different nodes.
SELECTIONS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("no spec", pod(), ALL),
    ("spec not a mapping", pod(spec=["x"]), ALL),
    ("empty spec", pod(spec={}), ALL),
    ("nodeName h100-a-1", pod(nodeName="h100-a-1"), ["h100-a-1"]),
    ("nodeName l4-ts-1", pod(nodeName="l4-ts-1"), ["l4-ts-1"]),
    ("nodeName not a string", pod(nodeName=7), ALL),
    ("nodeSelector rack-a", pod(nodeSelector={RACK: "rack-a"}), ["h100-a-1", "h100-a-2"]),
    ("nodeSelector rack-b", pod(nodeSelector={RACK: "rack-b"}), ["h100-b-1", "h100-b-2"]),
    ("nodeSelector absent label: null", pod(nodeSelector={"absent": None}), ALL),
    ("nodeSelector absent label: NaN", pod(nodeSelector={"absent": float("nan")}), []),
    ("nodeSelector replicas '4'", pod(nodeSelector={"nvidia.com/gpu.replicas": "4"}), ["l4-ts-1"]),
    ("nodeSelector replicas 4", pod(nodeSelector={"nvidia.com/gpu.replicas": 4}), []),
    ("nodeSelector a date", pod(nodeSelector={"day": datetime.date(2026, 11, 30)}), []),
    ("nodeSelector the date's string", pod(nodeSelector={"day": "2026-11-30"}), ["l4-ts-1"]),
    ("nodeSelector the rack, in a list", pod(nodeSelector={RACK: ["rack-a"]}), []),
    ("no required terms", pod(spec={"affinity": {"nodeAffinity": {}}}), ALL),
    ("required terms: empty list", pod(spec=required()), []),
    ("whole cards", pod(spec=required({"matchExpressions": [dict(e) for e in WHOLE_CARD_EXPRESSIONS]})),
     ["h100-a-1", "h100-a-2", "h100-b-1", "h100-b-2"]),
    ("time-sliced", pod(spec=required({"matchExpressions": [
        {"key": "nvidia.com/gpu.sharing-strategy", "operator": "In", "values": ["time-slicing"]}]})), ["l4-ts-1"]),
    ("Gt '1' (a string)", pod(spec=required({"matchExpressions": [
        {"key": "nvidia.com/gpu.replicas", "operator": "Gt", "values": ["1"]}]})), ["l4-ts-1"]),
    ("Gt 1 (a number)", pod(spec=required({"matchExpressions": [
        {"key": "nvidia.com/gpu.replicas", "operator": "Gt", "values": [1]}]})), []),
    ("rack-a or rack-b", pod(spec=required(
        {"matchExpressions": [{"key": RACK, "operator": "In", "values": ["rack-a"]}]},
        {"matchExpressions": [{"key": RACK, "operator": "In", "values": ["rack-b"]}]})),
     ["h100-a-1", "h100-a-2", "h100-b-1", "h100-b-2"]),
    ("matchFields hostname", pod(spec=required({"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["a100-mig-1"]}]})), ["a100-mig-1"]),
    ("nodeName and a selector that excludes it", pod(nodeName="l4-ts-1", nodeSelector={RACK: "rack-a"}), []),
    ("tolerations do not narrow", pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), ALL),
]  # fmt: skip


@pytest.mark.parametrize("order", ["forward", "backward", "twice"])
def test_cached_candidates_are_per_selection(order: str) -> None:
    """One inventory answers every selection in turn (so each lookup meets the others' entries) and gives
    what the selection allows, as a fresh inventory does."""
    inv = inventory()
    table = {"forward": SELECTIONS, "backward": SELECTIONS[::-1], "twice": SELECTIONS + SELECTIONS}[order]
    for what, p, want in table:
        assert names(inv.candidates(p)) == want, what
        assert names(inventory().candidates(p)) == want, f"{what} (fresh inventory)"


def test_the_selection_table_tells_look_alikes_apart() -> None:
    """The table above means something only if its look-alike pairs allow different nodes."""
    got = {what: want for what, _, want in SELECTIONS}
    assert got["nodeSelector absent label: null"] != got["nodeSelector absent label: NaN"]
    assert got["nodeSelector replicas '4'"] != got["nodeSelector replicas 4"]
    assert got["no required terms"] != got["required terms: empty list"]
    assert got["Gt '1' (a string)"] != got["Gt 1 (a number)"]
    assert got["nodeSelector a date"] != got["nodeSelector the date's string"]


def test_pods_of_one_job_share_an_entry() -> None:
    inv = inventory()
    spec = required({"matchExpressions": [dict(e) for e in WHOLE_CARD_EXPRESSIONS]})
    first = inv.candidates(pod(spec=copy.deepcopy(spec)))
    assert not hasattr(first, "clear")  # an immutable node set: no caller can edit the cache through it
    second = inv.candidates(pod(spec=copy.deepcopy(spec)))
    assert names(second) == ["h100-a-1", "h100-a-2", "h100-b-1", "h100-b-2"]
    assert len(inv._candidates) == 1


def test_an_entry_keeps_no_list_of_the_pod_it_was_computed_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutation may append to the pod's terms after its candidates were read: the cached entry still
    answers the selection as it was, from the cache (keys look alike for null and NaN, so an entry keeps a
    copy of its selection to compare, not the pod's own lists)."""
    computed: list[Any] = []
    match = inventory_mod.Inventory._match

    def counting(self: inventory_mod.Inventory, selection: Any) -> int:
        computed.append(selection)
        return match(self, selection)

    monkeypatch.setattr(inventory_mod.Inventory, "_match", counting)
    inv = inventory()
    first = pod(spec=required({"matchExpressions": [{"key": RACK, "operator": "In", "values": ["rack-a"]}]}))
    assert names(inv.candidates(first)) == ["h100-a-1", "h100-a-2"]
    terms = first["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"][0]["matchExpressions"].append({"key": RACK, "operator": "In", "values": ["rack-b"]})
    again = pod(spec=required({"matchExpressions": [{"key": RACK, "operator": "In", "values": ["rack-a"]}]}))
    assert names(inv.candidates(again)) == ["h100-a-1", "h100-a-2"]
    assert len(computed) == 1  # answered from the entry
    assert names(inv.candidates(first)) == []  # the edited pod: its own selection now
    assert len(computed) == 2 and len(inv._candidates) == 2


def test_an_inventory_with_other_nodes_has_its_own_cache() -> None:
    policy = golden.policy_for(None)
    nodes = list(golden._node_objects(golden.DEFAULT_NODES))
    everything = inventory_mod.build(copy.deepcopy(nodes), policy)
    no_rack_a = inventory_mod.build(
        [n for n in copy.deepcopy(nodes) if n["metadata"]["name"] not in ("h100-a-1", "h100-a-2")], policy
    )
    anywhere = pod()
    assert names(everything.candidates(anywhere)) == ALL
    assert names(no_rack_a.candidates(anywhere)) == ALL[2:]
    assert names(no_rack_a.candidates(pod(nodeSelector={RACK: "rack-a"}))) == []
    assert names(everything.candidates(pod(nodeSelector={RACK: "rack-a"}))) == ["h100-a-1", "h100-a-2"]
    rebuilt = inventory_mod.build(copy.deepcopy(nodes), policy)
    assert rebuilt._candidates == {} and rebuilt.nodes == everything.nodes


def test_the_cache_is_bounded_and_keeps_recently_used_selections(monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[str] = []
    match = inventory_mod.Inventory._match

    def counting(self: inventory_mod.Inventory, selection: Any) -> int:
        computed.append(selection[0])
        return match(self, selection)

    monkeypatch.setattr(inventory_mod.Inventory, "_match", counting)
    inv = inventory()
    size = inventory_mod.CANDIDATES_CACHE_SIZE
    for i in range(size):
        inv.candidates(pod(nodeName=f"n{i}"))
    inv.candidates(pod(nodeName="n0"))  # used again: now the most recent
    inv.candidates(pod(nodeName="new"))  # evicts the least recently used, n1
    assert len(inv._candidates) == size
    computed.clear()
    inv.candidates(pod(nodeName="n0"))
    assert computed == []
    inv.candidates(pod(nodeName="n1"))
    assert computed == ["n1"]


def test_an_eviction_another_thread_got_to_first_still_answers_the_selection() -> None:
    """Reviews share an inventory across threads: when the least recently used entry is gone by the time
    candidates evicts it (KeyError here), the eviction stops and the selection is still answered."""

    class Raced(dict[bytes, Any]):
        def __delitem__(self, key: bytes) -> None:
            raise KeyError(key)

    inv = inventory()
    object.__setattr__(inv, "_candidates", Raced())
    for i in range(inventory_mod.CANDIDATES_CACHE_SIZE):
        inv.candidates(pod(nodeName=f"n{i}"))
    rack_a = inv.candidates(pod(nodeSelector={RACK: "rack-a"}))
    assert names(rack_a) and {n.rack for n in rack_a} == {"rack-a"}


def test_a_huge_selection_is_answered_but_not_kept() -> None:
    inv = inventory()
    huge = pod(nodeSelector={RACK: "rack-a", "note": "x" * (inventory_mod.CANDIDATES_KEY_LIMIT + 1)})
    assert names(inv.candidates(huge)) == []
    assert inv._candidates == {}


def test_a_selection_of_exactly_the_key_limit_is_kept() -> None:
    """CANDIDATES_KEY_LIMIT bytes of key is kept, one byte more is not (the bound both sides)."""
    from policies.selectors import node_selection

    def sized(extra: int) -> dict[str, Any]:
        return pod(nodeSelector={RACK: "rack-a", "note": "x" * extra})

    base = len(inventory_mod._selection_key(node_selection(sized(0))) or b"")
    at_limit = inventory_mod.CANDIDATES_KEY_LIMIT - base
    assert (
        len(inventory_mod._selection_key(node_selection(sized(at_limit))) or b"") == inventory_mod.CANDIDATES_KEY_LIMIT
    )
    inv = inventory()
    assert names(inv.candidates(sized(at_limit))) == [] and len(inv._candidates) == 1
    assert names(inv.candidates(sized(at_limit + 1))) == [] and len(inv._candidates) == 1


def test_reviews_of_unrelated_objects_in_between_change_nothing() -> None:
    """Every golden input reviewed on one shared inventory, twice around, decides as on a fresh one."""
    policy = golden.policy_for(None)
    shared = golden.inventory_for(golden.DEFAULT_NODES, policy)
    cases = [golden.load_case(p) for p in golden.case_files()]
    cases = [c for c in cases if not c.get("policy") and c.get("nodes", golden.DEFAULT_NODES) == golden.DEFAULT_NODES]
    assert len(cases) > 50

    def decide(case: dict[str, Any], inv: inventory_mod.Inventory) -> tuple[Any, ...]:
        ctx = ReviewContext(namespace_labels=case.get("namespaceLabels"))
        r = review(copy.deepcopy(case["input"]), policy=policy, inventory=inv, ctx=ctx)
        return (r.allowed, r.denials, r.warnings, r.mutations, r.patch, r.results)

    fresh = [decide(c, golden.inventory_for(golden.DEFAULT_NODES, policy)) for c in cases]
    for _ in range(2):
        assert [decide(c, shared) for c in cases] == fresh
    assert shared._candidates


def test_managed_fields_are_shared_never_patched_and_keep_their_place() -> None:
    """engine._copy shares metadata.managedFields with the input instead of copying it: the input must stay
    untouched, the patch must never name it, and the mutated object keeps metadata's key order."""
    from tests.bench import corpus

    pod = corpus.training_pod(from_mutated_template=False)
    assert "managedFields" in pod["metadata"]
    before = copy.deepcopy(pod)
    r = review(pod, policy=POLICY, inventory=INVENTORY)
    assert r.mutations and r.patch  # the fresh pod is mutated: the copy was edited
    assert pod == before
    assert not any(op["path"].startswith("/metadata/managedFields") for op in r.patch)
    assert r.object["metadata"]["managedFields"] == before["metadata"]["managedFields"]
    assert list(r.object["metadata"]) == list(before["metadata"])


SHARED_FIELDS = {
    "env": [{"name": "RANK", "value": "1"}],
    "envFrom": [{"configMapRef": {"name": "c"}}],
    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
    "command": ["torchrun"],
    "args": ["--x"],
    "ports": [{"containerPort": 80}],
    "readinessProbe": {"httpGet": {"port": 80}},
}


def _with_shared_fields(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    spec = pod.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("volumes", [{"name": "v", "emptyDir": {}}])
        for key in ("initContainers", "containers"):
            for c in spec.get(key) if isinstance(spec.get(key), list) else []:
                if isinstance(c, dict):
                    for field, value in SHARED_FIELDS.items():
                        c.setdefault(field, copy.deepcopy(value))
    return pod


POD_CASES = [
    pytest.param(path, id=golden.case_id(path))
    for path in golden.case_files()
    if isinstance(golden.load_case(path).get("input"), dict) and golden.load_case(path)["input"].get("kind") == "Pod"
]


@pytest.mark.parametrize("path", POD_CASES)
def test_no_mutation_reaches_into_the_fields_the_copy_shares(path: Any) -> None:
    """engine._copy shares a Pod's env, volumes, mounts, command, ports and probes with the input (no mutation
    edits them): on every golden Pod, with all of them present, the input stays untouched, the patch names
    none of them and gives the mutated object, and the object keeps every mapping's key order."""
    case = golden.load_case(path)
    pod = _with_shared_fields(case["input"])
    before = copy.deepcopy(pod)
    r, *_ = golden.run_case(case, pod)
    assert pod == before
    shared = (*SHARED_FIELDS, "volumes")
    assert not [op["path"] for op in r.patch if any(f"/{f}" in op["path"] for f in shared)]
    assert jsonpatch.apply_patch(copy.deepcopy(before), copy.deepcopy(list(r.patch))) == r.object
    spec = pod.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
        for c_in, c_out in zip(spec["containers"], r.object["spec"]["containers"], strict=True):
            if isinstance(c_in, dict):
                assert c_out["env"] is c_in["env"] and [k for k in c_out if k in c_in] == list(c_in)
        assert [k for k in r.object["spec"] if k in spec] == list(spec)  # mutations add keys at the end


# --- the engine's plan per policy and enforcement mode --------------------------------------------------


def _verdict(obj: dict[str, Any], policy: Any, labels: dict[str, str] | None = None) -> tuple[Any, ...]:
    r = review(copy.deepcopy(obj), policy=policy, inventory=INVENTORY, ctx=ReviewContext(namespace_labels=labels))
    return (r.allowed, [d.rule for d in r.denials], r.mutations, [(x.rule, x.action, x.outcome) for x in r.results])


def test_the_plan_follows_the_policy_object_not_its_hash() -> None:
    """engine._plan is kept per policy object: a policy with the same hash but other rules or mutations (tests
    build such with dataclasses.replace) gets its own, reviews alternating between them."""
    import dataclasses

    pod = corpus_pod(from_mutated_template=False)
    quiet = dataclasses.replace(
        POLICY,
        mutations={m: False for m in POLICY.mutations},
        rules={**POLICY.rules, "training-same-rack": "off"},
    )
    assert quiet.hash == POLICY.hash
    for _ in range(2):
        loud, hushed = _verdict(pod, POLICY), _verdict(pod, quiet)
        assert loud[2] and not hushed[2]  # the mutations apply only under the policy that has them on
        assert ("training-same-rack", "off", "skip") in hushed[3]
        assert ("training-same-rack", "off", "skip") not in loud[3]


def test_the_plan_follows_the_namespace_mode() -> None:
    """The same policy in another enforcement mode: actions capped by the mode, each review its own."""
    pod = corpus_pod(from_mutated_template=False)
    for _ in range(2):
        enforce = _verdict(pod, POLICY, {"gpu-admission.io/enforcement": "enforce"})
        warn = _verdict(pod, POLICY, {"gpu-admission.io/enforcement": "warn"})
        audit = _verdict(pod, POLICY, {"gpu-admission.io/enforcement": "audit"})
        assert "enforce" in {a for _, a, _ in enforce[3]}
        assert {a for _, a, _ in warn[3]} - {"mutate"} == {"warn"}
        assert {a for _, a, _ in audit[3]} - {"mutate"} == {"audit"}


def test_a_plan_is_worked_out_once_per_policy_and_mode_and_their_number_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """engine._plan keeps one plan per (policy object, mode), reused while the registries are the ones it was
    built from, and holds at most _PLANS_LIMIT plans (a full cache is emptied before the next is kept)."""
    import dataclasses

    from policies import engine

    monkeypatch.setattr(engine, "_PLANS", {})
    other = dataclasses.replace(POLICY)
    first, second = engine._plan(POLICY, "enforce"), engine._plan(other, "enforce")
    assert first.policy is POLICY and second.policy is other and first is not second
    assert engine._plan(POLICY, "enforce") is first and engine._plan(other, "enforce") is second
    assert engine._plan(POLICY, "warn") is not first
    monkeypatch.setattr(engine, "MUTATIONS", engine.MUTATIONS[:1])
    assert engine._plan(POLICY, "enforce") is not first  # a swapped registry gets a plan of its own

    engine._PLANS.clear()
    kept = [dataclasses.replace(POLICY) for _ in range(engine._PLANS_LIMIT + 1)]
    for p in kept[:-1]:
        engine._plan(p, "enforce")
    assert len(engine._PLANS) == engine._PLANS_LIMIT
    engine._plan(kept[-1], "enforce")
    assert len(engine._PLANS) == 1


def test_an_object_with_none_of_our_keys_reads_as_the_shared_none() -> None:
    """userkeys.read's cheap test: metadata without a gpu-admission.io/ key (the webhook's own exception mark
    aside) is not parsed, and reads as the one shared NONE; one key on any of the objects is parsed."""
    from policies import userkeys

    plain = {"metadata": {"labels": {"app": "x"}, "annotations": {userkeys.NATIVE_EXCEPTED: "y", "example.com/k": "z"}}}
    assert userkeys.read(plain, plain) is userkeys.NONE
    assert userkeys.read(plain, {"metadata": {"labels": {userkeys.WORKLOAD: "batch"}}}).workload == "batch"


def test_the_plan_follows_the_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swapping the rule registry (as tests do) is seen by the next review under the same policy."""
    from policies import engine

    pod = corpus_pod()
    rules = engine.RULES
    before = _verdict(pod, POLICY)
    monkeypatch.setattr(engine, "RULES", rules[:1])
    after = _verdict(pod, POLICY)
    assert [x[0] for x in before[3] if x[1] != "mutate"] == [r.id for r in rules]
    assert [x[0] for x in after[3] if x[1] != "mutate"] == [rules[0].id]


def corpus_pod(from_mutated_template: bool = True) -> dict[str, Any]:
    from tests.bench import corpus

    return corpus.training_pod(from_mutated_template=from_mutated_template)
