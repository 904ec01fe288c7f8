"""What a policy edit changes, in the operator's words: rules switched, actions changed, pools, settings."""

from __future__ import annotations

from policies.document import Policy

_SETTINGS: tuple[tuple[str, str], ...] = (
    ("failure_mode", "failureMode"),
    ("default_enforcement", "defaultEnforcement"),
    ("rack", "topology.rack"),
    ("levels", "topology.levels"),
    ("training_pool", "training.pool"),
    ("scheduler_name", "training.schedulerName"),
    ("queue_system", "training.queue.system"),
    ("queue_name", "training.queue.name"),
    ("priority_class", "training.priorityClassName"),
    ("topology_schedulers", "training.topologySchedulers"),
    ("warm_pool", "inference.warmPool"),
    ("spread_when_unsatisfiable", "inference.spread.whenUnsatisfiable"),
    ("spread_zones", "inference.spread.zones"),
    ("tolerations", "gpuNodes.tolerations"),
    ("when_no_domain_fits", "placement.whenNoDomainFits"),
    ("reservation_seconds", "placement.reservationSeconds"),
    ("no_pods_grace_seconds", "placement.noPodsGraceSeconds"),
    ("waiting_grace_seconds", "placement.waitingGraceSeconds"),
    ("gang_kueue", "placement.gangSchedulers.kueue"),
    ("gang_volcano", "placement.gangSchedulers.volcano"),
    ("gang_kai_topology", "placement.gangSchedulers.kaiTopology"),
    ("gang_workload", "placement.gangSchedulers.workload"),
    ("comm", "comm"),
)


def describe_changes(old: Policy, new: Policy) -> list[str]:
    out: list[str] = []
    for rule, action in new.rules.items():
        before = old.rules.get(rule)
        if before != action:
            verb = "switched off" if action == "off" else ("switched on" if before == "off" else "changed")
            out.append(f"rule {rule}: {verb} ({before} -> {action})")
    for mid, on in new.mutations.items():
        if old.mutations.get(mid) != on:
            out.append(f"mutation {mid}: {'switched on' if on else 'switched off'}")
    old_pools = {p.name: p for p in old.pools}
    new_pools = {p.name: p for p in new.pools}
    for name in sorted(new_pools.keys() - old_pools.keys()):
        out.append(f"pool {name}: added")
    for name in sorted(old_pools.keys() - new_pools.keys()):
        out.append(f"pool {name}: removed")
    for name in sorted(new_pools.keys() & old_pools.keys()):
        if new_pools[name] != old_pools[name]:
            out.append(f"pool {name}: changed")
    for attr, label in _SETTINGS:
        a, b = getattr(old, attr), getattr(new, attr)
        if a != b:
            out.append(f"{label}: {_show(a)} -> {_show(b)}")
    return out


def _show(value: object) -> str:
    if value == "" or value == () or value == frozenset():
        return "(unset)"
    if isinstance(value, frozenset):  # a set's order is the hash seed's: sorted, the line is the same every run
        value = tuple(sorted(value))
    return repr(value) if not isinstance(value, str) else value
