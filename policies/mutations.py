"""Mutations (spec §5): small functions in a registry, each adding to a pod template what the checklist asks.

Every mutation only ADDS (never overwrites what the user set), is idempotent (it checks for its own earlier
output before adding), and edits the working copy in place; the patch is the diff afterwards. Each returns
True when it changed something.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies import comm, placement, podviews, schedkeys, userkeys
from policies.dra import DeviceClass
from policies.inventory import NodeSet, Offer
from policies.patch import clone
from policies.resources import EXTENDED_PREFIX, GPU
from policies.selectors import required_terms
from policies.subject import (
    METADATA,
    NODE_SELECTION,
    OWN_JOB_LABEL,
    POD_AFFINITY,
    RESOURCES,
    SCHEDULING,
    Pod,
    Subject,
    grouping,
    meta_map,
)
from policies.topology import HOSTNAME, NVLINK_KEYS, ZONE, Level, domain_text, domains_text, kind_of
from policies.workloads import Json, containers, ray_service_selector

MutationFn = Callable[[Subject, Pod], bool]

# Labels controllers add per pod or per revision: never part of a replica-set-wide spread selector.
_PER_POD_LABELS = frozenset(
    {
        "pod-template-hash",
        "controller-revision-hash",
        "statefulset.kubernetes.io/pod-name",
        "apps.kubernetes.io/pod-index",
    }
)


@dataclass(frozen=True)
class Mutation:
    id: str
    fn: MutationFn
    doc: str
    # What it may edit (policies.subject constants): the engine then forgets only what was derived from
    # that. Declaring too little leaves a stale cache; tests/test_engine_cache.py checks every mutation.
    touches: frozenset[str]


def child(parent: Any, key: str, factory: type = dict) -> Any:
    """parent[key], created when missing or null; None when it holds something of another type."""
    if not isinstance(parent, dict):
        return None
    value = parent.get(key)
    if value is None:
        value = factory()
        parent[key] = value
    return value if isinstance(value, factory) else None


def _path(parent: Any, *keys: str, leaf: type = dict) -> Any:
    cur = parent
    for i, key in enumerate(keys):
        cur = child(cur, key, leaf if i == len(keys) - 1 else dict)
        if cur is None:
            return None
    return cur


def add_node_expressions(pod: Json, exprs: tuple[Json, ...] | list[Json]) -> bool:
    """AND the expressions into every required nodeSelectorTerm (creating one term when there are none)."""
    if _has_node_expressions(pod, exprs):
        return False  # the common case (a pod of a mutated template), read without creating anything
    spec = child(pod, "spec")
    terms = _path(
        spec,
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
        leaf=list,
    )
    if terms is None:
        return False
    # Every expression added is a fresh copy: two terms, two pods or a module constant must never share a list.
    if not terms:
        terms.append({"matchExpressions": [clone(e) for e in exprs]})
        return True
    changed = False
    for term in terms:
        if not isinstance(term, dict):
            continue
        existing = child(term, "matchExpressions", list)
        if existing is None:
            continue
        for e in exprs:
            if e not in existing:
                existing.append(clone(e))
                changed = True
    return changed


def _has_node_expressions(pod: Json, exprs: tuple[Json, ...] | list[Json]) -> bool:
    """Every required nodeSelectorTerm (at least one) already has every expression."""
    terms = required_terms(pod)
    if not terms:
        return False
    for term in terms:
        existing = term.get("matchExpressions") if isinstance(term, dict) else None
        if not isinstance(existing, list) or any(e not in existing for e in exprs):
            return False
    return True


def _add_to_list(pod: Json, keys: tuple[str, ...], item: Json) -> bool:
    target = _path(child(pod, "spec"), *keys, leaf=list)
    if target is None or item in target:
        return False
    target.append(item)
    return True


# --- the mutations -------------------------------------------------------------------------------------


def gpu_memory_class(s: Subject, p: Pod) -> bool:
    """gpu-memory-class: where a DRA driver publishes the GPUs, a container asking exactly one `nvidia.com/gpu` in
    a pod annotated with `gpu-admission.io/gpu-memory` gets `deviceclass.resource.kubernetes.io/<class>: 1` of the
    best-fit DeviceClass `gpu-admission policy deviceclasses` generated: the MIG profile, or the whole-GPU memory
    tier, whose devices the slices offer (checklist 3: the smallest slice that fits). A device-plugin offer that
    fits as well keeps the pod on gpu-slice's path."""
    tiers = s.inventory.classes.tiers  # first: on a cluster without them (most) nothing else is read
    if not tiers:
        return False
    ask = p.keys.gpu_memory
    if ask is None or s.inventory.empty or not settable(p, "containers"):
        return False
    online = p.workload == "inference" and p.latency == "online"
    cls = choose_class(p.candidates(s.inventory), tiers, ask, allow_shared=not online)
    if cls is None:
        return False
    return _swap_gpu(p, EXTENDED_PREFIX + cls.name)


def gpu_slice(s: Subject, p: Pod) -> bool:
    """gpu-slice: a container asking for exactly one `nvidia.com/gpu` in a pod annotated with
    `gpu-admission.io/gpu-memory` gets the smallest GPU slice that covers the ask (MIG mixed resource,
    a single-strategy or time-sliced node's `nvidia.com/gpu`, or a whole card), with node affinity to the
    nodes that have it."""
    ask = p.keys.gpu_memory
    if ask is None or s.inventory.empty or not settable(p, "containers"):
        return False
    online = p.workload == "inference" and p.latency == "online"
    best = choose_slice(p.candidates(s.inventory), ask, allow_shared=not online)
    if best is None:
        return False
    offer, nodes = best
    if not _swap_gpu(p, offer.resource):
        return False
    added = add_node_expressions(p.pod, [_select_nodes(nodes)])
    return added or offer.resource != GPU


def _swap_gpu(p: Pod, resource: str) -> bool:
    """Every container whose only `nvidia.com/` ask is one `nvidia.com/gpu` asks `resource` instead (limits and
    requests). Whether any container asks that (gpu-slice still pins a pod whose resource stays nvidia.com/gpu)."""
    eligible = False
    for c in containers(p.pod):
        res = c.get("resources")
        limits = _limits(c)
        if [k for k in limits if isinstance(k, str) and k.startswith("nvidia.com/")] != [GPU]:
            continue
        if str(limits[GPU]) != "1" or not isinstance(res, dict):
            continue
        eligible = True
        if resource != GPU:
            for key in ("limits", "requests"):
                section = res.get(key)
                if isinstance(section, dict) and GPU in section:
                    section[resource] = section.pop(GPU)
    return eligible


def settable(p: Pod, key: str) -> bool:
    """Whether a mutation can set this pod-spec field: a TrainJob reaches its runtime's pods only through
    runtimePatches, which carry scheduling fields alone (podviews.PATCHABLE_SPEC)."""
    return p.template.path != podviews.RUNTIME_PATH or key in podviews.PATCHABLE_SPEC


def choose_slice(nodes: NodeSet, ask: int, allow_shared: bool) -> tuple[Offer, NodeSet] | None:
    """Best fit: the smallest memory covering the ask, then fewest compute slices, then most units.
    A time-sliced unit counts for its fair share of the card (memory / replicas): sharers have no memory
    isolation, so promising more would be a lie. A `+me` profile is never chosen: a memory ask says nothing
    about video decoders, and taking the card's only media engines would block the workload that needs them.
    Reads the index's offer sets, never the nodes."""
    groups = list(nodes.members_of("offer"))
    best: tuple[tuple[int, int, int, str, str, str, int], Offer] | None = None
    for (_, o, mem), _members in groups:
        if (o.kind == "shared" and not allow_shared) or o.profile.endswith("+me") or mem < ask or o.claim_only:
            continue
        key = (mem, o.compute or 99, -o.count, o.resource, o.kind, o.profile, o.memory_bytes)
        if best is None or key < best[0]:
            best = (key, o)
    if best is None:
        return None
    chosen = best[1]
    same = 0
    for (_, o, _), members in groups:
        if _same_offer(o, chosen):
            same |= members.mask
    return chosen, NodeSet(nodes.universe, same)


def choose_class(nodes: NodeSet, tiers: tuple[DeviceClass, ...], ask: int, allow_shared: bool) -> DeviceClass | None:
    """The generated DeviceClass gpu-memory-class asks, or None when a device-plugin offer fits as well (gpu-slice
    keeps it) or no class selects a device that fits. Best fit as choose_slice ranks offers, over the offers gpu-slice
    may use plus the DRA-published ones a class selects: a MIG device by its profile's class; a whole GPU by the
    memory tier of smallest floor that still covers the ask and that the node's GPU reaches (its published
    capacity, not the nominal size: the scheduler compares that)."""
    best: tuple[tuple[int, int, int, int, str], DeviceClass | None] | None = None
    for (_, o, mem), _members in nodes.members_of("offer"):
        if (o.kind == "shared" and not allow_shared) or o.profile.endswith("+me") or mem < ask:
            continue
        cls = _tier_for(o, tiers, ask) if o.dra else None
        if cls is None and o.claim_only:
            continue
        # Ties go to the device-plugin offer (gpu-slice's path unchanged), then to the narrower class.
        key = (mem, o.compute or 99, 0, 0, "") if cls is None else (mem, o.compute or 99, 1, cls.memory, cls.name)
        if best is None or key < best[0]:
            best = (key, cls)
    return best[1] if best is not None else None


def _tier_for(o: Offer, tiers: tuple[DeviceClass, ...], ask: int) -> DeviceClass | None:
    if o.kind == "mig":
        return next((c for c in tiers if c.kind == "mig" and c.profile == o.profile), None)
    if o.kind != "whole":
        return None  # a DRA node labelled time-sliced: sharing under DRA is per claim, not a class
    floors = [c for c in tiers if c.kind == "gpu" and ask <= c.memory <= o.device_memory]
    return min(floors, key=lambda c: (c.memory, c.name)) if floors else None


def _same_offer(a: Offer, b: Offer) -> bool:
    return (a.resource, a.kind, a.memory_bytes, a.profile) == (b.resource, b.kind, b.memory_bytes, b.profile)


def _select_nodes(nodes: NodeSet) -> Json:
    products = sorted(name[1] for name, _ in nodes.members_of("product"))
    if all(products):
        return {"key": "nvidia.com/gpu.product", "operator": "In", "values": products}
    return {"key": HOSTNAME, "operator": "In", "values": sorted(n.name for n in nodes)}


def _limits(c: Json) -> Json:
    res = c.get("resources")
    limits = res.get("limits") if isinstance(res, dict) else None
    return limits if isinstance(limits, dict) else {}


def _plugin_gpus(p: Pod) -> bool:
    """`nvidia.com/gpu` in a container's resources. GPUs claimed through DRA need no node affinity: their
    DeviceClass selects whole GPUs (type == 'gpu') device by device, and sharing is per claim, not per node."""
    for c in p.ask.containers:  # noqa: SIM110 (a loop: 0.1 µs, any() over a generator 0.4)
        if GPU in c.amounts:
            return True
    return False


def training_pool(s: Subject, p: Pod) -> bool:
    """training-pool: training that asks for whole GPUs gets required node affinity to whole-card GPU nodes
    (not MIG, not time-sliced/MPS), or to the policy's training pool (checklist 1: pin training pods)."""
    if p.workload != "training" or p.keys.gpu_memory is not None or not _plugin_gpus(p):
        return False
    pool = s.policy.pool(s.policy.training_pool) if s.policy.training_pool else None
    if pool is None:
        cands = p.candidates(s.inventory).offer_gpu
        if cands and not cands.any_whole_card:
            return False  # pinned to shared/MIG nodes on purpose: adding whole-card affinity would strand it
    if pool is not None:
        exprs = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(pool.node_selector.items())]
        return add_node_expressions(p.pod, exprs)
    return add_node_expressions(p.pod, s.inventory.whole_card_expressions)


def online_exclusive(s: Subject, p: Pod) -> bool:
    """online-exclusive: online inference on whole GPUs gets node affinity away from time-sliced and MPS
    nodes (checklist 3: time-slicing only for latency-insensitive work)."""
    if p.workload != "inference" or p.latency != "online" or not _plugin_gpus(p):
        return False
    if p.candidates(s.inventory).offer_gpu.all_shared:
        return False  # pinned to shared nodes on purpose: online-no-timeslice explains, we don't strand it
    return add_node_expressions(p.pod, s.inventory.not_shared_expressions)


def training_rack(s: Subject, p: Pod) -> bool:
    """training-rack: pods of a multi-pod training job get required podAffinity on the job-identity label
    with topologyKey = the narrowest topology level whose domains can hold the job (NVLink clique, rack,
    then coarser switch levels, then zone), and required node affinity to the domain chosen for the whole
    gang: the best-fit domain that holds it now (pod view), else the domains whose allocatable could
    (checklist 1 and 4: never across switches by accident, never half a gang stranded)."""
    if p.workload != "training" or not s.job.multi_pod or not p.ask.asks_gpu:
        return False
    if s.job.key is None or s.job.value is None or has_rack_constraint(s, p):
        return False
    domain = job_domain(s)
    if domain is None or larger_than_any_rack(s):
        return False  # nothing known to place by, or no domain can hold it (a required one would strand it)
    key = domain[0]
    if s.policy.gang_workload and schedkeys.has_job_constraints(s):
        # The Workload API's gang with the user's own topology: kept, and no podAffinity beside it (upstream: a
        # PodGroup with intra-group pod affinity may find no placement whatever the cluster's state). Coarser
        # than the job's level, training-same-rack says so.
        return False
    if _via_gang_scheduler(s, p, key):
        return True  # all-or-nothing, in its own keys: the scheduler picks the domain, nothing can strand
    decision = s.placement
    if decision is not None and decision.source == placement.NONE_FITS_NOW:
        return _prefer_roomiest(s, p, decision)
    changed = _ensure_job_label(s, p)
    if decision is not None and decision.domain is not None:
        changed |= add_node_expressions(p.pod, [_in(key, [decision.domain])])
        s.pinned = decision
    elif decision is not None and set(decision.eligible) != set(_domains(s, p, key)):
        changed |= add_node_expressions(p.pod, [_in(key, list(decision.eligible))])  # static rule
    if decision is not None and decision.source == placement.STATIC and s.ctx.capacity is not None:
        s.notes.append("placement: pod view not synced yet: domain chosen by allocatable only, not free GPUs")
    term = {"labelSelector": {"matchLabels": {s.job.key: s.job.value}}, "topologyKey": key}
    return (
        _add_to_list(p.pod, ("affinity", "podAffinity", "requiredDuringSchedulingIgnoredDuringExecution"), term)
        or changed
    )


KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KAI_TOPOLOGY = "kai.scheduler/topology"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
KAI_SCHEDULER = "kai-scheduler"


def _via_gang_scheduler(s: Subject, p: Pod, rack: str) -> bool:
    """Where the policy says the job's gang scheduler is set up for topology (placement.gangSchedulers), the
    same-rack constraint goes into that scheduler's keys: Volcano `networkTopology` hard at the level's tier on a
    Volcano Job, Kueue `podset-required-topology` on a queued workload's pod templates, KAI's Topology and
    required placement on the top owner. Never overwrites a value the user set."""
    pol = s.policy
    if pol.gang_workload and s.kind == "Job":
        return _job_scheduling(s, rack)
    if pol.gang_volcano and s.kind == "VolcanoJob":
        spec = child(s.obj, "spec")
        if isinstance(spec, dict) and spec.get("networkTopology") is None:
            # Volcano's tier t is the t-th detected level (policies/schedkeys.py reads it back the same way).
            tier = next((i + 1 for i, lv in enumerate(s.inventory.levels) if lv.key == rack), 1)
            spec["networkTopology"] = {"mode": "hard", "highestTierAllowed": tier}
            return True
        return False
    if pol.gang_kueue and (KUEUE_QUEUE in meta_map(s.obj, "labels") or KUEUE_QUEUE in p.labels()):
        ann = _path(p.pod, "metadata", "annotations")
        if isinstance(ann, dict) and not any(k.startswith("kueue.x-k8s.io/podset-") for k in ann):
            ann[KUEUE_REQUIRED] = rack
            return True
        return False
    kai = p.spec.get("schedulerName") == KAI_SCHEDULER or "kai.scheduler/queue" in meta_map(s.obj, "labels")
    if pol.gang_kai_topology and kai:
        ann = _path(s.obj, "metadata", "annotations")
        if (
            isinstance(ann, dict)
            and KAI_REQUIRED not in ann
            and ann.get(KAI_TOPOLOGY, pol.gang_kai_topology) == pol.gang_kai_topology
        ):
            ann[KAI_TOPOLOGY] = pol.gang_kai_topology
            ann[KAI_REQUIRED] = rack
            return True
    return False


def _job_scheduling(s: Subject, key: str) -> bool:
    """Kubernetes' own gang (1.37 Workload API through the Job's `spec.scheduling`, WorkloadWithJob): all pods or
    none (minCount = parallelism), in one domain of `key` (a PodGroup topology constraint). Instead of
    podAffinity, which upstream warns can make a PodGroup unplaceable. Never overwrites what the user set."""
    spec = child(s.obj, "spec")
    pods = spec.get("parallelism", 1) if isinstance(spec, dict) else 0
    if not isinstance(pods, int) or isinstance(pods, bool) or pods < 2:
        return False
    sched = spec.get("scheduling")
    constraints = {"topology": [{"key": key}]}
    if sched is None:
        spec["scheduling"] = {"schedulingPolicy": {"gang": {"minCount": pods}}, "schedulingConstraints": constraints}
        return True
    if isinstance(sched, dict) and sched.get("schedulingConstraints") is None:
        sched["schedulingConstraints"] = constraints  # the user's own policy (gang or basic) kept as it is
        return True
    return False


def _in(key: str, values: list[str]) -> Json:
    return {"key": key, "operator": "In", "values": sorted(values)}


def _domains(s: Subject, p: Pod, key: str) -> set[str]:
    return {d for n in p.candidates(s.inventory) if n.whole_gpus > 0 and (d := n.labels.get(key))}


def _prefer_roomiest(s: Subject, p: Pod, d: placement.Decision) -> bool:
    """No rack holds the gang now. `prefer`: no required term that could strand half of it; preferred
    affinity to the rack with most free room and to the job's own pods, and a warning. `deny`: nothing here,
    training-same-rack denies with the rack that would fit."""
    if s.policy.when_no_domain_fits != "prefer" or d.roomiest is None or s.job.key is None:
        return False
    changed = _ensure_job_label(s, p)
    node_term = {"weight": 100, "preference": {"matchExpressions": [_in(d.key, [d.roomiest])]}}
    pod_term = {
        "weight": 100,
        "podAffinityTerm": {"labelSelector": {"matchLabels": {s.job.key: s.job.value}}, "topologyKey": d.key},
    }
    changed |= _add_to_list(
        p.pod, ("affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"), node_term
    )
    changed |= _add_to_list(
        p.pod, ("affinity", "podAffinity", "preferredDuringSchedulingIgnoredDuringExecution"), pod_term
    )
    s.notes.append(no_domain_fits_note(s, d))
    return changed


def no_domain_fits_note(s: Subject, d: placement.Decision) -> str:
    """The `prefer` fallback's warning, naming the level the job is kept in (rack, NVLink clique, block...)."""
    level = domain_level(s, d.key)
    noun = domain_text(level, s.inventory.rack_label) if level else "rack"
    factor = _level_factor(s, level)
    # Short (a warning is cut at 120 characters): the factor only; the deny message gives the assumptions.
    cost = f"; all-reduce ≈{factor:.1f}× slower split" if factor else ""
    return f"placement: no {noun} holds the {s.job.gpus}-GPU job now: prefers {d.roomiest} (most room){cost}"


def _level_factor(s: Subject, level: Level | None) -> float | None:
    """How many times slower the job's all-reduce is over two domains of `level` than in one (comm model)."""
    c = s.policy.comm
    gpus = max(s.job.gpus, 2)
    try:
        if level is not None and level.kind == "nvlink":
            return comm.nvlink_domain_penalty(c.message_bytes, gpus, c.bandwidths())
        est = comm.placement_estimate(c.message_bytes, gpus, s.inventory.max_whole_gpus or 8, c.bandwidths())
    except ValueError:
        return None
    return est.cross_rack_penalty


def level_of(s: Subject, key: str | None) -> Level | None:
    return next((lv for lv in s.inventory.levels if key and lv.key == key), None)


def domain_level(s: Subject, key: str | None) -> Level | None:
    """The level of a key a job is kept at (job_domain), None for no key. A ComputeDomain job is kept in one
    NVLink clique even where the clique is no level (not on every whole-card node): its key then reads as a
    level of its kind and unknown size, so messages name cliques and quote what leaving NVLink costs."""
    if not key:
        return None
    return level_of(s, key) or Level(key, kind_of(key), domains=0, largest_gpus=0, nodes=0)


def level_penalty(s: Subject, level: Level | None) -> str:
    """The estimated cost of spreading the job over two domains of `level` (racks when unknown)."""
    per_node = s.inventory.max_whole_gpus or 8
    gpus = max(s.job.gpus, 2)
    kind, across = ("switch", "racks") if level is None else (level.kind, domains_text(level, s.inventory.rack_label))
    try:
        return comm.level_phrase(kind, across, s.policy.comm.message_bytes, gpus, per_node, s.policy.comm.bandwidths())
    except ValueError:
        return ""


def prefers_domain(p: Pod, key: str) -> bool:
    """The pod carries the preferred same-domain podAffinity `_prefer_roomiest` adds."""
    aff = p.spec.get("affinity")
    pa = aff.get("podAffinity") if isinstance(aff, dict) else None
    pref = pa.get("preferredDuringSchedulingIgnoredDuringExecution") if isinstance(pa, dict) else None
    return isinstance(pref, list) and any(
        isinstance(t, dict)
        and isinstance(t.get("podAffinityTerm"), dict)
        and t["podAffinityTerm"].get("topologyKey") == key
        for t in pref
    )


def job_domain(s: Subject) -> tuple[str, frozenset[str]] | None:
    """(topology key, keys at that level or finer) the job is kept in, or None: an NVLink domain for a job
    that claims a ComputeDomain / IMEX channel (it only works inside one), else the narrowest level whose
    largest domain holds the job's whole GPUs. Cached on the subject until a mutation touches resources
    or metadata."""
    if s._domain is False:
        s._domain = _job_domain(s)
    return s._domain if isinstance(s._domain, tuple) else None


def _job_domain(s: Subject) -> tuple[str, frozenset[str]] | None:
    inv = s.inventory
    if inv.nvlink_key and claims_nvlink_domain(s) and not larger_than_any_clique(s):
        i = inv.level_index("nvlink")
        return inv.nvlink_key, inv.level_finer[i] if i is not None else inv.rack_or_finer | {inv.nvlink_key}
    i = inv.level_for(s.job.gpus, s.job.gpus_known)
    return (inv.levels[i].key, inv.level_finer[i]) if i is not None else None


# ComputeDomain channels are claimed through a ResourceClaimTemplate the ComputeDomain names
# (kubernetes-sigs/dra-driver-nvidia-gpu: spec.channel.resourceClaimTemplate; its demos call it
# `<name>-channel` or `imex`), and the documented placement is node affinity `nvidia.com/gpu.clique Exists`.
_CHANNEL_HINTS = ("channel", "imex", "compute-domain", "computedomain")


def larger_than_any_clique(s: Subject) -> bool:
    """A job of more whole GPUs than the largest NVLink clique holds (False when the size or cliques are
    unknown): pinned to one clique it would never bind whole, so it is kept at the level that holds it
    (training-topology-scheduler warns when it claims a ComputeDomain)."""
    largest = s.inventory.nvlink_largest
    return bool(largest) and s.job.gpus_known and s.job.gpus > largest


def claims_nvlink_domain(s: Subject) -> bool:
    for p in s.pods:
        if any(a.channel for a in p.ask.claim_asks()):
            return True  # a claim on the ComputeDomain channel class
        claims = p.spec.get("resourceClaims")
        for c in claims if isinstance(claims, list) else []:
            names = (
                [c.get(k) for k in ("name", "resourceClaimTemplateName", "resourceClaimName")]
                if isinstance(c, dict)
                else []
            )
            if any(isinstance(n, str) and any(h in n.lower() for h in _CHANNEL_HINTS) for n in names):
                return True
        for term in required_terms(p.pod) or []:
            exprs = term.get("matchExpressions") if isinstance(term, dict) else None
            for e in exprs if isinstance(exprs, list) else []:
                if isinstance(e, dict) and e.get("key") in NVLINK_KEYS and e.get("operator") == "Exists":
                    return True
    return False


def larger_than_any_rack(s: Subject) -> bool:
    """A job no domain can hold: counted per node in pod-sized pieces when the gang's pods are known
    (placement's static rule), else whole GPUs against the largest domain of every topology level."""
    d = s.placement
    if d is not None and s.job.sizes:
        return d.source == placement.NEVER_FITS
    inv = s.inventory
    return bool(inv.levels) and s.job.gpus_known and job_domain(s) is None


def training_node_pack(s: Subject, p: Pod) -> bool:
    """training-node-pack: a multi-pod training job that fits on one node prefers one node
    (podAffinity weight 100 on kubernetes.io/hostname): NVLink beats any network. So do the pods of a gang
    training-rack pinned to a domain when they are smaller than a node: packed, they leave whole nodes free,
    as the placement chooser counts the gang's reserved GPUs."""
    if p.workload != "training" or not s.job.multi_pod or s.job.key is None or s.job.value is None:
        return False
    if not s.job.gpus_known:
        return False  # a pod of a job of unknown size: its template (reviewed on apply) decided already
    if not p.ask.asks_gpu or s.inventory.empty or s.job.gpus == 0:
        return False
    packed_pin = s.pinned is not None and 0 < p.ask.whole_gpus < s.inventory.max_whole_gpus
    if s.job.gpus > s.inventory.max_whole_gpus and not packed_pin:
        return False
    changed = _ensure_job_label(s, p)
    term = {
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {s.job.key: s.job.value}},
            "topologyKey": HOSTNAME,
        },
    }
    return (
        _add_to_list(p.pod, ("affinity", "podAffinity", "preferredDuringSchedulingIgnoredDuringExecution"), term)
        or changed
    )


def reserved_keep_off(s: Subject, p: Pod) -> bool:
    """reserved-keep-off: a GPU pod created while the server holds GPUs for other pinned gangs stays off the
    domains where it could take them (the scheduler does not know reservations): required node affinity
    `NotIn` those domains when the pod, with the rest of its job, fits elsewhere now, else only preferred
    (weight 100), so no pod becomes unschedulable that would fit somewhere (checklist 4: never half a gang
    stranded)."""
    held = s.ctx.reservations
    if not held:  # the usual case, first: the engine's budget per pod is tight
        return False
    cap = s.ctx.capacity
    if s.kind != "Pod" or cap is None or not cap.synced or p.ask.whole_gpus <= 0:
        return False
    jid = s.job_id()
    sizes = _unbound_gang(s, p, cap, jid)
    inv, cands = s.inventory, p.candidates(s.inventory)
    changed = False
    for key in sorted({r.key for r in held}):

        def decide(key: str = key) -> tuple[Any, ...]:
            nodes = grouping(inv, cands, key).at(cap)
            return (inv, cands, placement.keep_off(nodes, key, sizes, held, jid))

        # Once per pod-view snapshot for the pods of one job (same key, gang and reservations): memoized.
        k = cap.memo(("keep-off", inv.topology_epoch, key, cands.mask, sizes, held, jid), decide)[2]
        if k is not None:
            changed |= _keep_off(p, k)
    return changed


def only_reserved_gpus(s: Subject, p: Pod, key: str) -> tuple[str, ...]:
    """The reserved domains of `key` when the pod (created now, beside other jobs' reservations) could run
    only on GPUs promised to them (placement.only_reserved); () otherwise, and without a synced pod view."""
    held, cap = s.ctx.reservations, s.ctx.capacity
    if not held or cap is None or not cap.synced or s.kind != "Pod" or p.ask.whole_gpus <= 0:
        return ()
    jid, inv, cands, size = s.job_id(), s.inventory, p.candidates(s.inventory), p.ask.whole_gpus

    def decide() -> tuple[Any, ...]:
        nodes = grouping(inv, cands, key).at(cap)
        return (inv, cands, placement.only_reserved(nodes, key, size, held, jid))

    return cap.memo(("only-reserved", inv.topology_epoch, key, cands.mask, size, held, jid), decide)[2]  # type: ignore[no-any-return]


def _unbound_gang(s: Subject, p: Pod, cap: placement.Capacity, job: str | None) -> tuple[int, ...]:
    """This pod's GPUs, then those of the job's other pods not yet bound (when the job's size is known)."""
    own = p.ask.whole_gpus
    gang = list(s.job.sizes[cap.bound_pods(job) :]) if job is not None and s.job.sizes else []
    if own in gang:
        gang.remove(own)
    return (own, *gang)


def _keep_off(p: Pod, k: placement.KeepOff) -> bool:
    expr = {"key": k.key, "operator": "NotIn", "values": list(k.avoid)}
    if k.required:
        return add_node_expressions(p.pod, [expr])
    term = {"weight": 100, "preference": {"matchExpressions": [expr]}}
    return _add_to_list(p.pod, ("affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"), term)


def later_pods_reservation(s: Subject, jid: str | None) -> placement.Reservation | None:
    """A pod of job `jid`, pinned, created when its job holds no reservation (it expired, or a pod is
    replaced): the job's pods not yet bound are reserved again in the domain the pod is pinned to, so
    reserved-keep-off keeps other pods off their GPUs too."""
    cap = s.ctx.capacity
    if cap is None or s.kind != "Pod" or not cap.synced or jid is None or not s.job.sizes or not s.pods:
        return None
    domain = job_domain(s)
    if domain is None or any(r.job == jid for r in s.ctx.reservations):
        return None
    pinned = pinned_domain(s.pods[0].pod, domain[0])
    rest = s.job.sizes[cap.bound_pods(jid) :]
    if pinned is None or not rest:
        return None
    return placement.Reservation(jid, domain[0], pinned, rest)


def pinned_domain(pod: Json, key: str) -> str | None:
    """The one value every required nodeSelectorTerm of the pod pins `key` to (`key In [value]`), else None."""
    found = set()
    for term in required_terms(pod) or []:
        exprs = term.get("matchExpressions") if isinstance(term, dict) else None
        values = [
            e["values"][0]
            for e in (exprs if isinstance(exprs, list) else [])
            if isinstance(e, dict)
            and e.get("key") == key
            and e.get("operator") == "In"
            and isinstance(e.get("values"), list)
            and len(e["values"]) == 1
            and isinstance(e["values"][0], str)
        ]
        if not values:
            return None
        found.update(values)
    return found.pop() if len(found) == 1 else None


def _ensure_job_label(s: Subject, p: Pod) -> bool:
    """Kinds whose controller sets no job label get ours on the template, so the affinity selector matches."""
    if s.kind == "Pod" or s.job.key != OWN_JOB_LABEL or s.job.value is None:
        return False
    labels = _path(p.pod, "metadata", "labels")
    if not isinstance(labels, dict) or labels.get(OWN_JOB_LABEL) == s.job.value:
        return False
    if OWN_JOB_LABEL in labels:
        return False  # not a string (an invalid label the API server refuses): left alone
    labels[OWN_JOB_LABEL] = s.job.value
    return True


def job_size(s: Subject, p: Pod) -> bool:
    """job-size: an Indexed Job's pod template asking whole GPUs gets `gpu-admission.io/job-gpus` (the
    job's GPUs), so each pod, which carries only its own index, knows its gang: a 1-pod job's pod gets no
    same-rack term, and a multi-pod job's pods can be placed as one gang."""
    if s.kind != "Job" or p.ask.whole_gpus <= 0 or not s.job.gpus_known:
        return False
    spec = s.obj.get("spec")
    if not isinstance(spec, dict) or spec.get("completionMode") != "Indexed":
        return False
    ann = _path(p.pod, "metadata", "annotations")
    if not isinstance(ann, dict) or userkeys.JOB_GPUS in ann:
        return False  # the user's own value wins (the annotations rule judges it)
    ann[userkeys.JOB_GPUS] = str(s.job.gpus)
    return True


def inference_spread(s: Subject, p: Pod) -> bool:
    """inference-spread: inference replicas get topologySpreadConstraints across nodes (and zones when GPU
    nodes carry zones), maxSkew 1 (checklist 2: elastic inference survives the loss of a node). For a
    LeaderWorkerSet the groups are spread (leaders counted), never the pods of one group."""
    if p.workload != "inference" or not p.ask.asks_gpu:
        return False
    selector = _replica_selector(s, p)
    if not selector:
        return False
    when = s.policy.spread_when_unsatisfiable
    if group_of(s, p) is not None and p.template.role.endswith("worker"):
        leader = p.template.role.removesuffix("worker") + "leader"
        if any(q.template.role == leader for q in s.pods):
            return False  # only leaders are counted: the leader template carries the spread
        when = "ScheduleAnyway"  # one template for all: workers must follow their leader, never be held back
    keys = [HOSTNAME] + ([ZONE] if s.policy.spread_zones and s.inventory.zones else [])
    spec = child(p.pod, "spec")
    constraints = child(spec, "topologySpreadConstraints", list)
    if constraints is None:
        return False
    taken = {c.get("topologyKey") for c in constraints if isinstance(c, dict)}
    changed = False
    for key in keys:
        if key in taken:
            continue  # the user's own constraint on this key wins
        constraints.append(
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": when,
                "labelSelector": clone(selector),  # the workload's own selector stays unshared
            }
        )
        changed = True
    return changed


LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"  # the same hash on every pod of one group
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # "0" on the leader
LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def _positive(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def group_of(s: Subject, p: Pod) -> podviews.Group | None:
    """The LeaderWorkerSet group this pod belongs to: a LeaderWorkerSet's own, or the one KServe makes for a
    multi-node LLMInferenceService workload (None: not a group member, or a group whose name is unknown)."""
    if s.kind == "LeaderWorkerSet" and s.name:
        spec = s.obj.get("spec")
        lwt = spec.get("leaderWorkerTemplate") if isinstance(spec, dict) else None
        size = _positive(lwt.get("size", 1) if isinstance(lwt, dict) else 1)
        return podviews.Group(s.name, size, _positive(spec.get("replicas", 1) if isinstance(spec, dict) else 1))
    if s.kind == "LLMInferenceService":
        return podviews.llm_group(s.obj, p.template.role)
    return None


def _group_gpus(s: Subject, p: Pod, group: podviews.Group) -> int:
    """Whole GPUs of one group: every template of the group, its pods per group times its GPUs per pod."""
    prefix = "prefill-" if p.template.role.startswith("prefill-") else ""
    members = [q for q in s.pods if q.template.role.startswith(prefix) and group_of(s, q) == group]
    return sum(q.ask.whole_gpus * _pods_per_group(s, q, group) for q in members)


def _pods_per_group(s: Subject, q: Pod, group: podviews.Group) -> int:
    """A LeaderWorkerSet's group is its leader and size - 1 workers (all `size` workers without a leader
    template) whatever `replicas` says: scaled to zero, its templates count no pod, yet the affinity written now
    holds when it is scaled up (through /scale, which this webhook never sees)."""
    if s.kind == "LeaderWorkerSet":
        if q.template.role == "leader":
            return 1
        has_leader = any(t.template.role == "leader" for t in s.pods)
        return group.size - 1 if has_leader else group.size
    return q.template.replicas // group.groups


def inference_group(s: Subject, p: Pod) -> bool:
    """inference-group: the pods of one multi-node LeaderWorkerSet group (one model replica) get required
    podAffinity to each other (matchLabelKeys on the group key) in one domain of the narrowest topology level
    that holds the group's GPUs: a replica split across zones or fabrics is slow or broken."""
    group = group_of(s, p)
    if group is None or not p.ask.asks_gpu or group.size < 2:
        return False
    if s.kind == "LeaderWorkerSet" and LWS_EXCLUSIVE in meta_map(s.obj, "annotations"):
        return False  # LWS places each group in its own domain of that level already
    i = s.inventory.level_for(_group_gpus(s, p, group), known=True)
    if i is None:
        return False  # no domain can hold a group: a required affinity would strand it
    fine = s.inventory.level_finer[i]
    aff = p.spec.get("affinity")
    pa = aff.get("podAffinity") if isinstance(aff, dict) else None
    req = pa.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(pa, dict) else None
    if isinstance(req, list) and any(isinstance(t, dict) and t.get("topologyKey") in fine for t in req):
        return False  # the user's own same-domain affinity at this level or finer wins
    term = {
        "labelSelector": {"matchLabels": {LWS_NAME: group.name}},
        "matchLabelKeys": [LWS_GROUP_KEY],
        "topologyKey": s.inventory.levels[i].key,
    }
    return _add_to_list(p.pod, ("affinity", "podAffinity", "requiredDuringSchedulingIgnoredDuringExecution"), term)


def _replica_selector(s: Subject, p: Pod) -> Json | None:
    if s.kind in ("Deployment", "StatefulSet", "ReplicaSet"):
        sel = s.obj.get("spec", {}).get("selector") if isinstance(s.obj.get("spec"), dict) else None
        if isinstance(sel, dict) and (sel.get("matchLabels") or sel.get("matchExpressions")):
            return {k: v for k, v in sel.items() if k in ("matchLabels", "matchExpressions")}
        return None
    group = group_of(s, p)
    if group is not None:
        # Spread groups, not the pods of one: count leaders only (inference-group keeps each group together).
        return {"matchLabels": {LWS_NAME: group.name, LWS_WORKER_INDEX: "0"}}
    if s.kind in podviews.SPREAD_KINDS:
        return podviews.replica_selector(s.kind, s.obj, p.template.role)
    if s.kind == "RayService":
        return ray_service_selector(s.obj, p.template.role)
    if s.kind == "Pod":
        meta = p.pod.get("metadata")
        owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
        labels = {k: v for k, v in p.labels().items() if k not in _PER_POD_LABELS and isinstance(v, str)}
        if owners and labels:
            return {"matchLabels": labels}
        return None
    labels = {k: v for k, v in p.labels().items() if k not in _PER_POD_LABELS and isinstance(v, str)}
    return {"matchLabels": labels} if labels else None


def gpu_toleration(s: Subject, p: Pod) -> bool:
    """gpu-toleration: GPU pods get the tolerations for the taints the policy says GPU nodes carry."""
    if not s.policy.tolerations or not p.ask.asks_gpu:
        return False
    changed = False
    for t in s.policy.tolerations:
        changed |= _add_to_list(p.pod, ("tolerations",), t.as_json())
    return changed


def scheduler_queue(s: Subject, p: Pod) -> bool:
    """scheduler-queue: training gets the policy's default schedulerName, queue label and priorityClassName
    (checklist 2: training is queued and prioritised, never crudely scaled)."""
    if p.workload != "training" or not p.ask.asks_gpu:
        return False
    pol = s.policy
    spec = child(p.pod, "spec")
    if spec is None:
        return False
    changed = False
    # The API server defaults schedulerName before webhooks run: "default-scheduler" means "not chosen".
    unchosen = spec.get("schedulerName") in (None, "", "default-scheduler")
    if pol.scheduler_name and unchosen and settable(p, "schedulerName"):
        spec["schedulerName"] = pol.scheduler_name
        changed = True
    if pol.queue_system and not has_queue(s, p):
        changed |= _add_queue(s, p)
    # A bare Pod's priority is resolved by the Priority admission plugin before webhooks run: adding the
    # class afterwards would leave spec.priority wrong, so only templates get it.
    unset = not spec.get("priorityClassName") and settable(p, "priorityClassName")
    if pol.priority_class and s.kind != "Pod" and unset:
        spec["priorityClassName"] = pol.priority_class
        changed = True
    return changed


QUEUE_LABELS = ("kueue.x-k8s.io/queue-name", "kai.scheduler/queue", "volcano.sh/queue-name")
QUEUE_ANNOTATIONS = ("scheduling.volcano.sh/queue-name", "volcano.sh/queue-name")


def has_queue(s: Subject, p: Pod) -> bool:
    for src in (s.obj, p.pod) if p.pod is not s.obj else (s.obj,):
        if not meta_map(src, "labels").keys().isdisjoint(QUEUE_LABELS):
            return True
        if not meta_map(src, "annotations").keys().isdisjoint(QUEUE_ANNOTATIONS):
            return True
    spec = s.obj.get("spec")
    return s.kind == "VolcanoJob" and isinstance(spec, dict) and bool(spec.get("queue"))


def _add_queue(s: Subject, p: Pod) -> bool:
    pol = s.policy
    if pol.queue_system == "kueue":
        # Kueue reads the queue from the workload object's labels (the pod's, for plain pods).
        labels = _path(s.obj, "metadata", "labels")
        if isinstance(labels, dict):
            labels["kueue.x-k8s.io/queue-name"] = pol.queue_name
            return True
        return False
    if pol.queue_system == "kai":
        done = False
        for target in {id(s.obj): s.obj, id(p.pod): p.pod}.values():
            labels = _path(target, "metadata", "labels")
            if isinstance(labels, dict):
                labels["kai.scheduler/queue"] = pol.queue_name
                done = True
        return done
    if s.kind == "VolcanoJob":
        spec = child(s.obj, "spec")
        if isinstance(spec, dict) and not spec.get("queue"):
            spec["queue"] = pol.queue_name
            return True
        return False
    ann = _path(p.pod, "metadata", "annotations")
    if isinstance(ann, dict):
        ann["scheduling.volcano.sh/queue-name"] = pol.queue_name
        return True
    return False


def has_rack_constraint(s: Subject, p: Pod) -> bool:
    """A required topology at rack level or finer is already asked for, by affinity, node selection or a
    topology-aware scheduler's annotation: adding training-rack on top would conflict."""
    # Cached on the pod: training-rack and training-same-rack both ask, once per pod each. Subject.invalidate
    # forgets it after a mutation that touched node selection, pod affinity or metadata.
    if p._rack_constraint is None:
        p._rack_constraint = _rack_constraint(s, p)
    return p._rack_constraint


def _rack_constraint(s: Subject, p: Pod) -> bool:
    domain = job_domain(s)
    fine = domain[1] if domain else s.inventory.rack_or_finer
    spec = p.spec
    if isinstance(spec.get("nodeName"), str) and spec.get("nodeName"):
        return True
    sel = spec.get("nodeSelector")
    if isinstance(sel, dict) and not fine.isdisjoint(sel):
        return True
    terms = required_terms(p.pod)
    if terms and all(_pins_domain(t, fine) for t in terms):
        return True
    aff = spec.get("affinity")
    pa = aff.get("podAffinity") if isinstance(aff, dict) else None
    req = pa.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(pa, dict) else None
    if isinstance(req, list) and any(isinstance(t, dict) and t.get("topologyKey") in fine for t in req):
        return True
    # Scheduler keys count only where their scheduler reads them (policies/schedkeys.py).
    if schedkeys.kueue_required(s, p) in fine or schedkeys.kai_required(s) in fine:
        return True
    workload = schedkeys.workload_topology(s, p)
    if workload is not None and (workload in fine or workload == schedkeys.WORKLOAD_GROUP):
        return True
    level = next((i for i, lv in enumerate(s.inventory.levels) if domain and lv.key == domain[0]), None)
    return schedkeys.volcano_confines(s, p, level)


def _pins_domain(term: Any, fine: frozenset[str]) -> bool:
    if not isinstance(term, dict):
        return False
    exprs = term.get("matchExpressions")
    return isinstance(exprs, list) and any(
        isinstance(e, dict)
        and e.get("key") in fine
        and e.get("operator") == "In"
        and isinstance(e.get("values"), list)
        and len(e["values"]) == 1
        for e in exprs
    )


def _registry() -> tuple[Mutation, ...]:
    fns: tuple[tuple[str, MutationFn, frozenset[str]], ...] = (
        # Order matters: slices are chosen first, so the pool and exclusivity rules see the final resource.
        ("gpu-memory-class", gpu_memory_class, frozenset({RESOURCES})),
        ("gpu-slice", gpu_slice, frozenset({RESOURCES, NODE_SELECTION})),
        ("training-pool", training_pool, frozenset({NODE_SELECTION})),
        ("online-exclusive", online_exclusive, frozenset({NODE_SELECTION})),
        ("training-rack", training_rack, frozenset({POD_AFFINITY, METADATA, NODE_SELECTION})),  # + our job label
        ("training-node-pack", training_node_pack, frozenset({POD_AFFINITY, METADATA})),
        ("reserved-keep-off", reserved_keep_off, frozenset({NODE_SELECTION})),
        ("job-size", job_size, frozenset({METADATA})),
        ("inference-spread", inference_spread, frozenset({SCHEDULING})),
        ("inference-group", inference_group, frozenset({POD_AFFINITY})),
        ("gpu-toleration", gpu_toleration, frozenset({SCHEDULING})),
        ("scheduler-queue", scheduler_queue, frozenset({SCHEDULING, METADATA})),  # queue labels / annotation
    )
    return tuple(Mutation(mid, fn, (fn.__doc__ or "").strip(), touches) for mid, fn, touches in fns)


MUTATIONS: tuple[Mutation, ...] = _registry()
