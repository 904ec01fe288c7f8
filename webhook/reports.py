"""Scan results as OpenReports `Report` objects (openreports.io/v1alpha1, the successor of wg-policy's
wgpolicyk8s.io/v1alpha2 PolicyReport, written by Kyverno >= 1.15 and Kubewarden's audit scanner).

One Report named `gpu-admission` per namespace scanned, labelled `app.kubernetes.io/managed-by: gpu-admission`.
It lists what needs attention (fail, warn, error, and skip for what an exception let through) and counts the
passing objects in `summary.pass` without listing them, and holds at most MAX_RESULTS results
(`configuration.limits`): report objects flooding etcd is a known pain of peers (Kyverno's reports by the
million). A namespace with nothing judged any more loses its report.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from cluster.kubeclient import KubeClient, KubeError
from policies import scan as scan_mod

GROUP_VERSION = "openreports.io/v1alpha1"
PLURAL = "reports"
NAME = "gpu-admission"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-admission"}
MAX_RESULTS = 1000
SHOWN = (scan_mod.FAIL, scan_mod.WARN, scan_mod.ERROR, scan_mod.SKIP)
CATEGORY = "AI scheduling"
SEVERITY = {scan_mod.FAIL: "high", scan_mod.ERROR: "high", scan_mod.WARN: "medium", scan_mod.SKIP: "info"}


class ReportError(Exception):
    """Reports could not be written: one line."""


def build(namespace: str, results: Iterable[scan_mod.ObjectResult], policy_hash: str, now: float) -> dict[str, Any]:
    summary = {v: 0 for v in (scan_mod.PASS, scan_mod.FAIL, scan_mod.WARN, scan_mod.ERROR, scan_mod.SKIP)}
    entries: list[dict[str, Any]] = []
    stamp = {"seconds": int(now), "nanos": int(now % 1 * 1e9)}
    for r in results:
        if not r.findings:
            summary[scan_mod.PASS] += 1
        for f in r.findings:
            summary[f.result] += 1
            if len(entries) >= MAX_RESULTS:
                continue
            properties = {"workload": r.workload or "-", "policyHash": policy_hash}
            if f.exception:
                properties["exception"] = f.exception
            resource = {"apiVersion": r.api_version, "kind": r.kind, "namespace": r.namespace, "name": r.name}
            if r.uid:
                resource["uid"] = r.uid
            entries.append(
                {
                    "source": "gpu-admission",
                    "policy": "gpu-admission",
                    "rule": f.rule,
                    "result": f.result,
                    "severity": SEVERITY[f.result],
                    "category": CATEGORY,
                    "scored": True,
                    "message": f.message,
                    "timestamp": stamp,
                    "resources": [resource],
                    "properties": properties,
                }
            )
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "Report",
        "metadata": {"name": NAME, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "configuration": {"limits": {"maxResults": MAX_RESULTS, "statusFilter": list(SHOWN)}},
        "summary": summary,
        "results": entries,
    }


def write(client: KubeClient, results: list[scan_mod.ObjectResult], policy_hash: str, now: float | None = None) -> int:
    """Create or replace one Report per namespace with judged objects; delete ours elsewhere. The number of
    reports written."""
    when = time.time() if now is None else now
    by_ns: dict[str, list[scan_mod.ObjectResult]] = {}
    for r in results:
        by_ns.setdefault(r.namespace, []).append(r)
    base = f"/apis/{GROUP_VERSION}"
    try:
        existing = client.list(f"{base}/{PLURAL}", labelSelector="app.kubernetes.io/managed-by=gpu-admission")
    except KubeError as exc:
        if exc.not_found:
            raise ReportError(
                f"{GROUP_VERSION} Report is not served: install the OpenReports CRDs first (docs/deploy.md, Scan)"
            ) from None
        raise ReportError(f"cannot list reports: {exc}") from None
    for item in existing.get("items") or []:
        meta = item.get("metadata") or {}
        if meta.get("name") == NAME and meta.get("namespace") not in by_ns:
            _call(client.delete, f"{base}/namespaces/{meta.get('namespace')}/{PLURAL}/{NAME}")
    for ns, rs in sorted(by_ns.items()):
        report = build(ns, rs, policy_hash, when)
        path = f"{base}/namespaces/{ns}/{PLURAL}"
        try:
            current = client.get(f"{path}/{NAME}")
        except KubeError as exc:
            if not exc.not_found:
                raise ReportError(f"cannot read report {ns}/{NAME}: {exc}") from None
            _call(client.create, path, report)
            continue
        report["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
        _call(client.update, f"{path}/{NAME}", report)
    return len(by_ns)


def _terminating(exc: KubeError) -> bool:
    return exc.status == 403 and "being terminated" in str(exc)


def _call(fn: Any, *args: Any) -> None:
    """A write, with fieldValidation=Strict: a field the Report schema does not know is an error from the API
    server, never silently pruned."""
    try:
        if fn.__name__ == "delete":
            fn(*args)
        else:
            fn(*args, field_validation="Strict")
    except KubeError as exc:
        if _terminating(exc) or (fn.__name__ == "delete" and exc.not_found):
            return  # a namespace on its way out: nothing to report there
        raise ReportError(f"cannot write report ({args[0]}): {exc}") from None
