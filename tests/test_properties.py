"""Property tests of the engine: the patch turns the original into the mutated object, a second pass is a
no-op, fields we do not own survive, and no JSON input makes it raise."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import engine
from policies import inventory as inventory_mod
from policies.document import compile_policy, default_policy, default_policy_text
from policies.engine import Review, ReviewContext, review
from policies.mutations import MUTATIONS
from policies.patch import diff
from policies.rules import RULES
from policies.workloads import ELASTICITY_KINDS, KUBEFLOW_REPLICA_SPECS, TEMPLATE_KINDS, effective_kind
from tests.serverproc import NODES, ROOT

POLICY = default_policy()
INVENTORY = inventory_mod.build(yaml.safe_load(NODES.read_text())["items"], POLICY)
# A policy with every optional mutation switched on, so the properties cover them too.
_doc = yaml.safe_load(default_policy_text())
_doc["gpuNodes"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
_doc["training"].update(schedulerName="volcano", priorityClassName="training", queue={"system": "kueue", "name": "q"})
FULL = compile_policy(_doc)

# Finite floats: JSON has no NaN or Infinity (the API server never sends them, the webhook's orjson refuses
# them). Python's json lets them through wire(), and the engine's orjson working copy turns them into null.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
label_keys = st.sampled_from(
    [
        "app",
        "training.kubeflow.org/job-name",
        "batch.kubernetes.io/job-completion-index",
        "jobset.sigs.k8s.io/jobset-name",
        "gpu-admission.io/workload",
        "gpu-admission.io/job",
        "kueue.x-k8s.io/queue-name",
    ]
)
label_values = st.sampled_from(["training", "inference", "batch", "job-a", "0", "q", "bogus"])
annotation = st.just({"gpu-admission.io/gpu-memory": "10Gi"}) | st.dictionaries(
    st.sampled_from(
        ["gpu-admission.io/gpu-memory", "gpu-admission.io/latency", "gpu-admission.io/job-gpus", "note/x.y~z"]
    ),
    st.sampled_from(["10Gi", "20G", "80Gi", "online", "offline", "16", "ten", ""]),
    max_size=3,
)
resources = st.sampled_from([{"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": 1}]) | st.dictionaries(
    st.sampled_from(
        ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "cpu"]
    ),
    st.sampled_from(["1", "2", "8", 1, 4, "x"]),
    max_size=2,
)


@st.composite
def containers(draw: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": draw(st.sampled_from(["a", "b"])), "image": "img"}
    limits = draw(resources)
    if limits:
        c["resources"] = {"limits": limits}
        if draw(st.booleans()):
            c["resources"]["requests"] = dict(limits)
    if draw(st.booleans()):
        c["x-unknown"] = draw(json_values)
    return c


@st.composite
def pod_specs(draw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(st.lists(containers(), min_size=1, max_size=3))}
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(
            st.dictionaries(
                st.sampled_from(
                    ["topology.kubernetes.io/rack", "nvidia.com/gpu.sharing-strategy", "kubernetes.io/hostname"]
                ),
                st.sampled_from(["rack-a", "time-slicing", "l4-ts-1", "none"]),
                max_size=2,
            )
        )
    if draw(st.booleans()):
        spec["affinity"] = draw(
            st.sampled_from(
                [
                    None,
                    {},
                    {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "rack"}]}},
                    {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                                ]
                            }
                        }
                    },
                ]
            )
        )
    if draw(st.booleans()):
        spec["topologySpreadConstraints"] = [{"maxSkew": 2, "topologyKey": "kubernetes.io/hostname"}]
    if draw(st.booleans()):
        spec["x-future-field"] = draw(json_values)
    return spec


@st.composite
def metadata(draw: Any, name: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "labels": draw(st.dictionaries(label_keys, label_values, max_size=3)),
        "annotations": draw(annotation),
    }
    if name:
        meta["name"] = draw(st.sampled_from(["llama", "web", "job-a"]))
        meta["namespace"] = "ml"
    if draw(st.booleans()):
        meta["ownerReferences"] = [{"kind": draw(st.sampled_from(["ReplicaSet", "Job", "PyTorchJob"])), "name": "o"}]
    return meta


@st.composite
def workloads(draw: Any) -> dict[str, Any]:
    template = {"metadata": draw(metadata(name=False)), "spec": draw(pod_specs())}
    kind = draw(st.sampled_from(["Pod", "Deployment", "Job", "PyTorchJob", "JobSet", "LeaderWorkerSet", "VolcanoJob"]))
    meta = draw(metadata())
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
    if kind == "Deployment":
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": draw(st.integers(1, 4)),
                "selector": {"matchLabels": {"app": "x"}},
                "template": template,
            },
        }
    if kind == "Job":
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {"parallelism": draw(st.integers(1, 4)), "template": template},
        }
    if kind == "PyTorchJob":
        spec: dict[str, Any] = {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template},
                "Worker": {"replicas": draw(st.integers(0, 3)), "template": copy.deepcopy(template)},
            }
        }
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta, "spec": spec}
    if kind == "JobSet":
        return {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": meta,
            "spec": {
                "replicatedJobs": [
                    {"name": "w", "replicas": 2, "template": {"spec": {"parallelism": 2, "template": template}}}
                ]
            },
        }
    if kind == "LeaderWorkerSet":
        return {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": meta,
            "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2, "workerTemplate": template}},
        }
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"minAvailable": 2, "tasks": [{"name": "w", "replicas": 2, "template": template}]},
    }


def wire(obj: Any) -> Any:
    """As the API server sends it: JSON text parsed anew (hypothesis may share one dict in two places)."""
    return json.loads(json.dumps(obj))


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(obj=workloads(), full=st.booleans())
def test_patch_applies_to_the_original_and_yields_the_mutated_object(obj: dict[str, Any], full: bool) -> None:
    obj = wire(obj)
    original = wire(obj)
    r = review(obj, policy=FULL if full else POLICY, inventory=INVENTORY)
    assert obj == original, "the engine must not edit its input"
    patched = jsonpatch.apply_patch(original, list(r.patch))
    assert patched == r.object
    for op in r.patch:
        assert op["op"] in ("add", "remove", "replace")


@SETTINGS
@given(obj=workloads(), full=st.booleans())
def test_second_pass_is_a_no_op(obj: dict[str, Any], full: bool) -> None:
    policy = FULL if full else POLICY
    obj = wire(obj)
    first = review(obj, policy=policy, inventory=INVENTORY)
    second = review(first.object, policy=policy, inventory=INVENTORY)
    assert second.patch == () and second.mutations == ()


@SETTINGS
@given(obj=workloads())
def test_unknown_fields_survive(obj: dict[str, Any]) -> None:
    obj = wire(obj)
    obj["x-top"] = {"a": [1, {"b": None}]}
    obj.setdefault("metadata", {})["x-meta"] = "kept"
    r = review(obj, policy=FULL, inventory=INVENTORY)
    assert r.object["x-top"] == {"a": [1, {"b": None}]} and r.object["metadata"]["x-meta"] == "kept"
    assert not [op for op in r.patch if op["op"] == "remove" and "nvidia.com" not in op["path"]]


@settings(max_examples=500, deadline=None)
@given(obj=json_values, labels=st.none() | st.dictionaries(st.text(max_size=30), st.text(max_size=10), max_size=2))
def test_arbitrary_json_never_raises(obj: Any, labels: dict[str, str] | None) -> None:
    r = review(obj, policy=FULL, inventory=INVENTORY, ctx=ReviewContext(namespace_labels=labels))
    assert isinstance(r.allowed, bool)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["Pod", "Deployment", "PyTorchJob", "HorizontalPodAutoscaler", "ScaledObject", "Job"]),
    body=st.dictionaries(st.sampled_from(["metadata", "spec", "status"]), json_values, max_size=3),
)
def test_known_kinds_with_garbage_bodies_never_raise(kind: str, body: dict[str, Any]) -> None:
    obj = {"apiVersion": "v1", "kind": kind, **body}
    r = review(obj, policy=FULL, inventory=INVENTORY, ctx=ReviewContext(resolve=lambda *_: obj))
    assert not [x for x in r.results if x.outcome == "error"], r.results


@settings(max_examples=300, deadline=None)
@given(a=json_values, b=json_values)
def test_diff_is_a_correct_json_patch(a: Any, b: Any) -> None:
    ops = diff(a, b)
    if ops:
        assert jsonpatch.apply_patch(copy.deepcopy(a), ops) == b
    else:
        assert type(a) is type(b) and a == b


# --- GPU workloads of every handled kind: objects that get past the engine's early exits to the rules ---

gpu_limits = st.sampled_from(
    [
        {"nvidia.com/gpu": 1},
        {"nvidia.com/gpu": "1"},
        {"nvidia.com/gpu": 2},
        {"nvidia.com/gpu": 8},
        {"nvidia.com/gpu": 16},
        {"nvidia.com/mig-1g.10gb": 1},
        {"nvidia.com/mig-3g.40gb": "1"},
        {"nvidia.com/gpu.shared": 1},
        {"nvidia.com/gpu": 4, "cpu": "8"},
    ]
)


@st.composite
def gpu_templates(draw: Any) -> dict[str, Any]:
    """A pod template whose first container asks for a GPU (the others are drawn as before)."""
    spec = draw(pod_specs())
    limits = draw(gpu_limits)
    gpu = {"name": "gpu", "image": "img", "resources": {"limits": dict(limits)}}
    if draw(st.booleans()):
        gpu["resources"]["requests"] = dict(limits)
    spec["containers"] = [gpu, *spec["containers"][1:]]
    meta = draw(metadata(name=False))
    if draw(st.booleans()):
        meta["labels"]["gpu-admission.io/workload"] = draw(st.sampled_from(["training", "inference", "batch"]))
    return {"metadata": meta, "spec": spec}


KUBEFLOW = KUBEFLOW_REPLICA_SPECS
API_VERSIONS = {
    "Pod": "v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "RayJob": "ray.io/v1",
    "RayCluster": "ray.io/v1",
    "VolcanoJob": "batch.volcano.sh/v1alpha1",
    "RayService": "ray.io/v1",
    "InferenceService": "serving.kserve.io/v1beta1",
    "LLMInferenceService": "serving.kserve.io/v1alpha2",
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    "HorizontalPodAutoscaler": "autoscaling/v2",
    "ScaledObject": "keda.sh/v1alpha1",
}
GPU_KINDS = sorted(TEMPLATE_KINDS | ELASTICITY_KINDS)


def wrap(kind: str, meta: dict[str, Any], template: dict[str, Any], n: int) -> dict[str, Any]:
    """`template` placed where `kind` keeps its pod templates, `n` pods (or replicas) of it."""
    api = API_VERSIONS.get(kind, "kubeflow.org/v1" if kind in KUBEFLOW else "apps/v1")
    head: dict[str, Any] = {"apiVersion": api, "kind": "Job" if kind == "VolcanoJob" else kind, "metadata": meta}
    if kind == "Pod":
        return {**head, "spec": template["spec"], "metadata": {**meta, **template["metadata"], "name": meta["name"]}}
    workers = {"groupName": "w", "replicas": n, "template": copy.deepcopy(template)}
    ray = {"headGroupSpec": {"template": template}, "workerGroupSpecs": [workers]}
    # KServe: a bare PodSpec with the template's labels and annotations beside it.
    podspec = {**template["spec"], "labels": template["metadata"]["labels"]}
    podspec["annotations"] = template["metadata"]["annotations"]
    spec: dict[str, Any] = {
        "Job": {"parallelism": n, "template": template},
        "CronJob": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"parallelism": n, "template": template}}},
        "JobSet": {"replicatedJobs": [{"name": "w", "replicas": n, "template": {"spec": {"template": template}}}]},
        "LeaderWorkerSet": {"replicas": 1, "leaderWorkerTemplate": {"size": n, "workerTemplate": template}},
        "RayJob": {"rayClusterSpec": ray},
        "RayCluster": ray,
        "RayService": {"rayClusterConfig": ray},
        "InferenceService": {"predictor": {**podspec, "minReplicas": n}},
        "LLMInferenceService": {"replicas": n, **podspec, "template": template["spec"]},
        "TrainJob": {"runtimeRef": {"name": "runtime"}, "trainer": {"numNodes": n}},  # pods: runtime_of(template)
        "VolcanoJob": {"minAvailable": n, "tasks": [{"name": "w", "replicas": n, "template": template}]},
        "HorizontalPodAutoscaler": {"scaleTargetRef": {"kind": "Deployment", "name": "target"}, "minReplicas": n - 1},
        "ScaledObject": {"scaleTargetRef": {"name": "target"}, "minReplicaCount": n - 1},
    }.get(kind, {"replicas": n, "selector": {"matchLabels": {"app": "x"}}, "template": template})
    if kind in KUBEFLOW:
        master = {"replicas": 1, "template": template}
        spec = {KUBEFLOW[kind]: {"Master": master, "Worker": {"replicas": n, "template": copy.deepcopy(template)}}}
    return {**head, "spec": spec}


@st.composite
def gpu_workloads(draw: Any, kinds: Sequence[str] = GPU_KINDS) -> tuple[dict[str, Any], ReviewContext]:
    """A GPU workload of one of `kinds` (default: every handled kind), and the context it is reviewed in (an
    HPA / ScaledObject gets a GPU Deployment as its target)."""
    kind = draw(st.sampled_from(kinds))
    template = draw(gpu_templates())
    obj = wire(wrap(kind, draw(metadata()), template, draw(st.integers(1, 4))))
    target = wire(wrap("Deployment", {"name": "target", "namespace": "ml"}, template, 2))
    runtime = runtime_of(template)
    return obj, ReviewContext(resolve=lambda kind, *_: runtime if kind == "ClusterTrainingRuntime" else target)


def runtime_of(template: dict[str, Any]) -> dict[str, Any]:
    """A ClusterTrainingRuntime whose trainer job runs `template`."""
    job = {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}}
    job["spec"] = {"template": copy.deepcopy(template)}
    rt = {"apiVersion": API_VERSIONS["TrainJob"], "kind": "ClusterTrainingRuntime", "metadata": {"name": "runtime"}}
    return {**rt, "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": job}]}}}}


RULE_IDS = frozenset(r.id for r in RULES)


def reached_rules(r: Any) -> bool:
    return any(x.rule in RULE_IDS and x.outcome != "skip" for x in r.results)


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_generated_gpu_workloads_reach_the_rules(kind: str) -> None:
    """The generator is worth its examples: every object it draws gets past the engine's early exits and is
    judged by the rules."""
    drawn = 0

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=gpu_workloads(kinds=[kind]), full=st.booleans())
    def run(case: tuple[dict[str, Any], ReviewContext], full: bool) -> None:
        nonlocal drawn
        obj, ctx = case
        original = wire(obj)
        r = review(obj, policy=FULL if full else POLICY, inventory=INVENTORY, ctx=ctx)
        assert obj == original
        assert jsonpatch.apply_patch(original, list(r.patch)) == r.object
        assert not [x for x in r.results if x.outcome == "error"], r.results
        assert effective_kind(obj) == kind
        assert reached_rules(r), r.results  # every object it draws is judged by the rules
        drawn += 1

    run()
    assert drawn >= 20, drawn


def _raising(what: str) -> Callable[..., Any]:
    def fn(s: Any, *pod: Any) -> Any:
        if pod:  # a mutation: edit the pod first, so a half-applied change would show in the object
            pod[0].pod.setdefault("metadata", {})["x-half-applied"] = what
        raise RuntimeError(f"{what} broke")

    return fn


def _with_failure_mode(mode: str) -> Any:
    doc = copy.deepcopy(_doc)
    doc["failureMode"] = mode
    return compile_policy(doc)


FAILURE_MODES = {mode: _with_failure_mode(mode) for mode in ("closed", "open")}


def _for_each_gpu_workload(check: Callable[[dict[str, Any], Review, dict[str, Any]], bool]) -> int:
    """Run `check(original, review, object)` on 200 generated GPU workloads; how many it said were reached."""
    reached = 0

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=gpu_workloads(), mode=st.sampled_from(["closed", "open"]))
    def run(case: tuple[dict[str, Any], ReviewContext], mode: str) -> None:
        nonlocal reached
        obj, ctx = case
        original = wire(obj)
        r = review(obj, policy=FAILURE_MODES[mode], inventory=INVENTORY, ctx=ctx)  # never raises
        assert obj == original, "the engine must not edit its input"
        reached += check(original, r, {"mode": mode})

    run()
    return reached


def test_a_raising_rule_is_an_internal_error_under_the_failure_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "RULES", tuple(dataclasses.replace(r, fn=_raising(r.id)) for r in RULES))

    def check(original: dict[str, Any], r: Review, how: dict[str, Any]) -> bool:
        ran = [x for x in r.results if x.rule in RULE_IDS and x.outcome != "skip"]
        assert ran and all(x.outcome == "error" for x in ran), r.results
        if how["mode"] == "closed":
            assert not r.allowed
            assert [f.rule for f in r.denials] == [x.rule for x in ran]
            for f in r.denials:
                assert f.message == (
                    f"{f.rule}: internal error (RuntimeError); failing closed per policy. "
                    f"Fix: report this object to the platform team"
                )
        else:
            assert r.allowed and not r.denials
            errors = {w.split(":")[0] for w in r.warnings if "internal error (RuntimeError)" in w}
            assert errors == {x.rule for x in ran}
        return True

    assert _for_each_gpu_workload(check) >= 100


def test_a_raising_mutation_never_ships_a_half_applied_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "MUTATIONS", tuple(dataclasses.replace(m, fn=_raising(m.id)) for m in MUTATIONS))

    def check(original: dict[str, Any], r: Review, how: dict[str, Any]) -> bool:
        errors = [x for x in r.results if x.outcome == "error"]
        if r.kind in ELASTICITY_KINDS:  # HPA / ScaledObject: nothing to mutate
            assert not errors and r.patch == ()
            return False
        assert errors and r.mutations == (), r.results
        if how["mode"] == "open":
            assert len(errors) == 1  # the first failure falls back to the original and stops mutating
            assert r.patch == () and r.object == original
            assert any(f"{errors[0].rule}: internal error (RuntimeError)" in w for w in r.warnings)
        else:
            assert not r.allowed
            assert {f.rule for f in r.denials} >= {x.rule for x in errors}
        return True

    assert _for_each_gpu_workload(check) >= 100


def test_mutations_applied_before_one_that_raises_are_reported_not_applied_under_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """failureMode open ships the original object when a mutation raises, so the mutations that had applied
    before it made no change: their results say `skip` (not applied), not `applied`. Under closed the object
    is denied and the review's object keeps their changes: their results stay `applied`."""
    monkeypatch.setattr(
        engine,
        "MUTATIONS",
        tuple(dataclasses.replace(m, fn=_raising(m.id)) if m.id == "job-size" else m for m in MUTATIONS),
    )
    docs = yaml.safe_load_all((ROOT / "examples" / "training" / "indexed-job.yaml").read_text())
    job = next(d for d in docs if d["kind"] == "Job")
    before = ["training-pool", "training-rack", "training-node-pack"]
    r = review(job, policy=FAILURE_MODES["open"], inventory=INVENTORY)
    assert (r.mutations, r.patch, r.object) == ((), (), job)
    assert [f.rule for f in r.denials] == ["training-same-rack"]  # the rules judged the object shipped: unpinned
    outcomes = [(x.rule, x.outcome, x.message) for x in r.results if x.action == "mutate"]
    unchanged = "failed, and failing open ships the object unchanged"
    assert outcomes == [
        *((m, "skip", f"{m}: not applied: job-size {unchanged}") for m in before),
        ("job-size", "error", "job-size: internal error (RuntimeError); allowed (failing open per policy)"),
    ]
    r = review(job, policy=FAILURE_MODES["closed"], inventory=INVENTORY)  # mutating goes on past the error
    applied = [x.rule for x in r.results if x.outcome == "applied"]
    assert not r.allowed and applied == list(r.mutations) and r.mutations[:3] == tuple(before)
    assert ("job-size", "error") in [(x.rule, x.outcome) for x in r.results]
