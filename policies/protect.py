"""Who may turn rules down for a whole namespace: the `gpu-admission.io/enforcement` label is guarded like
GPUPolicyExceptions (docs/deploy.md, "Exceptions and the enforcement label").

RBAC grants `update namespaces` whole, label by label it cannot tell; the webhook judges a Namespace CREATE or
UPDATE from the request's userInfo. Pure: labels and groups in, a denial message (or None) out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from policies.userkeys import ENFORCEMENT, MODES

# Always trusted, whatever the configured groups: cluster admins, and the controllers of kube-system (the
# namespace controller and friends), so the label can never lock the cluster. The webhook's matchConditions
# skip these too, so they work even while the webhook is down.
ALWAYS_TRUSTED = ("system:masters", "system:serviceaccounts:kube-system")
DEFAULT_GROUP = "gpu-admission:exception-approvers"


def _label(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    value = labels.get(ENFORCEMENT) if isinstance(labels, Mapping) else None
    return value if isinstance(value, str) else None


def enforcement_change(
    obj: Any, old: Any, groups: Collection[str], trusted: Collection[str] = (DEFAULT_GROUP,)
) -> str | None:
    """None when the request may go on; else a one-line denial. `old` is None on CREATE."""
    new_value, old_value = _label(obj), _label(old)
    if new_value == old_value:
        return None
    allowed = set(ALWAYS_TRUSTED) | set(trusted)
    if allowed.isdisjoint(groups):
        return (
            f"changing namespace label {ENFORCEMENT} ({_shown(old_value)} to {_shown(new_value)}) needs membership "
            f"of group {' or '.join(sorted(set(trusted)))} (or system:masters). Fix: ask the platform team, or "
            "request a GPUPolicyException for the workload and rule at stake"
        )
    if new_value is not None and new_value not in MODES:
        return f"metadata.labels[{ENFORCEMENT}]: Unsupported value: {new_value!r}: supported values: {', '.join(MODES)}"
    return None


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)
