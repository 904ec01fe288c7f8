"""Policy exceptions: a reviewed, time-boxed exemption of named workloads in one namespace from named rules.

A `GPUPolicyException` (group gpu-admission.io, CRD in deploy/base/exceptions-crd.yaml) is read here from its
plain JSON, into a frozen `Exemption` the engine can apply; `parse` reports what is wrong with a field path, as
the API server does. Pure: the caller passes the current time (the engine never reads a clock).

What an exception matches (docs/policy.md, "Exceptions"):
- its own namespace only;
- `spec.workloads.names`: the object's name, or for a pod the workload that owns it (the job-name label its
  controller sets, an owner's name, a Deployment's name through its ReplicaSet's pod-template-hash);
- `spec.workloads.selector`: a label selector on pod labels (a pod's own, a workload's pod templates'), so
  the workload and the pods its controller creates are matched alike. Names and selector together: both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from policies.document import RULE_IDS
from policies.selectors import expression_matches
from policies.workloads import POD_JOB_LABELS, Json, effective_kind, templates

GROUP = "gpu-admission.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPUPolicyException"
PLURAL = "gpupolicyexceptions"

# Bounds, the same in the CRD schema (tests/test_exceptions.py compares them).
MAX_RULES = len(RULE_IDS)
MAX_NAMES = 64
MAX_EXPRESSIONS = 16
MAX_VALUES = 64
MAX_LABELS = 32
MAX_TEXT = 1024  # reason
MAX_WHO = 253  # requester, approver
MAX_DAYS = 366  # the longest an exception may run, from its creation (checked by the webhook at apply)
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # DNS-1123 subdomain (workload names)
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


@dataclass(frozen=True)
class Selector:
    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Mapping[str, Any], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            expression_matches(e, labels) for e in self.expressions
        )


@dataclass(frozen=True)
class Exemption:
    """One parsed exception. `until` is Unix seconds."""

    namespace: str
    name: str
    rules: frozenset[str]
    names: frozenset[str]
    selector: Selector | None
    until: float
    until_text: str
    reason: str
    requester: str
    approver: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def expired(self, now: float) -> bool:
        return now >= self.until

    def covers(self, rule: str, obj: Json, namespace: str) -> bool:
        """Whether this exception names `rule` and matches `obj` (in `namespace`), expired or not."""
        if rule not in self.rules or namespace != self.namespace:
            return False
        if self.names and not (workload_names(obj) & self.names):
            return False
        return self.selector is None or any(self.selector.matches(lbl) for lbl in pod_labels(obj))


class ExceptionError(ValueError):
    """What is wrong with an exception object: one `field.path: problem` per entry of `errors`."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


def is_exception(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("kind") == KIND and str(obj.get("apiVersion", "")).startswith(GROUP + "/")


def parse(obj: Any, *, namespace: str = "") -> Exemption:
    """An Exemption from a GPUPolicyException object, or ExceptionError listing every bad field."""
    errors: list[str] = []
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    ns = meta.get("namespace") or namespace or "default"
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        errors.append("metadata.name: Required value")
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(spec, dict):
        raise ExceptionError([*errors, "spec: Required value"])
    rules = _rules(spec.get("rules"), errors)
    names, selector = _workloads(spec.get("workloads"), errors)
    until, until_text = _until(spec.get("until"), errors)
    reason = _text(spec, "reason", MAX_TEXT, errors)
    requester = _text(spec, "requester", MAX_WHO, errors)
    approver = _text(spec, "approver", MAX_WHO, errors)
    if requester and approver and requester == approver:
        errors.append(f"spec.approver: Invalid value: {approver!r}: must differ from spec.requester")
    if errors:
        raise ExceptionError(errors)
    return Exemption(str(ns), str(name), rules, names, selector, until, until_text, reason, requester, approver)


def check_until(e: Exemption, now: float, created: float | None = None) -> list[str]:
    """What the webhook adds at apply (the CRD's CEL has no clock): `until` in the future, and at most
    MAX_DAYS after `created` (now for a new object)."""
    start = now if created is None else created
    if e.until <= now:
        return [f"spec.until: Invalid value: {e.until_text!r}: must be in the future"]
    if e.until - start > MAX_DAYS * 86400:
        return [f"spec.until: Invalid value: {e.until_text!r}: must be at most {MAX_DAYS} days after creation"]
    return []


def _rules(raw: Any, errors: list[str]) -> frozenset[str]:
    if not isinstance(raw, list) or not raw:
        errors.append("spec.rules: Required value: name at least one rule id")
        return frozenset()
    if len(raw) > MAX_RULES:
        errors.append(f"spec.rules: Too many: {len(raw)}: must have at most {MAX_RULES} items")
    for i, r in enumerate(raw):
        if r not in RULE_IDS:
            errors.append(f"spec.rules[{i}]: Unsupported value: {r!r}: supported values: {', '.join(RULE_IDS)}")
    return frozenset(r for r in raw if isinstance(r, str))


def _workloads(raw: Any, errors: list[str]) -> tuple[frozenset[str], Selector | None]:
    if not isinstance(raw, dict):
        errors.append("spec.workloads: Required value: names and/or selector")
        return frozenset(), None
    names = _names(raw.get("names"), errors)
    selector = _selector(raw.get("selector"), errors) if "selector" in raw else None
    if not names and selector is None:
        errors.append("spec.workloads: Invalid value: must name workloads or give a selector")
    return names, selector


def _names(raw: Any, errors: list[str]) -> frozenset[str]:
    if raw is None:
        return frozenset()
    if not isinstance(raw, list):
        errors.append("spec.workloads.names: Invalid value: must be a list of names")
        return frozenset()
    if len(raw) > MAX_NAMES:
        errors.append(f"spec.workloads.names: Too many: {len(raw)}: must have at most {MAX_NAMES} items")
    for i, n in enumerate(raw):
        if not isinstance(n, str) or len(n) > 253 or not _NAME.match(n):
            errors.append(f"spec.workloads.names[{i}]: Invalid value: {n!r}: must be a DNS-1123 name")
    return frozenset(n for n in raw if isinstance(n, str))


def _selector(raw: Any, errors: list[str]) -> Selector | None:
    where = "spec.workloads.selector"
    if not isinstance(raw, dict):
        errors.append(f"{where}: Invalid value: must be a label selector")
        return None
    labels = raw.get("matchLabels") or {}
    exprs = raw.get("matchExpressions") or []
    if not isinstance(labels, dict):
        errors.append(f"{where}.matchLabels: Invalid value: must be a map of label keys to values")
        labels = {}
    if len(labels) > MAX_LABELS:
        errors.append(f"{where}.matchLabels: Too many: {len(labels)}: must have at most {MAX_LABELS} items")
    for k, v in labels.items():
        _label_key(k, f"{where}.matchLabels", errors)
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v):
            errors.append(f"{where}.matchLabels[{k}]: Invalid value: {v!r}: must be a label value")
    if not isinstance(exprs, list):
        errors.append(f"{where}.matchExpressions: Invalid value: must be a list")
        exprs = []
    if len(exprs) > MAX_EXPRESSIONS:
        errors.append(f"{where}.matchExpressions: Too many: {len(exprs)}: must have at most {MAX_EXPRESSIONS} items")
    for i, e in enumerate(exprs):
        _expression(e, f"{where}.matchExpressions[{i}]", errors)
    if not labels and not exprs:
        errors.append(f"{where}: Invalid value: an empty selector would match every workload")
    return Selector(
        tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        tuple(e for e in exprs if isinstance(e, dict)),
    )


def _expression(e: Any, where: str, errors: list[str]) -> None:
    if not isinstance(e, dict):
        errors.append(f"{where}: Invalid value: must be a requirement (key, operator, values)")
        return
    _label_key(e.get("key"), f"{where}.key", errors, field=True)
    op = e.get("operator")
    values = e.get("values") or []
    if op not in OPERATORS:
        errors.append(f"{where}.operator: Unsupported value: {op!r}: supported values: {', '.join(OPERATORS)}")
    if not isinstance(values, list) or len(values) > MAX_VALUES:
        errors.append(f"{where}.values: Invalid value: must be a list of at most {MAX_VALUES} label values")
        return
    if op in ("In", "NotIn") and not values:
        errors.append(f"{where}.values: Required value: must be specified when operator is {op}")
    if op in ("Exists", "DoesNotExist") and values:
        errors.append(f"{where}.values: Forbidden: may not be specified when operator is {op}")
    for j, v in enumerate(values):
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v):
            errors.append(f"{where}.values[{j}]: Invalid value: {v!r}: must be a label value")


def _label_key(k: Any, where: str, errors: list[str], *, field: bool = False) -> None:
    prefix, _, name = k.rpartition("/") if isinstance(k, str) else ("", "", "")
    if not isinstance(k, str) or len(prefix) > 253 or len(name) > 63 or not _LABEL_KEY.match(k):
        path = where if field else f"{where}[{k}]"
        errors.append(f"{path}: Invalid value: {k!r}: must be a label key")


def _until(raw: Any, errors: list[str]) -> tuple[float, str]:
    if not isinstance(raw, str) or not raw:
        errors.append("spec.until: Required value: an RFC 3339 date-time")
        return 0.0, ""
    try:
        t = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw)
    except ValueError:
        errors.append(f"spec.until: Invalid value: {raw!r}: must be an RFC 3339 date-time")
        return 0.0, raw
    if t.tzinfo is None or "T" not in raw.upper():
        errors.append(f"spec.until: Invalid value: {raw!r}: must be an RFC 3339 date-time with a time zone")
        return 0.0, raw
    return t.astimezone(UTC).timestamp(), raw


def _text(spec: Json, key: str, limit: int, errors: list[str]) -> str:
    value = spec.get(key)
    if not isinstance(value, str) or not value.strip():
        errors.append(f"spec.{key}: Required value")
        return ""
    if len(value) > limit:
        errors.append(f"spec.{key}: Too long: may not be more than {limit} characters")
    return value


# -- what a workload or pod is called and labelled ----------------------------------------------------------


def workload_names(obj: Json) -> frozenset[str]:
    """The names an exception's `names` may match: the object's own, and for a pod its workload's."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    out = {meta.get("name")}
    if effective_kind(obj) == "Pod":
        labels = meta.get("labels")
        labels = labels if isinstance(labels, dict) else {}
        out.update(labels.get(k) for k in POD_JOB_LABELS)
        hash_ = labels.get("pod-template-hash")
        owners = meta.get("ownerReferences")
        for owner in owners if isinstance(owners, list) else ():
            owner_name = owner.get("name") if isinstance(owner, dict) else None
            out.add(owner_name)
            # A Deployment's ReplicaSet is called <deployment>-<pod-template-hash>.
            if isinstance(owner_name, str) and isinstance(hash_, str) and owner_name.endswith("-" + hash_):
                out.add(owner_name[: -len(hash_) - 1])
    return frozenset(n for n in out if isinstance(n, str) and n)


def pod_labels(obj: Json) -> list[Mapping[str, str]]:
    """The label sets a selector is matched against: a pod's own, or each pod template's of a workload."""
    out: list[Mapping[str, str]] = []
    for t in templates(obj):
        meta = t.pod.get("metadata")
        labels = meta.get("labels") if isinstance(meta, dict) else None
        out.append(labels if isinstance(labels, dict) else {})
    return out


# -- the per-namespace index the server and `check` hand to the engine -------------------------------------


def index(exemptions: Iterable[Exemption]) -> dict[str, tuple[Exemption, ...]]:
    """Namespace -> its exceptions, sorted by name (a review reads one namespace's, never all)."""
    out: dict[str, list[Exemption]] = {}
    for e in exemptions:
        out.setdefault(e.namespace, []).append(e)
    return {ns: tuple(sorted(es, key=lambda e: e.name)) for ns, es in out.items()}
