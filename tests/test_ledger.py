"""The post-launch ledger (issue #18): pod facts, job outcomes, comm ratios against `gpu-admission estimate`'s
model, the best placement at admission, inference spread, and the summary (policies/ledger.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import comm
from policies import inventory as inventory_mod
from policies import ledger as L
from policies.document import default_policy
from policies.resources import pod_ask

RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"
T0 = 1_764_604_800.0  # 2025-12-01T16:00:00Z


def stamp(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str,
    *,
    ns: str = "ml",
    gpus: int = 8,
    node: str = "",
    created: float = T0,
    scheduled: float | None = None,
    labels: dict[str, str] | None = None,
    owner: tuple[str, str] | None = ("Job", "train"),
    resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "creationTimestamp": stamp(created),
        "labels": {"batch.kubernetes.io/job-name": "train"} if labels is None else labels,
    }
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    status: dict[str, Any] = {"phase": "Pending"}
    if scheduled is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(scheduled)}]
    elif not node:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {resource: str(gpus)}}}]},
        "status": status,
    }


def topo(
    racks: dict[str, int], gpus: int = 8, zone: str | None = "z1", shared: frozenset[str] = frozenset()
) -> L.Topology:
    nodes = {}
    for rack, n in racks.items():
        for i in range(1, n + 1):
            name = f"{rack}-{i}"
            labels = {RACK: rack, **({ZONE: zone} if zone else {})}
            nodes[name] = L.NodeFact(labels, gpus, name in shared)
    levels = ((RACK, "switch"), (ZONE, "zone")) if zone else ((RACK, "switch"),)
    return L.Topology(levels, nodes)


def facts(*pods: dict[str, Any]) -> list[L.PodFact]:
    out = [L.pod_fact(p) for p in pods]
    assert all(f is not None for f in out)
    return [f for f in out if f is not None]


# -- pod facts ----------------------------------------------------------------------------------------------


def test_pod_fact_reads_job_node_times_and_owner() -> None:
    f = L.pod_fact(pod("train-0", node="a-1", created=T0, scheduled=T0 + 7))
    assert f is not None
    assert (f.group, f.workload, f.unowned, f.gpus, f.node) == (
        "ml/batch.kubernetes.io/job-name=train",
        "batch",
        False,
        8,
        "a-1",
    )
    assert (f.created, f.scheduled) == (T0, T0 + 7)


def test_pod_fact_of_a_deployment_replica_names_the_deployment() -> None:
    p = pod("web-7d4-x", labels={"pod-template-hash": "7d4"}, owner=("ReplicaSet", "web-7d4"), gpus=1)
    f = L.pod_fact(p)
    assert f is not None and (f.group, f.workload) == ("ml/Deployment/web", "inference")


@pytest.mark.parametrize(
    ("labels", "owner", "group"),
    [
        ({"leaderworkerset.sigs.k8s.io/name": "llm"}, ("StatefulSet", "llm-0"), "ml/LeaderWorkerSet/llm"),
        ({"leaderworkerset.sigs.k8s.io/name": ""}, ("StatefulSet", "llm-0"), "ml/StatefulSet/llm-0"),
        ({}, ("StatefulSet", "db"), "ml/StatefulSet/db"),
        ({"pod-template-hash": "h1"}, ("StatefulSet", "s-h1"), "ml/StatefulSet/s-h1"),  # a hash, not a ReplicaSet
        ({"pod-template-hash": "h1"}, ("ReplicaSet", "web-h2"), "ml/ReplicaSet/web-h2"),  # not its hash
        ({"pod-template-hash": ""}, ("ReplicaSet", "web-"), "ml/ReplicaSet/web-"),
        ({}, ("ReplicaSet", "web-h1"), "ml/ReplicaSet/web-h1"),  # no hash label: the ReplicaSet itself
        ({"pod-template-hash": "h1"}, ("ReplicaSet", "web-h1"), "ml/Deployment/web"),
    ],
)
def test_an_inference_pod_belongs_to_its_workload(labels: dict[str, str], owner: tuple[str, str], group: str) -> None:
    p = pod("x-0", labels={"gpu-admission.io/workload": "inference", **labels}, owner=owner, gpus=1)
    f = L.pod_fact(p)
    assert f is not None and (f.group, f.workload, f.unowned) == (group, "inference", False)


def test_bare_pod_without_owner_is_its_own_unowned_job() -> None:
    f = L.pod_fact(pod("lonely", labels={}, owner=None))
    assert f is not None and (f.group, f.unowned, f.workload) == ("ml/pod=lonely", True, "unclassified")


def test_pod_without_gpus_is_none_and_garbage_raises() -> None:
    no_gpu = pod("cpu")
    no_gpu["spec"]["containers"][0]["resources"] = {}
    assert L.pod_fact(no_gpu) is None
    gpu = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    for garbage, message in (
        ("x", "pod is not an object"),
        ({"metadata": 1, "spec": {}}, "pod metadata, spec or status is not an object"),
        ({"metadata": {"name": "a"}, "spec": {}, "status": "x"}, "pod metadata, spec or status is not an object"),
        ({"metadata": {"namespace": "ml"}, "spec": gpu}, "pod has no name"),
        ({"metadata": {"name": "a"}, "spec": {"nodeName": 3, **gpu}}, "pod nodeName is not a string"),
    ):
        with pytest.raises(ValueError, match=f"^{message}$"):
            L.pod_fact(garbage)


def test_the_note_keeps_what_the_fact_needs_beside_the_view_entry() -> None:
    """The server's tracker reads a pod as the pod view's entry (key, GPUs, node) and the ledger's note: the
    fact is the one made from the whole pod."""
    shared = pod("s-0", node="a-1", created=T0, scheduled=T0 + 3, resource="nvidia.com/gpu.shared", gpus=2)
    for p in (pod("train-0", node="a-1", created=T0, scheduled=T0 + 7), pod("lonely", labels={}, owner=None), shared):
        note = L.pod_note(p)
        units = {r: n for r, n in pod_ask(p).units().items() if n}
        key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        assert L.fact_of(key, units, p["spec"]["nodeName"], note) == L.pod_fact(p)
    assert L.pod_note(pod("train-0", node="a-1", created=T0, scheduled=T0 + 7)) == L.Note(
        "ml/batch.kubernetes.io/job-name=train", "batch", T0, T0 + 7
    )
    assert L.pod_note(pod("lonely", labels={}, owner=None)).group is None
    owned = pod("train-1")
    owned["metadata"]["uid"] = "pod-uid"
    owned["metadata"]["ownerReferences"][0]["uid"] = "job-uid"
    bare = pod("lonely", labels={}, owner=None)
    bare["metadata"]["uid"] = "pod-uid"
    assert (L.pod_note(owned).job_uid, L.pod_note(bare).job_uid, L.pod_note(pod("x")).job_uid) == (
        "job-uid",  # the controller's, not the pod's own
        "pod-uid",  # a bare pod is its own job
        None,  # no uid given
    )
    other = pod("train-2", created=T0 + 1)
    other["metadata"]["ownerReferences"][0]["uid"] = "".join(["job-", "uid"])  # an equal string, another object
    assert L.pod_note(other).job_uid is L.pod_note(owned).job_uid  # one string per job, however many pods
    assert L.pod_fact(owned) is not None and L.pod_fact(owned).job_uid == "job-uid"  # type: ignore[union-attr]
    f = L.fact_of("ml/s-0", {"nvidia.com/gpu.shared": 2}, "a-1", L.pod_note(shared))
    assert (f.gpus, f.shared, f.namespace, f.name) == (0, True, "ml", "s-0")
    unbound = L.fact_of("ml/x", {"nvidia.com/gpu": 1}, "", L.Note("g", "batch", T0, T0 + 1))
    assert unbound.scheduled is None  # a PodScheduled time counts only for a bound pod
    for garbage in ({"metadata": {"name": "a"}, "spec": []}, {"metadata": {}, "spec": {}}, {"metadata": []}):
        with pytest.raises(ValueError):
            L.pod_note(garbage)


def test_admitted_group_matches_the_pods_group() -> None:
    f = L.pod_fact(pod("train-0"))
    assert f is not None
    assert L.admitted_group("Job", "ml", "train", {}) == f.group
    assert L.admitted_group("Deployment", "ml", "web", {}) == "ml/Deployment/web"
    labelled = {"kind": "Pod", "metadata": {"labels": {"batch.kubernetes.io/job-name": "train"}}}
    assert L.admitted_group("Pod", "ml", "", labelled) == f.group
    assert L.admitted_group("Pod", "ml", "x", {}) is None
    empty = pod("e-0", labels={"job-name": ""})  # an empty value is a value: the pod's note files it under it
    assert L.admitted_group("Pod", "ml", "e-0", {"kind": "Pod", **empty}) == L.pod_note(empty).group == "ml/job-name="


CASES = Path(__file__).parent / "cases"


def _pods_of(review_object: dict[str, Any], group: int, ns: str) -> list[dict[str, Any]]:
    """The pods KubeRay would create from worker group `group` of a (mutated) RayJob: its template's labels."""
    tpl = review_object["spec"]["rayClusterSpec"]["workerGroupSpecs"][group]["template"]
    meta = {**tpl["metadata"], "namespace": ns}
    return [
        {**tpl, "metadata": {**meta, "name": f"w{group}-{i}"}, "status": {}, "spec": {**tpl["spec"], "nodeName": ""}}
        for i in range(2)
    ]


def test_admitted_group_of_a_job_whose_template_names_it_is_its_pods_group() -> None:
    """The engine takes an own-label job's value from its templates (subject.job_identity); the group the
    ledger files its admission under must be the one its pods carry, or its row never finds them."""
    from policies import engine

    case = yaml.safe_load((CASES / "kinds" / "rayjob-template-names-its-own-job.yaml").read_text())
    obj = case["input"]
    nodes = yaml.safe_load((Path(__file__).parent.parent / "examples" / "cluster" / "nodes.yaml").read_text())
    inv = inventory_mod.build_cluster(nodes["items"], default_policy())
    review = engine.review(obj, policy=default_policy(), inventory=inv)
    pods = _pods_of(review.object, 0, "rl")
    assert {L.pod_note(p).group for p in pods} == {"rl/gpu-admission.io/job=ppo-atari-run-7"}
    assert L.admitted_group("RayJob", "rl", "ppo-atari", obj) == "rl/gpu-admission.io/job=ppo-atari-run-7"
    # Without a value on the templates: the object's name, which the webhook puts on them.
    del obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"]["gpu-admission.io/job"]
    review = engine.review(obj, policy=default_policy(), inventory=inv)
    assert {L.pod_note(p).group for p in _pods_of(review.object, 0, "rl")} == {"rl/gpu-admission.io/job=ppo-atari"}
    assert L.admitted_group("RayJob", "rl", "ppo-atari", obj) == "rl/gpu-admission.io/job=ppo-atari"


@pytest.mark.parametrize("case", ["rayjob-templates-name-two-jobs", "rayjob-template-empty-job-label"])
def test_admitted_group_of_a_job_without_identity_is_none(case: str) -> None:
    """Templates naming two jobs, or an empty value: no job identity (training-same-rack denies); under a
    warn or audit policy the object is admitted, and its pods are no one group."""
    obj = yaml.safe_load((CASES / "kinds" / f"{case}.yaml").read_text())["input"]
    assert L.admitted_group("RayJob", "rl", "ppo-atari", obj) is None


def test_admitted_group_of_a_volcano_job_is_its_pods_group() -> None:
    """The audit record's kind of a Volcano Job is `Job`: it is told apart by its API group, as the engine
    does, since its pods carry volcano.sh/job-name (before: batch.kubernetes.io/job-name, no pod's group)."""
    obj = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "vj"}}
    p = pod("vj-w-0", labels={"volcano.sh/job-name": "vj"}, owner=("Job", "vj"))
    assert L.admitted_group("Job", "ml", "vj", obj) == L.pod_note(p).group == "ml/volcano.sh/job-name=vj"


# -- the comm model of one placement ------------------------------------------------------------------------


@pytest.mark.parametrize("per_node_gpus", [1, 2, 4, 8])
def test_spread_ms_of_the_estimators_own_placements_is_the_estimators_time(per_node_gpus: int) -> None:
    for total in range(2, 70):
        e = comm.placement_estimate(comm.DEFAULT_MESSAGE_BYTES, total, per_node_gpus)
        nodes = e.nodes
        split = tuple(total // nodes + (1 if i < total % nodes else 0) for i in range(nodes))
        assert comm.spread_ms(e.size_bytes, split, False) == pytest.approx(e.intra_rack_ms, rel=1e-12)
        assert comm.spread_ms(e.size_bytes, split, True) == pytest.approx(e.cross_rack_ms, rel=1e-12)
        if e.intra_node_ms is not None:
            assert comm.spread_ms(e.size_bytes, (total,), False) == pytest.approx(e.intra_node_ms, rel=1e-12)


def test_spread_ms_refuses_an_empty_or_zero_placement() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        comm.spread_ms(16, (), False)
    with pytest.raises(ValueError, match="GPUs on a node must be a whole number ≥ 1, got 0"):
        comm.spread_ms(16, (8, 0), False)


# -- outcomes -----------------------------------------------------------------------------------------------


def test_one_rack_job_is_one_domain_with_pending_from_first_create_to_last_bound() -> None:
    t = topo({"a": 2, "b": 2})
    pods = facts(
        pod("train-0", node="a-1", created=T0, scheduled=T0 + 3),
        pod("train-1", node="a-2", created=T0 + 1, scheduled=T0 + 9),
    )
    best = L.best_placement([8, 8], {n: 8 for n in t.nodes}, t, L.Comm())
    row = L.job_row(pods[0].group, pods, t, now=T0 + 100, best=best)
    assert (row.outcome, row.pending_s, row.first_bound, row.last_bound) == ("one-domain", 9.0, T0 + 3, T0 + 9)
    assert row.spans == ((RACK, 1), (ZONE, 1))
    assert (row.placement, row.best, row.comm_ratio) == ("intra-rack", "intra-rack", 1.0)


def test_job_across_racks_spans_and_costs_the_estimators_cross_rack_ratio() -> None:
    t = topo({"a": 2, "b": 2})
    pods = facts(pod("train-0", node="a-1", scheduled=T0 + 1), pod("train-1", node="b-1", scheduled=T0 + 2))
    best = L.best_placement([8, 8], {n: 8 for n in t.nodes}, t, L.Comm())
    row = L.job_row(pods[0].group, pods, t, now=T0 + 10, best=best)
    estimate = comm.placement_estimate(comm.DEFAULT_MESSAGE_BYTES, 16, 8)
    assert (row.outcome, row.spans, row.placement) == ("spanning", ((RACK, 2), (ZONE, 1)), "cross-rack")
    assert row.comm_ratio == pytest.approx(estimate.cross_rack_ratio, rel=1e-12)
    assert row.comm_ratio == pytest.approx(1.125, rel=1e-12)


def test_spanning_is_the_best_when_no_rack_had_room_then_ratio_is_one() -> None:
    t = topo({"a": 2, "b": 2})
    free = {"a-1": 8, "a-2": 0, "b-1": 8, "b-2": 0}
    best = L.best_placement([8, 8], free, t, L.Comm())
    assert best is not None and (best.placement, best.per_node) == ("cross-rack", (8, 8))
    pods = facts(pod("train-0", node="a-1", scheduled=T0), pod("train-1", node="b-1", scheduled=T0))
    assert L.job_row(pods[0].group, pods, t, now=T0, best=best).comm_ratio == 1.0


def test_best_is_one_node_when_one_node_holds_the_job_and_none_when_nothing_does() -> None:
    t = topo({"a": 2})
    best = L.best_placement([4, 4], {"a-1": 8, "a-2": 8}, t, L.Comm())
    assert best is not None and (best.placement, best.per_node) == ("intra-node", (8,))
    assert L.best_placement([8, 8, 8], {"a-1": 8, "a-2": 8}, t, L.Comm()) is None
    assert L.best_placement([0], {"a-1": 8}, t, L.Comm()) is None


def test_partly_bound_never_bound_and_denied() -> None:
    t = topo({"a": 2})
    half = facts(pod("train-0", node="a-1", scheduled=T0 + 2), pod("train-1", created=T0 + 1))
    row = L.job_row(half[0].group, half, t, now=T0 + 30)
    assert (row.outcome, row.bound, row.pods, row.pending_s, row.comm_ratio) == ("partly-bound", 1, 2, 30.0, None)
    none = facts(pod("train-0"), pod("train-1"))
    assert L.job_row(none[0].group, none, t, now=T0 + 5).outcome == "never-bound"
    gone = facts(pod("train-0", node="a-1", scheduled=T0 + 1))
    assert L.job_row(gone[0].group, gone, t, now=T0 + 5, deleted=1).outcome == "partly-bound"
    denial = L.Admission("uid-1", T0, "deny", ("training-same-rack",))
    row = L.job_row("ml/batch.kubernetes.io/job-name=x", (), t, now=T0, admission=denial)
    assert (row.outcome, row.uid, row.rules, row.namespace) == ("denied", "uid-1", ("training-same-rack",), "ml")
    allowed = L.Admission("uid-2", T0, "allow")
    assert L.job_row("ml/j=x", (), t, now=T0, admission=allowed).outcome == "never-bound"


def test_unknown_topology_when_a_node_lacks_the_label_or_is_unknown() -> None:
    t = topo({"a": 1})
    t.nodes["bare"] = L.NodeFact({}, 8, False)  # type: ignore[index]
    for other in ("bare", "no-such-node"):
        pods = facts(pod("train-0", node="a-1", scheduled=T0), pod("train-1", node=other, scheduled=T0))
        row = L.job_row(pods[0].group, pods, t, now=T0)
        assert (row.outcome, row.placement, row.actual_ms) == ("unknown-topology", None, None)
        assert dict(row.spans)[RACK] is None
    one = facts(pod("train-0", node="no-such-node", scheduled=T0))
    assert L.job_row(one[0].group, one, t, now=T0).outcome == "one-domain"  # one node is one of everything


# -- inference ----------------------------------------------------------------------------------------------


def test_inference_spread_per_node_and_zone_and_shared_landing() -> None:
    t = L.Topology(
        ((RACK, "switch"), (ZONE, "zone")),
        {
            "n1": L.NodeFact({ZONE: "z1"}, 8, False),
            "n2": L.NodeFact({ZONE: "z2"}, 8, True),
            "n3": L.NodeFact({}, 8, False),
        },
    )
    rs = {"labels": {"pod-template-hash": "h"}, "owner": ("ReplicaSet", "web-h"), "gpus": 1}
    pods = facts(
        pod("w1", node="n1", scheduled=T0, **rs),  # type: ignore[arg-type]
        pod("w2", node="n2", scheduled=T0, **rs),  # type: ignore[arg-type]
        pod("w3", node="n3", scheduled=T0, **rs),  # type: ignore[arg-type]
        pod("w4", node="n1", scheduled=T0, resource="nvidia.com/mig-1g.10gb", **rs),  # type: ignore[arg-type]
        pod("w5", **rs),  # type: ignore[arg-type]
    )
    row = L.inference_row("ml/Deployment/web", pods, t)
    assert (row.replicas, row.bound, row.shared) == (5, 4, 2)
    assert row.per_node == (("n1", 2), ("n2", 1), ("n3", 1))
    assert row.per_zone == (("?", 1), ("z1", 2), ("z2", 1))


# -- best placement from a profile --------------------------------------------------------------------------


def test_free_profile_gives_the_same_best_as_the_whole_cluster() -> None:
    rng = random.Random(7)
    for _ in range(200):
        racks = {f"r{i}": rng.randint(1, 30) for i in range(rng.randint(1, 40))}
        t = topo(racks)
        free = {n: rng.choice((0, 0, 1, 2, 4, 8)) for n in t.nodes}
        pods = [rng.choice((1, 2, 4, 8))] * rng.randint(1, 12)
        whole = L.best_placement(pods, free, t, L.Comm())
        cut = L.best_placement(pods, L.free_profile(free, t), t, L.Comm())
        assert (whole and (whole.placement, whole.ms)) == (cut and (cut.placement, cut.ms))


# -- summary ------------------------------------------------------------------------------------------------


def test_summary_success_rate_partial_gpus_and_ratios() -> None:
    t = topo({"a": 2, "b": 2})
    free = {n: 8 for n in t.nodes}

    def job(name: str, *placed: tuple[str, float]) -> L.JobRow:
        pods = facts(
            *(
                pod(f"{name}-{i}", labels={"job-name": name}, node=n, scheduled=T0 + s if n else None)
                for i, (n, s) in enumerate(placed)
            )
        )
        best = L.best_placement([p.gpus for p in pods], free, t, L.Comm())
        return L.job_row(pods[0].group, pods, t, now=T0 + 1000, best=best)

    rows = [
        job("fast", ("a-1", 5), ("a-2", 5)),
        job("slow", ("a-1", 700), ("a-2", 700)),
        job("split", ("a-1", 1), ("b-1", 1)),
        job("half", ("a-1", 1), ("", 0)),
        L.job_row("ml/job-name=no", (), t, now=T0, admission=L.Admission("u", T0, "deny")),
    ]
    s = L.summarize(rows, within_s=600)
    assert (s.jobs, s.admitted, s.succeeded, s.success_rate) == (5, 4, 2, 0.5)
    assert (s.partial_gangs, s.partial_gpus) == (1, 8)
    assert dict(s.outcomes) == {
        "one-domain": 2,
        "spanning": 1,
        "unknown-topology": 0,
        "partly-bound": 1,
        "never-bound": 0,
        "denied": 1,
    }
    assert s.comm_ratio_max == pytest.approx(1.125)
    assert s.comm_ratio_mean == pytest.approx((1 + 1 + 1.125) / 3)
    assert (s.pending_p50_s, s.pending_max_s) == (5.0, 700.0)


# -- a whole ledger from dumps (what `gpu-admission placement` reads) ---------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _objects(name: str) -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((ROOT / "examples" / "placement" / name).read_text())
    return [o for d in docs if d for o in (d.get("items") or [d])]


def test_build_from_the_example_dumps() -> None:
    """examples/placement/: the same rows `placement` prints (tests/test_placement_cli.py), built in process."""
    nodes = [o for o in _objects("racks.yaml") if o.get("kind") == "Node"]
    inv = inventory_mod.build(nodes, default_policy())
    topo = L.topology_of(inv)
    assert topo is L.topology_of(inv)  # once per inventory version
    denied_at = L.parse_time("2026-12-01T10:02:30Z") or 0.0
    deny = L.Admission("uid-d", denied_at, "deny", ("training-same-rack",), "training")
    admissions = {"research/batch.kubernetes.io/job-name=train-d": deny}
    pods = _objects("ledger-pods.yaml")
    ledger = L.build([*pods, "garbage"], topo, admissions, now=L.parse_time("2026-12-01T10:05:00Z") or 0.0)
    assert ledger.skipped == 1
    jobs = {r.group.rsplit("=", 1)[-1]: r for r in ledger.jobs}
    a, b, c, d = (jobs[f"train-{x}"] for x in "abcd")
    assert (a.outcome, a.pending_s, a.placement, a.best, a.comm_ratio) == ("one-domain", 3.0, "intra-rack",
                                                                           "intra-rack", 1.0)  # fmt: skip
    estimate = comm.placement_estimate(comm.DEFAULT_MESSAGE_BYTES, 16, 8)
    assert (b.outcome, b.placement, b.best) == ("spanning", "cross-rack", "intra-rack")
    assert b.comm_ratio == pytest.approx(estimate.cross_rack_ratio, rel=1e-12)
    assert (c.outcome, c.bound, c.pods, c.pending_s, c.best) == ("partly-bound", 1, 2, 180.0, "cross-rack")
    assert (d.outcome, d.uid, d.rules, d.pending_s, d.pods) == ("denied", "uid-d", ("training-same-rack",), None, 0)
    at = L.parse_time("2026-12-01T10:02:10Z") or 0.0  # the notebook: created 10:02:10, bound a second later
    rack_zone = ((RACK, 1), (ZONE, 1))
    assert jobs["notebook"] == L.JobRow(
        group="alice/pod=notebook", namespace="alice", workload="unclassified", unowned=True, pods=1, bound=1,
        deleted=0, gpus=1, outcome="one-domain", admitted=None, created=at, first_bound=at + 1, last_bound=at + 1,
        pending_s=1.0, spans=rack_zone, nodes=(("h100-big-4", 1),), placement="intra-node", actual_ms=0.0,
        best="intra-node", best_ms=0.0, comm_ratio=1.0, uid=None, rules=(),
        job_uid="7a1e0c55-0000-4000-8000-000000000004")  # fmt: skip
    assert d == L.JobRow(
        group="research/batch.kubernetes.io/job-name=train-d", namespace="research", workload="training",
        unowned=False, pods=0, bound=0, deleted=0, gpus=0, outcome="denied", admitted=denied_at, created=denied_at,
        first_bound=None, last_bound=None, pending_s=None, spans=(), nodes=(), placement=None, actual_ms=None,
        best=None, best_ms=None, comm_ratio=None, uid="uid-d", rules=("training-same-rack",))  # fmt: skip
    assert (a.gpus, a.created, a.first_bound, a.last_bound, a.best_ms, a.actual_ms) == (
        16, at - 130, at - 128, at - 127, b.best_ms, b.best_ms)  # fmt: skip
    summary = L.summarize(ledger.jobs, 600.0)
    assert summary == L.Summary(
        jobs=5, admitted=4, outcomes=(("one-domain", 2), ("spanning", 1), ("unknown-topology", 0),
        ("partly-bound", 1), ("never-bound", 0), ("denied", 1)), success_within_s=600.0, succeeded=3,
        success_rate=0.75, partial_gangs=1, partial_gpus=8, pending_p50_s=3.0, pending_max_s=4.0,
        comm_ratio_mean=pytest.approx((1.0 + b.comm_ratio + 1.0) / 3), comm_ratio_max=b.comm_ratio, unowned=1,
        unknown_topology=0)  # fmt: skip
    order = [r.group.rsplit("=", 1)[-1] for r in ledger.jobs]  # by first pod's creation (the denied: admission)
    assert order == ["train-a", "train-b", "train-c", "notebook", "train-d"]
    [chat] = ledger.inference
    assert (chat.group, chat.per_node, chat.per_zone, chat.shared) == (
        "serving/Deployment/chat", (("h100-big-4", 2),), (("zone-1", 2),), 0)  # fmt: skip


def test_free_of_counts_whole_gpus_of_unshared_nodes() -> None:
    t = L.Topology(
        (("rack", "switch"),),
        {
            "a": L.NodeFact({"rack": "r1"}, 8, False),
            "b": L.NodeFact({"rack": "r1"}, 8, True),  # shared: never in a best placement
            "c": L.NodeFact({"rack": "r2"}, 0, False),
            "d": L.NodeFact({"rack": "r2"}, 4, False),
        },
    )
    assert L.free_of(t, {"a": 3, "d": 4, "elsewhere": 8}) == {"a": 5, "d": 0}


def test_merge_admission_keeps_the_first_allow_until_a_denial() -> None:
    allow1 = L.Admission("u1", T0, "allow", ())
    warn = L.Admission("u2", T0 + 1, "warn", ("r",))
    deny = L.Admission("u3", T0 + 2, "deny", ("r",))
    deny2 = L.Admission("u4", T0 + 3, "deny", ("s",))
    assert L.merge_admission(None, warn) is warn
    assert L.merge_admission(allow1, warn) is allow1
    assert L.merge_admission(allow1, deny) is deny
    assert L.merge_admission(deny, deny2) is deny2
    assert L.merge_admission(deny, warn) is warn
    assert L.merge_admission(deny, allow1) is allow1


# -- edges the mutation run found untested ------------------------------------------------------------------


def test_parse_time_reads_offsets_and_refuses_non_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert L.parse_time("2026-12-01T12:00:00+02:00") == L.parse_time("2026-12-01T10:00:00Z")
    for value in (5, None, "", "yesterday", ["2026-12-01T10:00:00Z"]):
        assert L.parse_time(value) is None
    import time as time_mod

    monkeypatch.setenv("TZ", "Asia/Tokyo")  # a time without offset is UTC, whatever the machine's zone
    time_mod.tzset()
    try:
        assert L.parse_time("2026-12-01T10:00:00") == L.parse_time("2026-12-01T10:00:00Z")
    finally:
        monkeypatch.undo()
        time_mod.tzset()


@pytest.mark.parametrize(
    "owners",
    [
        [{"kind": "", "name": "x", "controller": True}],
        [{"kind": 5, "name": "x", "controller": True}],
        [{"kind": "Job", "controller": True}],
        [{"kind": "Job", "name": "x", "controller": "true"}],
        ["junk"],
    ],
)
def test_a_pod_without_a_readable_controller_is_unowned(owners: list[Any]) -> None:
    p = pod("lonely", labels={})
    p["metadata"]["ownerReferences"] = owners
    f = L.pod_fact(p)
    assert f is not None and (f.group, f.unowned) == ("ml/pod=lonely", True)


def test_a_pod_without_job_label_belongs_to_its_controller_and_a_workload_label_wins() -> None:
    p = pod("x-1", labels={}, owner=("Job", "nightly"))
    p["metadata"]["ownerReferences"].insert(0, "junk")
    f = L.pod_fact(p)
    assert f is not None and (f.group, f.unowned) == ("ml/Job/nightly", False)
    rs = {"pod-template-hash": "h1"}
    f = L.pod_fact(pod("web-h1-a", labels={"gpu-admission.io/workload": "batch", **rs}, owner=("ReplicaSet", "web-h1")))
    assert f is not None and (f.workload, f.group) == ("batch", "ml/ReplicaSet/web-h1")
    f = L.pod_fact(pod("web-h1-a", labels={"gpu-admission.io/workload": "bogus", **rs}, owner=("ReplicaSet", "web-h1")))
    assert f is not None and (f.workload, f.group) == ("inference", "ml/Deployment/web")


def test_the_scheduled_time_is_the_pod_scheduled_condition_of_a_bound_pod() -> None:
    p = pod("a", node="a-1", created=T0, scheduled=T0 + 5)
    p["status"]["conditions"] = [
        "junk",
        {"type": "Ready", "status": "True", "lastTransitionTime": stamp(T0 + 60)},
        {"type": "PodScheduled", "status": "False", "lastTransitionTime": stamp(T0 + 1)},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(T0 + 5)},
    ]
    assert L.pod_note(p).scheduled == T0 + 5
    p["spec"]["nodeName"] = ""
    assert L.pod_note(p).scheduled is None  # not bound: no PodScheduled time kept


def test_admitted_group_of_an_object_without_name_is_none() -> None:
    assert L.admitted_group("Deployment", "ml", "", {}) is None
    assert L.admitted_group("Job", "ml", "", {}) is None
    assert L.admitted_group("Job", "ml", "t", {}) == "ml/batch.kubernetes.io/job-name=t"


def _fact(node: str, gpus: int = 8, created: float | None = T0, scheduled: float | None = T0, **kw: Any) -> L.PodFact:
    base = dict(namespace="ml", name=f"p-{node}-{gpus}", group="ml/job", workload="training", unowned=False,
                gpus=gpus, shared=False, node=node, created=created, scheduled=scheduled if node else None)  # fmt: skip
    return L.PodFact(**{**base, **kw})  # type: ignore[arg-type]


def test_job_row_edges() -> None:
    t = topo({"r1": 2, "r2": 1})
    admission = L.Admission("u", T0 - 9, "allow", ())
    row = L.job_row("ml/job", [_fact("r1-1", created=None)], t, now=T0 + 100, admission=admission)
    assert (row.created, row.admitted, row.pending_s) == (T0 - 9, T0 - 9, 9.0)  # no creation time: the admission's
    row = L.job_row("ml/job", [_fact("r1-1", created=T0 + 1)], t, now=T0 + 100, admission=admission)
    assert (row.created, row.pending_s) == (T0 + 1, 0.0)  # bound "before" it was created (clock skew): 0
    row = L.job_row("ml/job", [_fact("ghost")], t, now=T0)  # one node the inventory does not know
    one_node = comm.spread_ms(comm.DEFAULT_MESSAGE_BYTES, (8,), False, comm.DEFAULT_BANDWIDTHS)
    assert (row.outcome, row.placement, row.actual_ms) == ("one-domain", "intra-node", one_node)
    mig = L.job_row("ml/job", [_fact("r1-1", gpus=0, shared=True), _fact("r1-2", gpus=0, shared=True)], t, now=T0)
    assert (mig.outcome, mig.placement, mig.actual_ms, mig.gpus) == ("one-domain", None, None, 0)
    slow = L.Comm(bandwidths=comm.Bandwidths(network_gbps=25.0))
    two = [_fact("r1-1"), _fact("r1-2", gpus=4)]
    row = L.job_row("ml/job", two, t, now=T0, model=slow)
    assert row.actual_ms == comm.spread_ms(slow.size_bytes, (8, 4), False, slow.bandwidths)
    assert row.actual_ms != L.job_row("ml/job", two, t, now=T0).actual_ms
    assert (row.nodes, row.gpus, row.placement) == ((("r1-1", 8), ("r1-2", 4)), 12, "intra-rack")
    free = L.Best("intra-node", (8,), 0.0)
    assert L.job_row("ml/job", [_fact("r1-1")], t, now=T0, best=free).comm_ratio == 1.0  # 0 ms against 0 ms
    empty = L.job_row("ml/pod=x", (), t, now=T0)
    assert (empty.namespace, empty.workload, empty.unowned, empty.outcome) == ("ml", "unclassified", False,
                                                                              "never-bound")  # fmt: skip
    denied = L.job_row("ml/job", (), t, now=T0, admission=L.Admission("u", T0, "deny", (), "batch"))
    assert (denied.workload, denied.outcome) == ("batch", "denied")
    lonely = L.job_row("ml/pod=x", [_fact("r1-1", unowned=True, workload="batch", namespace="ml")], t, now=T0)
    assert (lonely.unowned, lonely.workload, lonely.deleted) == (True, "batch", 0)


def test_inference_row_edges() -> None:
    t = topo({"r1": 2}, shared=frozenset({"r1-2"}))
    pods = [_fact("", gpus=1), _fact("r1-1", gpus=1), _fact("r1-2", gpus=1), _fact("r1-1", gpus=0, shared=True)]
    row = L.inference_row("ml/Deployment/web", pods, t)
    assert (row.replicas, row.bound, row.per_node, row.shared) == (4, 3, (("r1-1", 2), ("r1-2", 1)), 2)
    none = L.inference_row("team-a/Deployment/web", [], t)
    assert (none.group, none.namespace, none.replicas) == ("team-a/Deployment/web", "team-a", 0)


def test_quantile_succeeded_and_summary_edges() -> None:
    assert L._quantile([2.0, 1.0], 0.5) == 1.0
    assert L._quantile([3.0, 1.0, 2.0], 1.0) == 3.0
    assert L._quantile([], 0.5) is None
    t = topo({"r1": 2})
    row = L.job_row("ml/job", [_fact("r1-1", created=T0, scheduled=T0 + 60)], t, now=T0)
    assert L.succeeded(row, 60.0) and not L.succeeded(row, 59.0)
    s = L.summarize([], 60.0)
    assert (s.jobs, s.success_rate, s.pending_max_s, s.comm_ratio_mean, s.comm_ratio_max) == (0, None, None, None,
                                                                                               None)  # fmt: skip
    lonely = L.job_row("ml/pod=x", [_fact("r1-1", unowned=True)], t, now=T0)
    s = L.summarize([row, lonely], 60.0)
    assert (s.success_within_s, s.unowned, s.unknown_topology, s.succeeded) == (60.0, 1, 0, 2)


def test_free_profile_caps() -> None:
    """Per rack the 32 roomiest nodes, 64 distinct racks, 64 roomiest nodes overall (the defaults)."""
    nodes: dict[str, L.NodeFact] = {}
    free: dict[str, int] = {}
    for r in range(70):  # 70 racks of distinct free counts: 64 kept
        for i in range(40 if r < 3 else 1):
            name = f"r{r}-{i}"
            nodes[name] = L.NodeFact({RACK: f"r{r}"}, 1000, False)
            free[name] = 900 - r if r < 3 else 100 + r
    t = L.Topology(((RACK, "switch"),), nodes)
    kept = L.free_profile(free, t)
    by_rack: dict[str, int] = {}
    for name in kept:
        by_rack[name.split("-")[0]] = by_rack.get(name.split("-")[0], 0) + 1
    assert (by_rack["r0"], by_rack["r1"], by_rack["r2"]) == (40, 32, 32)  # r0: its 32 and 8 more of the 64 overall
    assert len(by_rack) == 64 and len(kept) == 40 + 32 + 32 + 61


# -- what the second mutation run of ledger.py left alive (session 8) -----------------------------------------
# Each scenario is a dump `build` reads; the comments say which wrong bookkeeping it tells apart.

JOB = "batch.kubernetes.io/job-name"


def job(name: str, *placed: tuple[str, float | None, int], created: float = T0) -> list[dict[str, Any]]:
    """The pods of Job `name`: (node or "" for pending, PodScheduled time or None, GPUs) each."""
    return [
        pod(f"{name}-{i}", labels={JOB: name}, owner=("Job", name), node=node, created=created, scheduled=at, gpus=g)
        for i, (node, at, g) in enumerate(placed)
    ]


def built(t: L.Topology, *pods: list[dict[str, Any]], **kw: Any) -> dict[str, L.JobRow]:
    ledger = L.build([p for group in pods for p in group], t, kw.pop("admissions", {}), now=T0 + 1000, **kw)
    return {r.group.rsplit("=", 1)[-1]: r for r in ledger.jobs}


def test_a_bind_in_the_same_second_as_a_jobs_creation_was_taken_before_it() -> None:
    """x binds a-1 in the second j is created (the API server's times are whole seconds): j's best had only
    a-2 in rack a, so crossing racks was the best it could get. The same when x's bind time is unknown (a
    pod bound without a PodScheduled condition counts as bound before everything)."""
    t = topo({"a": 2, "b": 1})
    j = job("j", ("a-2", T0 + 20, 8), ("b-1", T0 + 20, 8), created=T0 + 10)
    for x_bound in (T0 + 10, None):
        rows = built(t, job("x", ("a-1", x_bound, 8)), j)
        assert (rows["j"].best, rows["j"].placement, rows["j"].comm_ratio) == ("cross-rack", "cross-rack", 1.0)
    rows = built(t, job("x", ("a-1", T0 + 11, 8)), j)  # a second later: a-1 was free when j was created
    assert (rows["j"].best, rows["j"].comm_ratio) == ("intra-rack", pytest.approx(1.125))


def test_a_jobs_own_pods_bound_when_it_was_created_are_free_for_its_best() -> None:
    """j's two 4-GPU pods bind a-1 in its creation second; x and y fill the other nodes. The GPUs j holds
    itself are free for its best (one node), every bind up to that second being counted once."""
    t = topo({"a": 2, "b": 1})
    others = job("x", ("a-2", T0, 8)), job("y", ("b-1", T0, 8))
    rows = built(t, *others, job("j", ("a-1", T0 + 10, 4), ("a-1", T0 + 10, 4), created=T0 + 10))
    j = rows["j"]
    assert (j.best, j.outcome, j.placement, j.best_ms, j.comm_ratio) == ("intra-node", "one-domain", "intra-node",
                                                                         j.actual_ms, 1.0)  # fmt: skip
    # Its own pod bound without a PodScheduled time is its own too.
    rows = built(t, *others, job("j", ("a-1", None, 8), created=T0 + 10))
    assert rows["j"].best == "intra-node"
    # One GPU more than the free node holds: no best (not a node's GPU counted twice).
    rows = built(t, *others, job("j", ("a-1", T0 + 10, 8), ("", None, 1), created=T0 + 10))
    assert (rows["j"].best, rows["j"].outcome) == (None, "partly-bound")


def test_every_bind_before_a_job_counts_on_its_node() -> None:
    t = topo({"a": 2, "b": 1})
    full = job("w", ("b-1", T0, 8))
    # Two pods of x on a-1: 8 used, so rack a has one 4-GPU gap (a-2) and j fits nowhere.
    rows = built(t, full, job("x", ("a-1", T0, 4), ("a-1", T0, 4)), job("y", ("a-2", T0, 4)),
                 job("j", ("", None, 4), ("", None, 4), created=T0 + 10))  # fmt: skip
    assert rows["j"].best is None
    # One pod on each of a-1 and a-2: 4 + 4 free in rack a, exactly j.
    rows = built(t, full, job("x", ("a-1", T0, 4)), job("y", ("a-2", T0, 4)),
                 job("j", ("", None, 4), ("", None, 4), created=T0 + 10))  # fmt: skip
    assert rows["j"].best == "intra-rack"


def test_shared_and_one_gpu_nodes_in_the_free_gpus() -> None:
    """A time-sliced node is never a best placement however free; a node with one whole GPU is one."""
    t = topo({"s": 1, "a": 2}, shared=frozenset({"s-1"}))
    rows = built(t, job("x", ("a-1", T0, 4)), job("y", ("a-2", T0, 4)),
                 job("j", ("", None, 4), ("", None, 4), created=T0 + 10))  # fmt: skip
    assert rows["j"].best == "intra-rack"  # a-1 and a-2's gaps, not the free shared s-1
    rows = built(topo({"a": 1}, gpus=1), job("j", ("a-1", T0, 1)))
    assert (rows["j"].best, rows["j"].comm_ratio) == ("intra-node", 1.0)


def test_build_reads_past_garbage_counts_each_and_keeps_pods_without_times() -> None:
    t = topo({"a": 2})
    k = job("k", ("a-2", T0 + 5, 8))
    del k[0]["metadata"]["creationTimestamp"]  # no creation time: its row comes last, pending unknown
    ledger = L.build(["garbage", *job("j", ("a-1", T0 + 1, 8)), 5, *k], t, {}, now=T0 + 100)
    assert ledger.skipped == 2
    assert [(r.group, r.created, r.pending_s) for r in ledger.jobs] == [(f"ml/{JOB}=j", T0, 1.0),
                                                                        (f"ml/{JOB}=k", None, None)]  # fmt: skip


def test_build_gives_each_job_its_admission_and_the_model() -> None:
    """An admission of a job with pods lands on its row (one row, not a second empty one); an inference
    workload's admission makes no job row; the comm model reaches every row."""
    t = topo({"a": 2})
    allow = L.Admission("uid-j", T0 - 1, "allow", ("training-rack",), "training")
    web = L.Admission("uid-w", T0, "allow", (), "inference")
    slow = L.Comm(bandwidths=comm.Bandwidths(network_gbps=25.0))
    admissions = {f"ml/{JOB}=j": allow, "ml/Deployment/web": web}
    ledger = L.build(job("j", ("a-1", T0 + 2, 8), ("a-2", T0 + 2, 8)), t, admissions, now=T0 + 9, model=slow)
    [row] = ledger.jobs
    assert (row.uid, row.admitted, row.rules, row.pending_s) == ("uid-j", T0 - 1, ("training-rack",), 2.0)
    assert row.actual_ms == comm.spread_ms(slow.size_bytes, (8, 8), False, slow.bandwidths)
    assert row.best_ms == row.actual_ms and row.comm_ratio == 1.0


def test_topology_of_a_real_inventory_marks_mig_and_time_sliced_nodes_shared() -> None:
    from tests import test_golden as golden

    inv = golden.inventory_for(golden.DEFAULT_NODES, golden.policy_for(None))
    t = L.topology_of(inv)
    assert {n: (f.gpus, f.shared) for n, f in t.nodes.items()} == {
        "h100-a-1": (8, False), "h100-a-2": (8, False), "h100-b-1": (8, False), "h100-b-2": (8, False),
        "a100-mig-1": (2, True), "l4-ts-1": (0, True),
    }  # fmt: skip
    assert L.free_of(t, {}) == {"h100-a-1": 8, "h100-a-2": 8, "h100-b-1": 8, "h100-b-2": 8}


def test_free_of_a_node_nothing_holds_and_of_a_one_gpu_node() -> None:
    t = L.Topology((("rack", "switch"),), {"a": L.NodeFact({"rack": "r1"}, 8, False),
                                           "one": L.NodeFact({"rack": "r1"}, 1, False)})  # fmt: skip
    assert L.free_of(t, {}) == {"a": 8, "one": 1}


def test_best_placement_prefers_a_rack_that_holds_the_job_to_the_roomiest_nodes() -> None:
    """a-1 is the roomiest node, but only rack b holds both pods: intra-rack, not a-1 plus a node of b."""
    t = topo({"a": 1, "b": 2})
    best = L.best_placement([4, 4], {"a-1": 6, "b-1": 4, "b-2": 4}, t, L.Comm())
    assert best is not None and (best.placement, best.per_node) == ("intra-rack", (4, 4))
    # No rack holds both: across racks, the larger share first.
    across = L.best_placement([4, 8], {"a-1": 8, "b-1": 4}, topo({"a": 1, "b": 1}), L.Comm())
    assert across is not None and (across.placement, across.per_node) == ("cross-rack", (8, 4))


def test_best_placement_packs_the_roomiest_node_first_and_the_largest_pod_first() -> None:
    t = topo({"a": 3})
    best = L.best_placement([4, 4], {"a-1": 4, "a-2": 4, "a-3": 8}, t, L.Comm())
    assert best is not None and best.placement == "intra-node"  # both on a-3, not one on a-1 and a-2
    best = L.best_placement([2, 6], {"a-1": 6, "a-2": 2}, t, L.Comm())
    assert best is not None and (best.placement, best.per_node) == ("intra-rack", (6, 2))  # 6 first, then 2


def test_best_placement_reads_only_known_nodes_with_free_gpus_and_unlabelled_ones_only_as_a_fallback() -> None:
    t = topo({"a": 2})
    assert L.best_placement([8], {"ghost": 8, "a-1": 4}, t, L.Comm()) is None  # ghost: not a GPU node we know
    one = L.best_placement([1], {"a-1": 1}, t, L.Comm())
    assert one is not None and one.placement == "intra-node"
    t.nodes["bare"] = L.NodeFact({}, 8, False)  # type: ignore[index]
    # bare would hold both pods on one node, but it has no rack label: rack a's placement is the best.
    best = L.best_placement([4, 4], {"bare": 8, "a-1": 4, "a-2": 4}, t, L.Comm())
    assert best is not None and best.placement == "intra-rack"


def test_best_placement_does_not_depend_on_the_order_of_the_free_gpus() -> None:
    """The cluster-wide fallback takes the roomiest nodes, equal ones by name: a-1 and b-1 (across racks),
    whichever order the free map lists them in (z has no rack label)."""
    t = topo({"a": 1, "b": 1})
    t.nodes["z"] = L.NodeFact({}, 8, False)  # type: ignore[index]
    for free in ({"a-1": 8, "b-1": 8, "z": 8}, {"z": 8, "b-1": 8, "a-1": 8}):
        best = L.best_placement([8, 8], free, t, L.Comm())
        assert best is not None and best.placement == "cross-rack", free


def test_best_placement_times_with_the_model_it_is_given() -> None:
    slow = L.Comm(bandwidths=comm.Bandwidths(network_gbps=25.0))
    in_rack = L.best_placement([8, 8], {"a-1": 8, "a-2": 8}, topo({"a": 2}), slow)
    assert in_rack is not None and in_rack.ms == comm.spread_ms(slow.size_bytes, (8, 8), False, slow.bandwidths)
    across = L.best_placement([8, 8], {"a-1": 8, "b-1": 8}, topo({"a": 1, "b": 1}), slow)
    assert across is not None and across.placement == "cross-rack"
    assert across.ms == comm.spread_ms(slow.size_bytes, (8, 8), True, slow.bandwidths)
    t = topo({"a": 1})
    t.nodes["u1"] = L.NodeFact({}, 8, False)  # type: ignore[index]
    t.nodes["u2"] = L.NodeFact({}, 8, False)  # type: ignore[index]
    unknown = L.best_placement([8, 8], {"u1": 8, "u2": 8}, t, L.Comm())  # no rack label: not known to cross
    assert unknown is not None and (unknown.placement, unknown.ms) == ("intra-rack", comm.spread_ms(
        comm.DEFAULT_MESSAGE_BYTES, (8, 8), False))  # fmt: skip


def test_free_profile_keeps_the_overall_roomiest_the_free_nodes_only_and_racks_by_free_total() -> None:
    t = topo({"a": 100}, gpus=100)
    kept = L.free_profile({f"a-{i}": i for i in range(1, 101)}, t)
    assert kept == {f"a-{i}": i for i in range(37, 101)}  # 64 overall (32 of the rack among them)
    t = topo({"a": 3})
    assert L.free_profile({"a-1": 0, "a-2": 1, "a-3": -2, "ghost": 8}, t) == {"a-2": 1}
    flat = L.Topology((), {f"n{i}": L.NodeFact({}, 8, False) for i in range(1, 6)})  # no rack level: one domain
    free = {f"n{i}": 9 - i for i in range(1, 6)}
    assert L.free_profile(free, flat, per_domain=3, overall=1) == {"n1": 8, "n2": 7, "n3": 6}
    # Kept racks: those of most free GPUs in total (r1's 12), not of the roomiest first node (r2's 8).
    t = topo({"r1": 3, "r2": 1})
    free = {"r1-1": 4, "r1-2": 4, "r1-3": 4, "r2-1": 8}
    assert L.free_profile(free, t, domains=1, overall=0) == {"r1-1": 4, "r1-2": 4, "r1-3": 4}


def test_an_nvlink_level_spanned_inside_one_rack_does_not_cross_the_spine() -> None:
    clique = "nvidia.com/gpu.clique"
    t = L.Topology(
        ((clique, "nvlink"), (RACK, "switch")),
        {
            "n1": L.NodeFact({clique: "c1", RACK: "r1"}, 4, False),
            "n2": L.NodeFact({clique: "c2", RACK: "r1"}, 4, False),
        },
    )
    row = L.job_row("ml/job", [_fact("n1", gpus=4), _fact("n2", gpus=4)], t, now=T0)
    assert (row.outcome, row.placement) == ("spanning", "intra-rack")
    t.nodes["n3"] = L.NodeFact({RACK: "r1"}, 4, False)  # type: ignore[index]  # no clique label: not read
    row = L.job_row("ml/job", [_fact("n1", gpus=4), _fact("n3", gpus=4)], t, now=T0)
    assert (row.outcome, row.placement) == ("unknown-topology", "intra-rack")


def test_two_pods_on_one_node_add_up_and_a_one_replica_inference_row() -> None:
    t = topo({"r1": 1})
    row = L.job_row("ml/job", [_fact("r1-1", gpus=4), _fact("r1-1", gpus=4)], t, now=T0)
    assert (row.nodes, row.placement) == ((("r1-1", 8),), "intra-node")
    one = L.inference_row("team-a/Deployment/web", [_fact("r1-1", gpus=1, namespace="team-a")], t)
    assert (one.namespace, one.replicas, one.per_node) == ("team-a", 1, (("r1-1", 1),))
