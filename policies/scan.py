"""Judging what already runs (`gpu-admission scan`): each object as the webhook would judge it on CREATE now,
with the current policy, inventory, namespace labels and exceptions. Pure: objects in, results out; listing
the cluster (paged, rate-limited) and writing reports are the caller's.

Decisions (docs/deploy.md, "Scan"):
- every handled kind is judged as stored, by the validating rules only (as Kyverno's background scans
  judge existing resources): its pods run as stored, so a training job created before the webhook and
  lacking the same-rack constraint `training-rack` would have added is reported by `training-same-rack`;
- an object whose controller (ownerReferences, controller: true) is itself scanned is judged through that
  owner (a Deployment's ReplicaSets and pods, a Job's pods): one finding per thing to fix, not one per pod;
- an object that cannot be read (not a mapping, no name, nested deeper than the parse limit) is counted,
  named and skipped, never judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.document import Policy
from policies.engine import EXCEPTED, Review, ReviewContext, review
from policies.inventory import Inventory
from policies.limits import MAX_DEPTH, json_too_deep
from policies.workloads import ELASTICITY_KINDS, TEMPLATE_KINDS, effective_kind

# OpenReports result values (openreports.io/v1alpha1 Report .results[].result).
PASS, FAIL, WARN, SKIP, ERROR = "pass", "fail", "warn", "skip", "error"


@dataclass(frozen=True)
class Finding:
    rule: str
    result: str  # fail | warn | skip (excepted) | error
    message: str
    exception: str = ""  # the GPUPolicyException behind a skip


@dataclass(frozen=True)
class ObjectResult:
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    workload: str | None
    findings: tuple[Finding, ...]

    @property
    def verdict(self) -> str:
        results = {f.result for f in self.findings}
        for worst in (FAIL, ERROR, WARN, SKIP):
            if worst in results:
                return worst
        return PASS


@dataclass(frozen=True)
class Unreadable:
    kind: str
    namespace: str
    name: str
    reason: str

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}: {self.reason}"


def unreadable(obj: Any, kind: str, where: str) -> Unreadable | None:
    """Why `obj` (listed as `kind`; `where` names its place in the list) cannot be judged, or None."""
    if not isinstance(obj, dict):
        return Unreadable(kind, "", where, "not an object")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta.get("name"):
        return Unreadable(kind, "", where, "no metadata.name")
    ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) else ""
    if json_too_deep(obj):
        return Unreadable(kind, str(ns), meta["name"], f"nested deeper than {MAX_DEPTH} levels")
    return None


def owned_by_scanned(obj: Mapping[str, Any], scanned_kinds: Iterable[str]) -> bool:
    """Whether the object's controller is of a kind the scan judges (then it is judged through its owner)."""
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    kinds = set(scanned_kinds)
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, dict) and owner.get("controller") is True and owner.get("kind") in kinds:
            return True
    return False


def judged(obj: Mapping[str, Any]) -> bool:
    return effective_kind(dict(obj)) in TEMPLATE_KINDS | ELASTICITY_KINDS


def judge(obj: dict[str, Any], *, policy: Policy, inventory: Inventory, ctx: ReviewContext) -> ObjectResult:
    """One object's findings: the validating rules on the object as stored."""
    r = review(obj, policy=policy, inventory=inventory, ctx=ctx, mutate=False)
    return result_of(obj, r)


def result_of(obj: dict[str, Any], r: Review) -> ObjectResult:
    meta = obj.get("metadata") or {}
    excepted = dict(r.excepted)
    findings = []
    for res in r.results:
        if res.outcome == "deny":
            findings.append(Finding(res.rule, FAIL, _one_line(res.message)))
        elif res.outcome == "warn":
            findings.append(Finding(res.rule, WARN, _one_line(res.message)))
        elif res.outcome == EXCEPTED:
            findings.append(Finding(res.rule, SKIP, _one_line(res.message), excepted.get(res.rule, "")))
        elif res.outcome == "error":
            findings.append(Finding(res.rule, ERROR, _one_line(res.message)))
    return ObjectResult(
        api_version=str(obj.get("apiVersion") or ""),
        kind=str(obj.get("kind") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        workload=r.workload,
        findings=tuple(findings),
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())
