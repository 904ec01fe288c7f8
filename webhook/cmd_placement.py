"""`gpu-admission placement`: the post-launch ledger an operator reads (issue #18).

Per training job: pods bound, pending time (first pod created to last pod bound, from `PodScheduled`),
outcome, the topology domains it spans, and its all-reduce time against the best placement the free GPUs
allowed when its first pod was created (`gpu-admission estimate`'s model). Per inference workload: replicas
per node and zone, and how many landed on shared GPUs. Then a summary.

Inputs: live from a cluster (the kubeconfig, as `serve` finds it), or from dumps (`--pods`, `--nodes`, as
`kubectl get pods -A -o yaml` and `kubectl get nodes -o yaml` write them); `--audit` adds the admissions
(denied jobs, the uid of each job's admission, the rules that fired).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from typing import Any

from policies import ledger as L
from policies import topology
from webhook.cli import UsageError

OUTPUTS = ("table", "json")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "placement",
        help="the post-launch ledger: where each job's pods landed, how long they waited, what it costs",
        description="Per job: pods bound, pending time, outcome (one-domain, spanning, partly-bound, never-bound, "
        "denied), domains spanned and the all-reduce time of the actual placement against the best the cluster "
        "had; per inference workload: spread and shared-GPU landing; then a summary. Live from the cluster, or "
        "from --pods/--nodes dumps.",
    )
    p.add_argument("--pods", metavar="FILE", action="append", help="Pods (kubectl get pods -A -o yaml; repeatable)")
    p.add_argument("--nodes", metavar="FILE", help="Nodes (kubectl get nodes -o yaml); Pods in it count too")
    p.add_argument("--audit", metavar="FILE|DIR|GLOB", action="append", help="audit logs: admissions (repeatable)")
    p.add_argument("--policy", metavar="FILE", help="policy (topology levels, comm settings; default built-in)")
    p.add_argument("--kubeconfig", metavar="FILE", help="read the cluster live (default when no --pods/--nodes)")
    p.add_argument("--within", metavar="DURATION", default="10m", help="success = fully bound within this (10m)")
    p.add_argument("--at", metavar="TIME", help="as of this time, RFC 3339 (default now): the wait of jobs not bound")
    p.add_argument("-o", "--output", metavar="FORMAT", default="table", help="table (default) or json")
    p.set_defaults(func=run)


def _audit_admissions(sources: list[str]) -> dict[str, L.Admission]:
    from webhook.cmd_audit import FIRED, Reader, expand

    admissions: dict[str, L.Admission] = {}
    entries = sorted(Reader().read(expand(sources)), key=lambda e: e[0])
    for when, rec in entries:
        group = rec.get("group")
        if not isinstance(group, str) or not group or rec.get("dryRun") is True or "verdict" not in rec:
            continue
        rules: list[Any] = rec["rules"] if isinstance(rec.get("rules"), list) else []
        fired = [str(r.get("rule")) for r in rules if isinstance(r, dict) and r.get("outcome") in FIRED]
        mutations = [str(m) for m in rec.get("mutations") or [] if isinstance(m, str)]
        workload = str(rec.get("workload") or "unclassified")
        new = L.Admission(
            str(rec["uid"]), when.timestamp(), str(rec["verdict"]), tuple(dict.fromkeys([*fired, *mutations])), workload
        )
        admissions[group] = L.merge_admission(admissions.get(group), new)
    return admissions


def _load(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Node objects, Pod objects) from the dumps, or listed live."""
    from webhook.cmd_check import load_kinds

    if not args.pods and not args.nodes:
        return _live(args.kubeconfig)
    objects: list[dict[str, Any]] = []
    for flag, path in [("--nodes", args.nodes)] * bool(args.nodes) + [("--pods", p) for p in args.pods or []]:
        objects += load_kinds(flag, path, ("Node", "Pod"))
    return [o for o in objects if o.get("kind") == "Node"], [o for o in objects if o.get("kind") == "Pod"]


def _live(kubeconfig: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from cluster.kubeclient import KubeClient, KubeConfigError, KubeError

    try:
        client = KubeClient.from_config(kubeconfig)
        nodes = client.list_all("/api/v1/nodes").get("items") or []
        pods = client.list_all("/api/v1/pods").get("items") or []
    except (KubeConfigError, KubeError, OSError) as exc:
        raise UsageError(f"cannot read the cluster: {exc}") from None
    return nodes, pods


def _seconds(text: str) -> float:
    from webhook.cmd_audit import parse_duration

    return parse_duration(text, "--within").total_seconds()


def run(args: argparse.Namespace) -> int:
    from policies import inventory as inventory_mod
    from webhook.cmd_check import load_policy

    if args.output not in OUTPUTS:
        raise UsageError(f"-o/--output: must be table or json, got {args.output!r}")
    within = _seconds(args.within)
    now = L.parse_time(args.at) if args.at else time.time()
    if now is None:
        raise UsageError(f"--at: not an RFC 3339 time: {args.at!r} (e.g. 2026-12-01T10:05:00Z)")
    policy = load_policy(args.policy)
    nodes, pods = _load(args)
    admissions = _audit_admissions(args.audit) if args.audit else {}
    topo = L.topology_of(inventory_mod.build(nodes, policy))
    settings = policy.comm
    model = L.Comm(settings.message_bytes, settings.bandwidths())
    ledger = L.build(pods, topo, admissions, now=now, model=model)
    summary = L.summarize(ledger.jobs, within)
    if ledger.skipped:
        print(
            f"gpu-admission placement: skipped {ledger.skipped} pod object(s) that could not be read", file=sys.stderr
        )
    if args.output == "json":
        print(json.dumps(_json(ledger, summary, topo), indent=2, ensure_ascii=False))
    else:
        print(_table(ledger, summary, topo))
    return 0


# -- output -------------------------------------------------------------------------------------------------


def _short_level(key: str) -> str:
    """`rack` for topology.kubernetes.io/rack, `zone`, `clique`, `layer-2`...: the last word of the key."""
    if key == topology.ZONE:
        return "zone"
    return key.rsplit("/", 1)[-1].replace("network-node-", "").replace("gpu.", "")


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.0f}s"
    return f"{value / 60:.1f}m" if value < 7200 else f"{value / 3600:.1f}h"


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _spans(row: L.JobRow) -> str:
    return " ".join(f"{_short_level(k)}:{'?' if n is None else n}" for k, n in row.spans) or "-"


def _columns(headers: list[str], rows: Iterable[list[str]]) -> list[str]:
    table = [headers, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]


def _table(ledger: L.Ledger, s: L.Summary, topo: L.Topology) -> str:
    out: list[str] = []
    levels = ", ".join(_short_level(k) for k, _ in topo.levels) or "none"
    out.append(f"Jobs ({len(ledger.jobs)}; levels: {levels})")
    out += _columns(
        ["JOB", "CLASS", "BOUND", "OUTCOME", "PENDING", "SPANS", "PLACEMENT", "BEST", "COMM×"],
        [
            [
                r.group,
                r.workload,
                f"{r.bound}/{r.pods}",
                r.outcome,
                _secs(r.pending_s),
                _spans(r),
                r.placement or "-",
                r.best or "-",
                _num(r.comm_ratio),
            ]
            for r in ledger.jobs
        ],
    )
    if ledger.inference:
        out += ["", f"Inference workloads ({len(ledger.inference)})"]
        out += _columns(
            ["WORKLOAD", "BOUND", "NODES", "ZONES", "ON SHARED GPUS"],
            [
                [
                    r.group,
                    f"{r.bound}/{r.replicas}",
                    " ".join(f"{n}:{c}" for n, c in r.per_node) or "-",
                    " ".join(f"{z}:{c}" for z, c in r.per_zone) or "-",
                    str(r.shared),
                ]
                for r in ledger.inference
            ],
        )
    rate = "-" if s.success_rate is None else f"{s.success_rate:.0%}"
    out += [
        "",
        "Summary",
        f"  jobs {s.jobs}, admitted {s.admitted}; fully bound within {_secs(s.success_within_s)}: "
        f"{s.succeeded} ({rate})",
        "  outcomes: " + ", ".join(f"{o} {n}" for o, n in s.outcomes),
        f"  partly bound: {s.partial_gangs} job(s) holding {s.partial_gpus} GPU(s)",
        f"  pending (fully bound jobs): p50 {_secs(s.pending_p50_s)}, max {_secs(s.pending_max_s)}",
        f"  comm ratio (actual / best at admission): mean {_num(s.comm_ratio_mean)}, max {_num(s.comm_ratio_max)}",
        f"  pods without owner: {s.unowned} job(s); unknown topology: {s.unknown_topology}",
    ]
    return "\n".join(out)


def _json(ledger: L.Ledger, s: L.Summary, topo: L.Topology) -> dict[str, Any]:
    return {
        "levels": [{"key": k, "kind": kind} for k, kind in topo.levels],
        "jobs": [
            {
                "job": r.group,
                "namespace": r.namespace,
                "workload": r.workload,
                "unowned": r.unowned,
                "pods": r.pods,
                "bound": r.bound,
                "deleted": r.deleted,
                "gpus": r.gpus,
                "outcome": r.outcome,
                "created": r.created,
                "admitted": r.admitted,
                "firstBound": r.first_bound,
                "lastBound": r.last_bound,
                "pendingSeconds": r.pending_s,
                "spans": {k: n for k, n in r.spans},
                "nodes": dict(r.nodes),
                "placement": r.placement,
                "actualMs": r.actual_ms,
                "best": r.best,
                "bestMs": r.best_ms,
                "commRatio": r.comm_ratio,
                "uid": r.uid,
                "jobUid": r.job_uid,
                "rules": list(r.rules),
            }
            for r in ledger.jobs
        ],
        "inference": [
            {
                "workload": r.group,
                "namespace": r.namespace,
                "replicas": r.replicas,
                "bound": r.bound,
                "perNode": dict(r.per_node),
                "perZone": dict(r.per_zone),
                "onSharedGpus": r.shared,
            }
            for r in ledger.inference
        ],
        "summary": {
            "jobs": s.jobs,
            "admitted": s.admitted,
            "withinSeconds": s.success_within_s,
            "succeeded": s.succeeded,
            "successRate": s.success_rate,
            "outcomes": dict(s.outcomes),
            "partialGangs": s.partial_gangs,
            "partialGangGpus": s.partial_gpus,
            "pendingP50Seconds": s.pending_p50_s,
            "pendingMaxSeconds": s.pending_max_s,
            "commRatioMean": s.comm_ratio_mean,
            "commRatioMax": s.comm_ratio_max,
            "unowned": s.unowned,
            "unknownTopology": s.unknown_topology,
            "skippedPods": ledger.skipped,
        },
    }
