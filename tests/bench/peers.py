"""The `peers` part: gpu-admission beside Kyverno and Gatekeeper on the same real API server (issue #19).

The apiserver part's machinery (tests/bench/apiserver.py: one control plane, configurations interleaved and
rotated per repetition, the Go load generator, API-server metrics and per-process CPU) measures, in one run:
none, the no-op webhook, ours, ours --native, and each peer that is built (tests/bench/peerinstall.py; a peer
that is not is named with the reason and left out) — pod creates at 1 and 20 clients and open loop at 100
pods/s, then a burst: BURST_JOBS Indexed Jobs of BURST_PODS pods each applied at once, timed until the Job
controller has created every pod (what a training launch looks like). Placement "shared": everything on the
same cores, as on a small cluster.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from policies.userkeys import ENFORCEMENT
from tests.bench import apiserver, common, corpus
from tests.bench import peerinstall as install

LOADS = ("1", "20", "20@100/s")
CONFIGS = ("noop", "native")  # with none and webhook, which apiserver.run always measures
BURST_JOBS = 50
BURST_PODS = 20
QUICK_BURST = (5, 4)


def available() -> tuple[tuple[str, ...], dict[str, str]]:
    """(peers that can run here, {peer: why not})."""
    missing = {name: cls.missing() for name, cls in install.PEERS.items()}
    return tuple(n for n in apiserver.PEER_CONFIGS if n in missing and not missing[n]), {
        n: why for n, why in missing.items() if why
    }


def burst_jobs(namespace: str, jobs: int, pods: int) -> dict[str, Any]:
    """`jobs` Indexed Jobs of `pods` 8-GPU training pods each, labelled with a job identity every peer's
    policies accept, on a scheduler nobody serves (only the creates load the control plane)."""
    pod = corpus.training_pod(from_mutated_template=False)
    template_spec = pod["spec"]
    template_spec["schedulerName"] = corpus.UNSCHEDULED
    template_spec["restartPolicy"] = "Never"
    items = []
    for k in range(jobs):
        name = f"burst-{k}"
        items.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": namespace, "labels": {"gpu-admission.io/workload": "training"}},
                "spec": {
                    "parallelism": pods,
                    "completions": pods,
                    "completionMode": "Indexed",
                    "template": {
                        "metadata": {
                            "labels": {"gpu-admission.io/workload": "training", "gpu-admission.io/job": name},
                            "annotations": {"gpu-admission.io/job-gpus": str(8 * pods)},
                        },
                        "spec": template_spec,
                    },
                },
            }
        )
    return install.as_list(items)


def _pod_count(cp: Any, namespace: str) -> int:
    """Pods in the namespace from one list of limit 1 (remainingItemCount): cheap for the API server."""
    page = json.loads(cp.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods?limit=1").stdout)
    return len(page.get("items", [])) + int(page.get("metadata", {}).get("remainingItemCount") or 0)


def burst(cp: Any, configs: Any, config: str, cpus: str | None, quick: bool = False) -> dict[str, Any]:
    jobs, pods = QUICK_BURST if quick else (BURST_JOBS, BURST_PODS)
    want = jobs * pods
    namespace = f"burst-{config}-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", namespace)
    # The burst measures admission: its pods are never bound (no scheduler serves them), so under `enforce` the
    # placement hold (docs/policy.md) would hold each pinned job's successor for placement.waitingGraceSeconds
    # plus the Job controller's back-off, and the figure would measure that chain (~4 min for the quick burst)
    # instead of the review work. At `warn` our rules do the same work (the peers do not read the label). That
    # the chain is bounded is tested on the real scheduler in tests/e2e/test_placement_e2e.py.
    cp.kubectl("label", "namespace", namespace, f"{ENFORCEMENT}=warn")
    pids = apiserver._pids(cp, configs)
    before = apiserver.admission_metrics(cp)
    cpu0 = apiserver._cpu(pids)
    t0 = time.monotonic()
    try:
        cp.kubectl("apply", "-f", "-", input=burst_jobs(namespace, jobs, pods))
        created, deadline = 0, t0 + 600
        while created < want and time.monotonic() < deadline:
            time.sleep(0.25)
            created = _pod_count(cp, namespace)
        took = time.monotonic() - t0
        cpu1 = apiserver._cpu(pids)
        after = apiserver.admission_metrics(cp)
    finally:
        # Jobs first (orphaning), or their controller would recreate the pods being deleted.
        cp.kubectl(
            "delete", "--raw", f"/apis/batch/v1/namespaces/{namespace}/jobs?propagationPolicy=Orphan", check=False
        )
        apiserver._cleanup(cp, namespace)
    calls = {}
    for who, (s1, c1) in after.items():
        s0, c0 = before.get(who, (0.0, 0.0))
        if c1 > c0:
            calls[who] = {"calls": int(c1 - c0), "mean_ms": round((s1 - s0) / (c1 - c0) * 1000, 3)}
    hook = apiserver.hook_figures(config, pids, calls)
    if hook.get("reviews") and hook["process"] in cpu0:
        hook["cpu_ms_per_review"] = round((cpu1[hook["process"]] - cpu0[hook["process"]]) / hook["reviews"] * 1000, 3)
    load = common.loadavg()
    res = {
        "jobs": jobs,
        "pods_wanted": want,
        "pods_created": created,
        "seconds": round(took, 3),
        "pods_per_s": round(created / took, 1) if took else None,
        "cpu_ms_per_pod": {n: round((cpu1[n] - cpu0[n]) / max(created, 1) * 1000, 3) for n in cpu1 if n in cpu0},
        "admission": calls,
        "hook": hook,
        "loadavg": load[0] if load else None,
    }
    common.say(
        f"  burst {config:>10}: {created}/{want} pods in {res['seconds']} s ({res['pods_per_s']} pods/s), "
        f"API-server CPU {res['cpu_ms_per_pod'].get('kube-apiserver')} ms/pod, hook {hook} (load {res['loadavg']})"
    )
    return res


def run(quick: bool = False, reps: int | None = None, loads: tuple[str, ...] = LOADS) -> dict[str, Any]:
    names, missing = available()
    for why in missing.values():
        common.say(f"peers: left out: {why}")
    result = apiserver.run(
        quick=quick,
        placement="shared",
        only=CONFIGS,
        only_loads=tuple(k for k in LOADS if k in loads),
        peer_names=names,
        reps=reps,
        burst=lambda cp, configs, config, cpus: burst(cp, configs, config, cpus, quick=quick),
    )
    result["part"] = "peers"
    result["left_out"] = missing
    result["burst_summary"] = summarize_bursts(result.get("bursts", {}))
    report_bursts(result["burst_summary"])
    return result


def summarize_bursts(bursts: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out = {}
    for config, rs in bursts.items():

        def med(get: Any, rs: list[dict[str, Any]] = rs) -> Any:
            values = [v for v in (get(r) for r in rs) if v is not None]
            return common.rnd(common.median(values), 3) if values else None

        out[config] = {
            "jobs": rs[0]["jobs"],
            "pods": rs[0]["pods_wanted"],
            "seconds": med(lambda r: r["seconds"]),
            "pods_per_s": med(lambda r: r["pods_per_s"]),
            "apiserver_cpu_ms_per_pod": med(lambda r: r["cpu_ms_per_pod"].get("kube-apiserver")),
            "controller_manager_cpu_ms_per_pod": med(lambda r: r["cpu_ms_per_pod"].get("kube-controller-manager")),
            "hook_cpu_ms_per_review": med(lambda r: r["hook"].get("cpu_ms_per_review")),
            "hook_rss_mib": med(lambda r: r["hook"].get("rss_mib")),
            "all_created": all(r["pods_created"] >= r["pods_wanted"] for r in rs),
            "seconds_runs": [r["seconds"] for r in rs],
            "loadavg_runs": [r["loadavg"] for r in rs],
        }
    return out


def report_bursts(summary: dict[str, dict[str, Any]]) -> None:
    if not summary:
        return
    headers = ["config", "seconds", "pods/s", "CPU ms/pod apiserver", "CPU ms/pod controller-manager",
               "CPU ms/review webhook", "RSS MiB webhook", "all created", "seconds of runs"]  # fmt: skip
    rows = [
        [c, s["seconds"], s["pods_per_s"], s["apiserver_cpu_ms_per_pod"], s["controller_manager_cpu_ms_per_pod"],
         s["hook_cpu_ms_per_review"] or "–", s["hook_rss_mib"] or "–", s["all_created"],
         "/".join(f"{x:.1f}" for x in s["seconds_runs"])]
        for c, s in summary.items()
    ]  # fmt: skip
    first = next(iter(summary.values()))
    common.say(f"burst: {first['jobs']} Indexed Jobs, {first['pods']} pods in all, applied at once, until all exist")
    common.say(common.table(headers, rows))


def report(result: dict[str, Any]) -> None:
    for why in result.get("left_out", {}).values():
        common.say(f"left out: {why}")
    apiserver.report(result)
    report_bursts(result.get("burst_summary", {}))
