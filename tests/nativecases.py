"""What the native-policy tests share, in process (tests/test_native_cel.py) and on the real API server
(tests/e2e/test_native_e2e.py): the policies that fill in the inventory-free mutations, the golden cases the
policies cover, and the webhook's side of each comparison."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from policies import native
from policies.document import Policy
from policies.engine import Review
from policies.workloads import effective_kind

TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "gpu-admission.io/dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
]
# Policies that fill in the inventory-free mutations (the default policy leaves them empty: nothing to add).
MUTATING: dict[str, dict[str, Any]] = {
    "kueue": {
        "gpuNodes": {"tolerations": TOLERATIONS},
        "training": {"schedulerName": "volcano", "queue": {"system": "kueue", "name": "team-a"},
                     "priorityClassName": "training-normal"},
    },
    "volcano": {
        "gpuNodes": {"tolerations": TOLERATIONS[:1]},
        "training": {"queue": {"system": "volcano", "name": "team-b"}, "priorityClassName": "training-low"},
    },
}  # fmt: skip
_QUEUE_KEYS = (*native.QUEUE_LABELS, *native.QUEUE_ANNOTATIONS)


def covered(case: dict[str, Any]) -> bool:
    """A golden case of a kind the native policies match."""
    inp = case["input"]
    return isinstance(inp, dict) and effective_kind(inp) in native.COVERED_KINDS and not case.get("xfail")


def mutating_cases(settings: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], Policy]]:
    """(case id, case, its policy) for each covered golden case, its policy merged with these settings."""
    from tests import test_golden as golden
    from webhook.suite import deep_merge

    for path in golden.case_files():
        case = golden.load_case(path)
        if covered(case):
            case = {**case, "policy": deep_merge(copy.deepcopy(case.get("policy") or {}), settings)}
            yield golden.case_id(path), case, golden.policy_for(case["policy"])


def excepts_native(case: dict[str, Any]) -> bool:
    """The case carries a GPUPolicyException naming a native rule: the policies cannot read exceptions, they
    read the webhook's mark of them (docs/policy.md, "Native policies")."""
    for e in case.get("exceptions") or []:
        rules = ((e or {}).get("spec") or {}).get("rules") or []
        if isinstance(rules, list) and native.NATIVE_RULES & set(map(str, rules)):
            return True
    return False


def native_outcomes(r: Review) -> tuple[dict[str, str], set[str]]:
    """The webhook's verdicts of the native rules: rule -> denial message, and the rules that warned."""
    denied = {d.rule: d.message for d in r.denials if d.rule in native.NATIVE_RULES}
    warned = {x.rule for x in r.results if x.rule in native.NATIVE_RULES and x.outcome == "warn"}
    return denied, warned


def touched(obj: dict[str, Any]) -> Any:
    """What gpu-toleration and scheduler-queue may write, per template and on the object (tolerations as a set:
    the API server's own defaults land before or after ours depending on who mutates first)."""
    from policies.workloads import templates

    def keys(holder: Any) -> dict[str, Any]:
        meta = holder.get("metadata") if isinstance(holder, dict) else None
        out = {}
        for section in ("labels", "annotations"):
            values = meta.get(section) if isinstance(meta, dict) else None
            out.update({k: v for k, v in (values or {}).items() if k in _QUEUE_KEYS})
        return out

    per_template = []
    for t in templates(obj):
        spec = t.pod.get("spec") if isinstance(t.pod.get("spec"), dict) else {}
        tolerations = sorted(json.dumps(x, sort_keys=True) for x in spec.get("tolerations") or [])
        per_template.append((tolerations, spec.get("schedulerName"), spec.get("priorityClassName"), keys(t.pod)))
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    return per_template, keys(obj), spec.get("queue")
