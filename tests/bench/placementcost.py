"""Placement cost at scale (issue #11 item 6): what a placement decision costs with the pod view on a 50,000-node
cluster (tests/bench/clustergen.py) holding 500,000 pods, in process.

Pods: every GPU node holds GPU pods on about half its GPUs (1-, 2- and 4-GPU pods of 8-pod jobs), the rest of
the 500,000 are CPU pods (the view drops them at decode). Printed and written to out/bench/placement-cost.json:

- load: the view fed every pod once (the first list), and one pod change then the snapshot rebuilt (what a
  review after a watch event pays before it reads);
- decide: `review` of a 4x8-GPU Indexed Job (training-rack picks a rack among every H100 rack) with a fresh
  snapshot for each call (the worst case: the pod view changed since the last review, so no memo helps), and
  with the same snapshot (the memo: the other pods and templates of one job, between two pod events);
- keep-off: `review` of a 4-GPU pod while 3 jobs hold reservations, fresh snapshot and memoized;
- bind check: that pod's bind onto a node of a reserved rack judged (policies/bindcheck.py), fresh and not;
- baseline: the same objects without a pod view (placement by allocatable only, memoized per inventory).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from cluster.pods import PodView
from cluster.reflector import Change
from policies import bindcheck
from policies import inventory as inventory_mod
from policies.engine import review
from policies.placement import Reservation
from policies.subject import ReviewContext, pod_facts
from tests.bench import clustergen, common
from tests.bench.engine import _time
from tests.e2e import placement as pl
from webhook.state import capacity_of, gc_paused

NODES = 50_000
PODS = 500_000
RACK = "topology.kubernetes.io/rack"


def _pods(inv: Any, total: int, full: bool) -> dict[str, Any]:
    """key -> pod object: GPU pods on half the GPUs of every GPU node (`full`: no 8-GPU node is free, so no
    rack holds a 4x8 gang now) or of every other node, then CPU pods up to `total`."""
    out: dict[str, Any] = {}
    sizes = (1, 2, 4)
    i = 0
    for k, n in enumerate(inv.nodes):
        if n.whole_gpus <= 0 or (not full and k % 2):
            continue
        left = n.whole_gpus // 2
        while left > 0 and len(out) < total:
            g = min(sizes[i % 3], left)
            job = f"job-{i // 8}"
            out[f"ml/p{i}"] = _pod(f"p{i}", n.name, {"nvidia.com/gpu": g}, job)
            left -= g
            i += 1
    while len(out) < total:
        out[f"web/c{i}"] = _pod(f"c{i}", "cpu-node", {"cpu": "1"}, None)
        i += 1
    return out


def _pod(name: str, node: str, limits: dict[str, Any], job: str | None) -> dict[str, Any]:
    labels = {"batch.kubernetes.io/job-name": job} if job else {"app": "web"}
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": labels, "resourceVersion": "1"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Running"},
    }


def run(quick: bool = False) -> dict[str, Any]:
    n_nodes, n_pods = (1_000, 10_000) if quick else (NODES, PODS)
    pol = common_policy()
    objs = clustergen.cluster(n_nodes)
    with gc_paused():
        inv = inventory_mod.build(objs, pol)
    del objs
    out: dict[str, Any] = {
        "part": "placement-cost",
        "quick": quick,
        "machine": common.machine(),
        "nodes": n_nodes,
        "gpu_nodes": inv.node_count,
        "pods": n_pods,
    }
    for scenario, full in (("some_racks_hold_it", False), ("no_rack_holds_it", True)):
        common.say(f"-- {scenario}")
        out[scenario] = _scenario(inv, pol, _pods(inv, n_pods, full), quick)
    report(out)
    return out


def _scenario(inv: Any, pol: Any, pods: dict[str, Any], quick: bool) -> dict[str, Any]:
    iterations, rounds = (50, 3) if quick else (100, 5)
    view = PodView(pod_facts)
    t0 = time.perf_counter()
    with gc_paused():
        view.load(pods)
    load_s = time.perf_counter() - t0
    some = next(iter(pods))
    flip = [pods[some], {**pods[some], "status": {"phase": "Succeeded"}}]
    state = {"i": 0}

    def change_and_snapshot() -> Any:
        state["i"] += 1
        view.apply(Change("MODIFIED", some, None, flip[state["i"] % 2]))
        return capacity_of(view.snapshot())

    gc.collect()
    gc.freeze()
    out: dict[str, Any] = {
        "gpu_pods_in_view": view.snapshot().pods,
        "load_s": common.rnd(load_s, 2),
        "change_and_snapshot": _time(change_and_snapshot, iterations, rounds),
    }
    job = pl.indexed_job("llm", 4, 8)
    job["metadata"]["namespace"] = "ml"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "infer", "namespace": "web", "labels": {"app": "infer"}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}]},
    }
    racks = sorted({n.labels[RACK] for n in inv.nodes if n.whole_gpus >= 8 and RACK in n.labels})
    held = tuple(Reservation(f"ml/batch.kubernetes.io/job-name=r{i}", RACK, racks[i], (8, 8)) for i in range(3))
    fixed = capacity_of(view.snapshot())

    def fresh(obj: Any, reservations: tuple[Reservation, ...] = ()) -> Any:
        change_and_snapshot()  # a pod event since the last review: a new snapshot, nothing memoized for it
        ctx = ReviewContext(namespace="ml", capacity=capacity_of(view.snapshot()), reservations=reservations)
        return review(obj, policy=pol, inventory=inv, ctx=ctx)

    def memo(obj: Any, reservations: tuple[Reservation, ...] = ()) -> Any:
        ctx = ReviewContext(namespace="ml", capacity=fixed, reservations=reservations)
        return review(obj, policy=pol, inventory=inv, ctx=ctx)

    r = fresh(job)
    out["decision"] = {"pinned": r.placement.domain if r.placement else None, "mutations": list(r.mutations)}
    out["keep_off_mutations"] = list(fresh(pod, held).mutations)
    # The bind check (reserved-bind): a 4-GPU pod's bind onto a node of a reserved rack.
    node = next(n.name for n in inv.nodes if n.labels.get(RACK) == racks[0] and n.whole_gpus >= 8)
    binding = {"target": {"kind": "Node", "name": node}}
    bound = bindcheck.BoundPod("web", "infer", 4, None)

    def bind_fresh() -> Any:
        change_and_snapshot()
        return bindcheck.check(binding, bound, inv, capacity_of(view.snapshot()), held, 120)

    out["bind_check"] = bind_fresh().reason
    cases = {
        "bind_check_fresh_snapshot": bind_fresh,
        "bind_check_memoized": lambda: bindcheck.check(binding, bound, inv, fixed, held, 120),
        "job_4x8_fresh_snapshot": lambda: fresh(job),
        "job_4x8_memoized": lambda: memo(job),
        "pod_keep_off_fresh_snapshot": lambda: fresh(pod, held),
        "pod_keep_off_memoized": lambda: memo(pod, held),
        "pod_no_reservations": lambda: memo(pod),
    }
    for name, fn in cases.items():
        out[name] = _time(fn, iterations, rounds)
        common.say(f"  {name}: median {out[name]['median_us']} µs, p99 {out[name]['p99_us']} µs")
    gc.unfreeze()
    return out


def common_policy() -> Any:
    from tests.bench import corpus

    return corpus.policy()


def report(r: dict[str, Any]) -> None:
    for scenario in ("some_racks_hold_it", "no_rack_holds_it"):
        sc = r[scenario]
        common.say(
            f"placement cost, {scenario}: {r['nodes']} nodes ({r['gpu_nodes']} GPU nodes), {r['pods']} pods "
            f"({sc['gpu_pods_in_view']} GPU pods in the view; loaded in {sc['load_s']} s); "
            f"4x8 job: {sc['decision']}; 4-GPU pod beside 3 reservations: {sc['keep_off_mutations']}"
        )
        names = [k for k in sc if isinstance(sc[k], dict) and "median_us" in sc[k]]
        common.say(
            common.table(("what", "median µs", "p99 µs"), [(n, sc[n]["median_us"], sc[n]["p99_us"]) for n in names])
        )
