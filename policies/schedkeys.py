"""Topology keys of the topology-aware schedulers, honoured only where each scheduler reads them.

A key on the wrong object is ignored by its scheduler, so it must neither count as a same-domain constraint
(it would suppress training-rack and pass training-same-rack) nor go unmentioned:
- Kueue reads `kueue.x-k8s.io/podset-*-topology` from the pod template of each PodSet (for a plain Pod, the
  pod itself), never from the workload's own metadata (kueue apis/kueue/v1beta2/topology_types.go).
- KAI reads `kai.scheduler/topology-required-placement` / `-preferred-placement` from the top owner's
  annotations (its PodGrouper, default_grouper.go), together with `kai.scheduler/topology`, the name of the
  Topology those levels belong to; without it there is no topology to place by.
- Volcano's hard network topology confines a job to one HyperNode of tier `highestTierAllowed` or lower
  (tier 1 is the one nearest the nodes; `volcano.sh/network-topology-highest-tier` for plain workloads). It
  keeps the job within one domain of the level a tier stands for, and nothing when the tier is unset.
  Decision: tier t stands for the t-th detected topology level (narrowest first), so the tier counts as a
  constraint at the job's level when t is at most that level's position.
"""

from __future__ import annotations

from typing import Any

from policies.subject import Pod, Subject, meta_map

KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFIX = "kueue.x-k8s.io/podset-"
KAI_TOPOLOGY = "kai.scheduler/topology"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
KAI_KEYS = (KAI_TOPOLOGY, KAI_REQUIRED, "kai.scheduler/topology-preferred-placement")
VOLCANO_MODE = "volcano.sh/network-topology-mode"
VOLCANO_TIER = "volcano.sh/network-topology-highest-tier"


def _is_template(s: Subject, p: Pod) -> bool:
    return p.pod is not s.obj


def kueue_required(s: Subject, p: Pod) -> str | None:
    """The node label Kueue keeps this pod's PodSet in, read where Kueue reads it."""
    value = meta_map(p.pod, "annotations").get(KUEUE_REQUIRED)
    return value if isinstance(value, str) and value else None


def workload_topology(s: Subject, p: Pod) -> str | None:
    """The node label Kubernetes' Workload API keeps the job's pods in: a Job's `spec.scheduling` topology
    constraint, or (when the policy says the cluster runs it) any pod of a PodGroup, whose group carries the
    Job's constraint. Reading a pod's PodGroup would need the API: the Job it came from was judged at apply."""
    if s.kind == "Job":
        cons = _job_constraints(s)
        topo = cons.get("topology") if isinstance(cons, dict) else None
        keys = [t.get("key") for t in topo if isinstance(t, dict)] if isinstance(topo, list) else []
        return next((k for k in keys if isinstance(k, str) and k), None)
    group = p.spec.get("schedulingGroup")
    if s.policy.gang_workload and isinstance(group, dict) and group.get("podGroupName"):
        return WORKLOAD_GROUP
    return None


def has_job_constraints(s: Subject) -> bool:
    """A Job whose `spec.scheduling` carries the user's own schedulingConstraints (the Workload API's gang)."""
    return s.kind == "Job" and _job_constraints(s) is not None


def _job_constraints(s: Subject) -> Any:
    spec = s.obj.get("spec")
    sched = spec.get("scheduling") if isinstance(spec, dict) else None
    return sched.get("schedulingConstraints") if isinstance(sched, dict) else None


# Stands for "the PodGroup's own constraint" (a pod of a PodGroup): counts as at any level.
WORKLOAD_GROUP = "\x00podgroup"


def kai_required(s: Subject) -> str | None:
    """The level KAI keeps the workload in: the top owner's required placement, with its Topology named."""
    ann = meta_map(s.obj, "annotations")
    value = ann.get(KAI_REQUIRED)
    return value if isinstance(value, str) and value and ann.get(KAI_TOPOLOGY) else None


def _volcano(s: Subject, p: Pod) -> tuple[str | None, Any]:
    """(mode, highest tier) from a VolcanoJob's spec.networkTopology, else the pod's or object's annotations."""
    spec = s.obj.get("spec")
    nt = spec.get("networkTopology") if s.kind == "VolcanoJob" and isinstance(spec, dict) else None
    if isinstance(nt, dict):
        return nt.get("mode"), nt.get("highestTierAllowed")
    for src in (p.pod, s.obj):
        ann = meta_map(src, "annotations")
        if ann.get(VOLCANO_MODE):
            return ann.get(VOLCANO_MODE), ann.get(VOLCANO_TIER)
    return None, None


def _tier(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if raw >= 1 else None
    return int(raw) if isinstance(raw, str) and raw.isascii() and raw.isdigit() and int(raw) >= 1 else None


def volcano_confines(s: Subject, p: Pod, level_index: int | None) -> bool:
    """Volcano's hard mode keeps the job in one domain at the job's level (index into inventory.levels)."""
    mode, raw = _volcano(s, p)
    tier = _tier(raw)
    if mode != "hard" or tier is None:
        return False
    return level_index is None or tier <= level_index + 1


def uses_topology_scheduler(s: Subject, p: Pod) -> bool:
    """Kueue TAS, KAI, Volcano network topology or the Workload API's topology constraint asked for where the
    scheduler reads it."""
    kueue = any(k.startswith(KUEUE_PREFIX) and k.endswith("topology") for k in meta_map(p.pod, "annotations"))
    kai = bool(meta_map(s.obj, "annotations").get(KAI_TOPOLOGY))
    return kueue or kai or _volcano(s, p)[0] in ("hard", "soft") or workload_topology(s, p) is not None


def misplaced(s: Subject) -> list[str]:
    """One line per scheduler whose keys sit where it does not read them, saying where they belong."""
    out = []
    own = meta_map(s.obj, "annotations")
    if s.kind != "Pod" and any(k.startswith(KUEUE_PREFIX) and k.endswith("topology") for k in own):
        out.append(f"Kueue reads kueue.x-k8s.io/podset-*-topology from pod templates, not the {s.kind}")
    if s.kind != "Pod" and {
        k for p in s.pods if _is_template(s, p) for k in meta_map(p.pod, "annotations") if k in KAI_KEYS
    } - set(own):
        out.append(f"KAI reads kai.scheduler/topology* from the {s.kind}, not its pod templates")
    placement = own.get(KAI_REQUIRED) or own.get("kai.scheduler/topology-preferred-placement")
    if placement and not own.get(KAI_TOPOLOGY):
        out.append(f"KAI placement annotations need {KAI_TOPOLOGY} (the name of the Topology)")
    if any(_volcano(s, p)[0] == "hard" and _tier(_volcano(s, p)[1]) is None for p in s.pods):
        out.append("Volcano hard network topology without highestTierAllowed confines nothing")
    return out
