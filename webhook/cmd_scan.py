"""`gpu-admission scan`: judge what already runs in a cluster against the current policy and inventory.

Read-only unless `--report` (then it writes OpenReports Report objects, webhook/reports.py). Exit 0 when
nothing fails, 1 when an object fails a rule, 2 when the cluster cannot be scanned (credentials, policy,
a kind that could not be listed): one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from webhook.cli import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "scan",
        help="judge the workloads and pods that already run in a cluster",
        description="List every workload kind the webhook handles (paged, rate-limited) and judge each object "
        "as stored with the current policy, inventory, namespace labels and exceptions. Exit 0 when nothing "
        "fails, 1 when something does, 2 when the cluster cannot be scanned.",
    )
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: KUBECONFIG, ~/.kube, in-cluster)")
    p.add_argument("--context", metavar="NAME", help="kubeconfig context")
    p.add_argument("-n", "--namespace", metavar="NS", help="one namespace (default: all)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--policy", metavar="FILE", help="judge with this policy instead of the cluster's")
    src.add_argument("--policy-configmap", metavar="NS/NAME", default="gpu-admission/gpu-admission-policy",
                     help="the cluster's policy (default gpu-admission/gpu-admission-policy; the built-in "
                     "policy, said so, when it does not exist)")  # fmt: skip
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--report", action="store_true",
                   help="also write an OpenReports Report (openreports.io/v1alpha1) per namespace")  # fmt: skip
    p.add_argument("--page-size", type=_positive_int, default=100, metavar="N",
                   help="objects per list request (default 100)")  # fmt: skip
    p.add_argument("--qps", type=_positive_float, default=5.0, metavar="X",
                   help="list requests per second at most (default 5)")  # fmt: skip
    p.add_argument("--include-owned", action="store_true",
                   help="also judge objects whose controller is scanned (ReplicaSets, pods)")  # fmt: skip
    p.set_defaults(func=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError("must be 1-10000")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.1 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be 0.1-1000")
    return value


def run(args: argparse.Namespace) -> int:
    from cluster.kubeclient import KubeClient, KubeConfigError, KubeError
    from policies.document import PolicyError
    from webhook import reports
    from webhook import scan as scan_mod
    from webhook.cmd_check import load_policy

    policy = load_policy(args.policy) if args.policy else None
    ns, _, name = args.policy_configmap.partition("/")
    if not ns or not name:
        raise UsageError("--policy-configmap must be NAMESPACE/NAME")
    try:
        client = KubeClient.from_config(args.kubeconfig, context=args.context)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None
    limits = scan_mod.Limits(page_size=args.page_size, qps=args.qps)
    with client:
        try:
            result = scan_mod.run(
                client,
                policy=policy,
                policy_configmap=(ns, name),
                namespace=args.namespace,
                limits=limits,
                include_owned=args.include_owned,
            )
        except PolicyError as exc:
            raise UsageError(f"policy: {exc}") from None
        except KubeError as exc:
            raise UsageError(f"cannot scan: {exc}") from None
        written = None
        if args.report:
            try:
                written = reports.write(client, result.results, result.policy_hash)
            except reports.ReportError as exc:
                raise UsageError(str(exc)) from None
    for note in result.notes:
        print(f"gpu-admission: warning: {note}", file=sys.stderr)
    for bad in result.unreadable:
        print(f"gpu-admission: warning: skipped {bad.describe()}", file=sys.stderr)
    if args.output == "json":
        sys.stdout.buffer.write(orjson.dumps(as_json(result, written), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print_table(result, written)
    if result.list_errors:
        for err in result.list_errors:
            print(f"gpu-admission: error: could not list {err}", file=sys.stderr)
        return 2
    return 1 if result.counts()["fail"] else 0


def as_json(result: Any, written: int | None) -> dict[str, Any]:
    return {
        "summary": {
            **result.counts(),
            "objects": len(result.results),
            "owned": result.owned,
            "unreadable": len(result.unreadable),
            "requests": result.requests,
            "seconds": round(result.seconds, 3),
            "policy": result.policy_source,
            "policyHash": result.policy_hash,
            "notServed": result.not_served,
            "listErrors": result.list_errors,
            "reportsWritten": written,
        },
        "results": [
            {
                "apiVersion": r.api_version,
                "kind": r.kind,
                "namespace": r.namespace,
                "name": r.name,
                "workload": r.workload,
                "verdict": r.verdict,
                "findings": [_finding(f) for f in r.findings],
            }
            for r in result.results
            if r.findings
        ],
        "unreadable": [
            {"kind": u.kind, "namespace": u.namespace, "name": u.name, "reason": u.reason} for u in result.unreadable
        ],
    }


def _finding(f: Any) -> dict[str, str]:
    out = {"rule": f.rule, "result": f.result, "message": f.message}
    if f.exception:
        out["exception"] = f.exception
    return out


def print_table(result: Any, written: int | None) -> None:
    rows = [
        (f.result.upper(), r.kind, f"{r.namespace}/{r.name}", f.rule, f.message.split(": ", 1)[-1])
        for r in result.results
        for f in r.findings
    ]
    if rows:
        widths = [max(len(row[i]) for row in [("RESULT", "KIND", "OBJECT", "RULE", ""), *rows]) for i in range(4)]
        header = ("RESULT", "KIND", "OBJECT", "RULE", "MESSAGE")
        for row in [header, *rows]:
            print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4])
    c = result.counts()
    print(
        f"{len(result.results)} objects judged: {c['fail']} fail, {c['warn']} warn, {c['skip']} excepted, "
        f"{c['error']} error, {c['pass']} pass; {result.owned} judged through their controller, "
        f"{len(result.unreadable)} unreadable (skipped); {result.requests} API requests in {result.seconds:.1f} s; "
        f"policy {result.policy_source}" + (f"; {written} reports written" if written is not None else "")
    )
