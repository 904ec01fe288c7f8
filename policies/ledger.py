"""The post-launch ledger (issue #18): what became of each admitted job and inference workload.

Pure: pod objects, node facts and admission records in, rows out. The server's tracker
(webhook/ledger.py) feeds it from the pod watch; `gpu-admission placement` from a cluster or from dumps.

Per training (or batch) job, from its pods:
- `pending_s`: the last pod's `PodScheduled=True` time minus the first pod's `creationTimestamp` (both as
  the API server wrote them, to the second); while not all pods are bound, the time waited so far.
- `outcome`: `one-domain` (every pod bound, one node or one domain of every topology level), `spanning`
  (every pod bound, more than one domain of some level), `unknown-topology` (every pod bound, but a node
  lacks a level's label or is unknown), `partly-bound`, `never-bound`, `denied` (refused at admission,
  no pod since).
- the all-reduce time of the actual placement (`comm.spread_ms`) against the best placement the free GPUs
  allowed when the job's first pod was created (`best_placement`), as a ratio (1.0 = as good as it got).

Per inference workload (a Deployment, StatefulSet or LeaderWorkerSet): replicas per node and per zone, and
how many landed on shared GPUs (a time-sliced / MPS / MIG node, or a shared-GPU resource).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from policies import classify, comm, placement, topology
from policies.inventory import Inventory
from policies.resources import GPU, pod_ask
from policies.subject import job_identity, job_label, meta_map, meta_str
from policies.workloads import effective_kind, templates

OUTCOMES: tuple[str, ...] = ("one-domain", "spanning", "unknown-topology", "partly-bound", "never-bound", "denied")
BOUND_OUTCOMES = frozenset(OUTCOMES[:3])
CLASSES: tuple[str, ...] = ("training", "inference", "batch", "unclassified")
INFERENCE_OWNERS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet"})
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
TEMPLATE_HASH = "pod-template-hash"


def parse_time(value: Any) -> float | None:
    """An RFC 3339 time (`2026-12-01T17:00:00Z`) as epoch seconds; None when absent or unparsable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt).timestamp()


# -- pods ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodFact:
    """What the ledger keeps of one GPU pod."""

    namespace: str
    name: str
    group: str  # the job or inference workload it belongs to (namespace included)
    workload: str  # one of CLASSES
    unowned: bool  # no job label and no controller: a bare pod, its own one-pod job
    gpus: int  # whole GPUs (nvidia.com/gpu)
    shared: bool  # asks a GPU resource other than whole cards (a shared or MIG resource)
    node: str  # "" while unbound
    created: float | None
    scheduled: float | None  # when PodScheduled became True
    job_uid: str | None = None  # the uid of its controller (a Job's), or its own for a bare pod


def _controller_ref(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    owners = meta.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else []:
        if isinstance(owner, dict) and owner.get("controller") is True:
            kind, name = owner.get("kind"), owner.get("name")
            if isinstance(kind, str) and isinstance(name, str) and kind and name:
                return owner
    return None


def _job_uid(meta: Mapping[str, Any], ref: Mapping[str, Any] | None) -> str | None:
    """The uid that names a pod's job in the API: its controller's, or its own without one."""
    uid = ref.get("uid") if ref is not None else meta.get("uid")
    return sys.intern(uid) if isinstance(uid, str) and uid else None


def _scheduled_at(status: Mapping[str, Any]) -> float | None:
    conditions = status.get("conditions")
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def inference_group(namespace: str, kind: str, name: str) -> str:
    return f"{namespace}/{kind}/{name}"


def _inference_owner(namespace: str, labels: Mapping[str, Any], owner: tuple[str, str] | None) -> str | None:
    """`ns/Deployment/web` for a ReplicaSet's pod (its name less the pod-template-hash), and so on."""
    lws = labels.get(LWS_NAME)
    if isinstance(lws, str) and lws:
        return inference_group(namespace, "LeaderWorkerSet", lws)
    if owner is None:
        return None
    kind, name = owner
    suffix = labels.get(TEMPLATE_HASH)
    if kind == "ReplicaSet" and isinstance(suffix, str) and suffix and name.endswith("-" + suffix):
        return inference_group(namespace, "Deployment", name[: -len(suffix) - 1])
    return inference_group(namespace, kind, name)


class Note(NamedTuple):
    """What the pod view reads of a GPU pod for the ledger, beside its node and GPUs (`PodEntry.note`), with
    each pod event: small and hashable. The view does not keep it (the ledger reads the note of each change)."""

    group: str | None  # the job or inference workload; None: a bare pod, its own one-pod job
    workload: str  # one of CLASSES
    created: float | None
    scheduled: float | None  # when PodScheduled became True; None while not (or not yet bound)
    job_uid: str | None = None  # _job_uid: one string per job (interned), so a gang's notes stay equal


def pod_note(pod: Any) -> Note:
    """The ledger's note of one pod object. Raises ValueError on garbage."""
    if not isinstance(pod, dict):
        raise ValueError("pod is not an object")
    meta, spec, status = pod.get("metadata"), pod.get("spec"), pod.get("status") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
        raise ValueError("pod metadata, spec or status is not an object")
    if not meta_str(pod, "name"):
        raise ValueError("pod has no name")
    namespace = meta_str(pod, "namespace")
    labels = meta_map(pod, "labels")
    ref = _controller_ref(meta)
    owner = (ref["kind"], ref["name"]) if ref is not None else None
    explicit = labels.get("gpu-admission.io/workload")
    workload = explicit if explicit in CLASSES else (classify.by_pod(pod) or "unclassified")
    key = job_label(labels)
    group: str | None = None
    if workload == "inference":
        group = _inference_owner(namespace, labels, owner)
    if group is None and key is not None:
        group = placement.job_id(namespace, key, labels[key])
    if group is None and owner is not None:
        group = inference_group(namespace, *owner)
    bound = bool(spec.get("nodeName"))
    return Note(
        sys.intern(group) if group is not None else None,
        sys.intern(str(workload)),
        parse_time(meta.get("creationTimestamp")),
        _scheduled_at(status) if bound else None,
        _job_uid(meta, ref),
    )


def fact_of(key: str, gpus: Mapping[str, int], node: str, note: Note) -> PodFact:
    """The fact of a pod from its view entry: `key` namespace/name, GPU units per resource, node, note."""
    namespace, _, name = key.rpartition("/")
    return PodFact(
        namespace=namespace,
        name=name,
        group=note.group or f"{namespace}/pod={name}",
        workload=note.workload,
        unowned=note.group is None,
        gpus=gpus.get(GPU, 0),
        shared=any(r != GPU for r in gpus),
        node=node,
        created=note.created,
        scheduled=note.scheduled if node else None,
        job_uid=note.job_uid,
    )


def pod_fact(pod: Any) -> PodFact | None:
    """The fact of one pod object; None when it asks for no GPU. Raises ValueError on garbage."""
    note = pod_note(pod)
    units = {r: n for r, n in pod_ask(pod).units().items() if n}
    if not units:
        return None
    node = pod["spec"].get("nodeName") or ""
    if not isinstance(node, str):
        raise ValueError("pod nodeName is not a string")
    return fact_of(f"{meta_str(pod, 'namespace')}/{meta_str(pod, 'name')}", units, node, note)


def admitted_group(kind: str, namespace: str, name: str, obj: dict[str, Any]) -> str | None:
    """The job or inference workload an admitted object stands for (what `pod_fact` calls its pods' group): a
    job's label and value are decided as the engine decides them (`subject.job_identity`: a RayJob whose
    templates carry `gpu-admission.io/job: ppo-atari-run-7` is that job, not its name's)."""
    kind = effective_kind(obj) or kind  # a Volcano Job is no batch/v1 Job: its pods carry volcano.sh/job-name
    if kind in INFERENCE_OWNERS:
        return inference_group(namespace, kind, name) if name else None
    if kind == "Pod":
        labels: Iterable[Mapping[str, Any]] = (meta_map(obj, "labels"),)
    else:
        labels = (meta_map(t.pod, "labels") for t in templates(obj))
    key, value = job_identity(kind, name, labels)
    # A pod's empty job label still names its group (`pod_note` files it there): only a missing one does not.
    return placement.job_id(namespace, key, value) if key is not None and value is not None else None


# -- topology -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFact:
    labels: Mapping[str, str]
    gpus: int  # allocatable whole GPUs
    shared: bool  # time-sliced, MPS or MIG


@dataclass(frozen=True)
class Topology:
    """The levels (label keys, narrowest first, with their kinds) and the GPU nodes, by name."""

    levels: tuple[tuple[str, str], ...]
    nodes: Mapping[str, NodeFact]

    @property
    def rack(self) -> str | None:
        """The rack-like level: the first switch level, else the first that is not an NVLink domain."""
        keys = [k for k, kind in self.levels if kind == "switch"] or [k for k, kind in self.levels if kind != "nvlink"]
        return keys[0] if keys else None

    def domain(self, node: str, key: str) -> str | None:
        fact = self.nodes.get(node)
        return fact.labels.get(key) if fact is not None else None


def topology_of(inv: Inventory) -> Topology:
    """The ledger's view of an inventory version (built once per version: O(GPU nodes))."""

    def build() -> Topology:
        nodes = {n.name: NodeFact(n.labels, n.whole_gpus, n.shared or n.partitioned) for n in inv.nodes}
        return Topology(tuple((lv.key, lv.kind) for lv in inv.levels), nodes)

    topo: Topology = inv.memo(("ledger-topology",), build)
    return topo


def free_of(topo: Topology, used: Mapping[str, int]) -> dict[str, int]:
    """Whole GPUs free per unshared GPU node: allocatable less what bound pods hold (`used`)."""
    return {name: f.gpus - used.get(name, 0) for name, f in topo.nodes.items() if not f.shared and f.gpus > 0}


def spans(nodes: Iterable[str], topo: Topology) -> tuple[tuple[str, int | None], ...]:
    """Per level: how many of its domains the nodes use; None when one of them has no such label."""
    names = set(nodes)
    out: list[tuple[str, int | None]] = []
    for key, _ in topo.levels:
        values = {topo.domain(n, key) for n in names}
        out.append((key, None if None in values else len(values)))
    return tuple(out)


def _crosses(nodes: Iterable[str], topo: Topology) -> bool | None:
    """Does a placement leave one domain of a switch or zone level (its traffic crosses the spine)?"""
    spread = dict(spans(nodes, topo))
    counts = [spread[k] for k, kind in topo.levels if kind != "nvlink"]
    if any(n is None for n in counts):
        return None
    return any(n is not None and n > 1 for n in counts)


# -- communication ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comm:
    size_bytes: int = comm.DEFAULT_MESSAGE_BYTES
    bandwidths: comm.Bandwidths = comm.DEFAULT_BANDWIDTHS


def category(per_node: Sequence[int], cross: bool) -> str:
    """The `gpu-admission estimate` row a placement is: intra-node, intra-rack or cross-rack."""
    if len(per_node) == 1:
        return "intra-node"
    return "cross-rack" if cross else "intra-rack"


def _fill(pods: Sequence[int], free: Sequence[tuple[str, int]]) -> dict[str, int] | None:
    """First-fit decreasing of the pods' GPUs into the nodes, roomiest first: node -> GPUs, None if short."""
    room = sorted(free, key=lambda nf: (-nf[1], nf[0]))
    left = [n for _, n in room]
    used: dict[str, int] = {}
    for gpus in sorted(pods, reverse=True):
        i = next((i for i, n in enumerate(left) if n >= gpus), None)
        if i is None:
            return None
        left[i] -= gpus
        used[room[i][0]] = used.get(room[i][0], 0) + gpus
    return used


@dataclass(frozen=True)
class Best:
    placement: str  # intra-node, intra-rack or cross-rack
    per_node: tuple[int, ...]
    ms: float


def best_placement(pods: Sequence[int], free: Mapping[str, int], topo: Topology, model: Comm) -> Best | None:
    """The fastest placement the free GPUs allowed: the pods packed into one rack-level domain (roomiest nodes
    first; the domain whose packing is fastest), else over the whole cluster. None: nothing could hold them,
    or the job has no whole GPUs. O(GPU nodes · pods): once per job, never per review."""
    pods = [g for g in pods if g > 0]
    if not pods:
        return None
    rack = topo.rack
    domains: dict[str | None, list[tuple[str, int]]] = {}
    for node, n in free.items():
        if n > 0 and node in topo.nodes:
            domains.setdefault(topo.domain(node, rack) if rack else "", []).append((node, n))
    best: Best | None = None
    for key, members in domains.items():
        if key is None:
            continue  # nodes without the rack label are only used by the cluster-wide fallback
        used = _fill(pods, members)
        if used is not None:
            per = tuple(sorted(used.values(), reverse=True))
            ms = comm.spread_ms(model.size_bytes, per, False, model.bandwidths)
            if best is None or ms < best.ms:
                best = Best(category(per, False), per, ms)
    if best is not None:
        return best
    used = _fill(pods, [m for members in domains.values() for m in members])
    if used is None:
        return None
    cross = bool(_crosses(used, topo)) if rack else False
    per = tuple(sorted(used.values(), reverse=True))
    return Best(category(per, cross), per, comm.spread_ms(model.size_bytes, per, cross, model.bandwidths))


def free_profile(
    free: Mapping[str, int], topo: Topology, per_domain: int = 32, domains: int = 64, overall: int = 64
) -> Mapping[str, int]:
    """The part of a cluster's free GPUs (node -> free) a best placement can use, small enough to keep per
    job. A gang of k pods packed roomiest-first uses at most the k roomiest nodes of a domain, and domains
    whose roomiest nodes have the same free counts pack alike: so the `per_domain` roomiest nodes of one
    domain per distinct such list (the `domains` lists of most free GPUs), and the `overall` roomiest nodes
    anywhere (the fallback across domains). Exact for gangs of up to `per_domain` pods in a cluster with at
    most `domains` distinct lists (tests/test_ledger.py); beyond, the best is the best of what was kept."""
    rack = topo.rack
    by_domain: dict[str, list[tuple[int, str]]] = {}
    everywhere: list[tuple[int, str]] = []
    for node, n in free.items():
        if n <= 0 or node not in topo.nodes:
            continue
        everywhere.append((-n, node))
        key = topo.domain(node, rack) if rack else ""
        if key is not None:
            by_domain.setdefault(key, []).append((-n, node))
    kinds: dict[tuple[int, ...], list[tuple[int, str]]] = {}
    for members in by_domain.values():
        top = sorted(members)[:per_domain]
        kinds.setdefault(tuple(n for n, _ in top), top)
    kept_kinds = sorted(kinds, key=lambda sig: (sum(sig), sig))[:domains]
    kept = {node: -n for sig in kept_kinds for n, node in kinds[sig]}
    kept.update({node: -n for n, node in sorted(everywhere)[:overall]})
    return kept


# -- jobs ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """What the audit log (or the server itself) says about a job's admission."""

    uid: str
    time: float
    verdict: str  # allow, warn or deny
    rules: tuple[str, ...] = ()  # rules that fired (deny, warn, audit, error) and mutations applied
    workload: str = "unclassified"


def merge_admission(known: Admission | None, new: Admission) -> Admission:
    """The decision a job's ledger keeps of several (a Job's mutate and validate, then each pod's): the first
    that allowed it, unless one denied it since (the latest denial), until one allows it again."""
    if known is None or new.verdict == "deny" or (known.verdict == "deny" and new.verdict != "deny"):
        return new
    return known


@dataclass(frozen=True)
class JobRow:
    group: str
    namespace: str
    workload: str
    unowned: bool
    pods: int
    bound: int
    deleted: int  # pods deleted (or gone from the pod list) before they were bound
    gpus: int
    outcome: str
    admitted: float | None
    created: float | None
    first_bound: float | None
    last_bound: float | None
    pending_s: float | None
    spans: tuple[tuple[str, int | None], ...]
    nodes: tuple[tuple[str, int], ...]  # node -> GPUs of the job there
    placement: str | None  # intra-node, intra-rack, cross-rack (None: not all bound, or topology unknown)
    actual_ms: float | None
    best: str | None
    best_ms: float | None
    comm_ratio: float | None
    uid: str | None  # the admission's uid (the audit record's), for the follow-up record
    rules: tuple[str, ...] = field(default=())
    job_uid: str | None = None  # the uid of the job's object (its pods' controller), when its pods say

    @property
    def fully_bound(self) -> bool:
        return self.outcome in BOUND_OUTCOMES


def job_row(
    group: str,
    pods: Sequence[PodFact],
    topo: Topology,
    *,
    now: float,
    admission: Admission | None = None,
    best: Best | None = None,
    deleted: int = 0,
    model: Comm | None = None,
) -> JobRow:
    """The ledger row of one job: `pods` are its pods still known (bound ones include those that ended),
    `deleted` how many more were deleted before being bound."""
    model = model or Comm()
    bound = [p for p in pods if p.node]
    created = min((p.created for p in pods if p.created is not None), default=None)
    if admission is not None and created is None:
        created = admission.time
    times = [p.scheduled for p in bound if p.scheduled is not None]
    first, last = (min(times), max(times)) if times else (None, None)
    total = len(pods) + deleted
    per_node: dict[str, int] = {}
    for p in bound:
        per_node[p.node] = per_node.get(p.node, 0) + p.gpus
    spread = spans(per_node, topo) if bound else ()
    if not pods and not deleted:
        outcome = "denied" if admission is not None and admission.verdict == "deny" else "never-bound"
    elif not bound:
        outcome = "never-bound"
    elif len(bound) < total:
        outcome = "partly-bound"
    elif len(per_node) == 1:
        outcome = "one-domain"
    elif any(n is None for _, n in spread) or not spread:
        outcome = "unknown-topology"
    else:
        outcome = "one-domain" if all(n == 1 for _, n in spread) else "spanning"
    pending: float | None = None
    if created is not None and total:
        end = last if outcome in BOUND_OUTCOMES and last is not None else now
        pending = max(0.0, end - created)
    where = actual = ratio = None
    gpu_split = tuple(sorted((n for n in per_node.values() if n > 0), reverse=True))
    if outcome in BOUND_OUTCOMES and gpu_split:
        cross = _crosses(per_node, topo) if len(gpu_split) > 1 else False
        if cross is not None:
            where = category(gpu_split, cross)
            actual = comm.spread_ms(model.size_bytes, gpu_split, cross, model.bandwidths)
            if best is not None:
                ratio = actual / best.ms if best.ms > 0 else 1.0
    first_pod = pods[0] if pods else None
    return JobRow(
        group=group,
        namespace=first_pod.namespace if first_pod else group.split("/", 1)[0],
        workload=first_pod.workload if first_pod else (admission.workload if admission else "unclassified"),
        unowned=first_pod.unowned if first_pod else False,
        pods=total,
        bound=len(bound),
        deleted=deleted,
        gpus=sum(p.gpus for p in pods),
        outcome=outcome,
        admitted=admission.time if admission is not None else None,
        created=created,
        first_bound=first,
        last_bound=last,
        pending_s=pending,
        spans=spread,
        nodes=tuple(sorted(per_node.items())),
        placement=where,
        actual_ms=actual,
        best=best.placement if best is not None else None,
        best_ms=best.ms if best is not None else None,
        comm_ratio=ratio,
        uid=admission.uid if admission is not None else None,
        rules=admission.rules if admission is not None else (),
        job_uid=next((p.job_uid for p in pods if p.job_uid), None),
    )


# -- inference ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InferenceRow:
    group: str
    namespace: str
    replicas: int
    bound: int
    per_node: tuple[tuple[str, int], ...]
    per_zone: tuple[tuple[str, int], ...]  # "?" for a node without a zone label (or unknown)
    shared: int  # replicas bound on shared GPUs (a shared node, or a shared / MIG resource)


def inference_row(group: str, pods: Sequence[PodFact], topo: Topology) -> InferenceRow:
    per_node: dict[str, int] = {}
    per_zone: dict[str, int] = {}
    shared = 0
    for p in pods:
        if not p.node:
            continue
        per_node[p.node] = per_node.get(p.node, 0) + 1
        zone = topo.domain(p.node, topology.ZONE) or "?"
        per_zone[zone] = per_zone.get(zone, 0) + 1
        fact = topo.nodes.get(p.node)
        if p.shared or (fact is not None and fact.shared):
            shared += 1
    return InferenceRow(
        group=group,
        namespace=pods[0].namespace if pods else group.split("/", 1)[0],
        replicas=len(pods),
        bound=sum(per_node.values()),
        per_node=tuple(sorted(per_node.items())),
        per_zone=tuple(sorted(per_zone.items())),
        shared=shared,
    )


# -- summary ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    jobs: int
    admitted: int  # jobs not denied
    outcomes: tuple[tuple[str, int], ...]
    success_within_s: float
    succeeded: int  # fully bound within `success_within_s` of their first pod's creation
    success_rate: float | None  # succeeded / admitted
    partial_gangs: int
    partial_gpus: int  # GPUs held (bound) by partly bound jobs
    pending_p50_s: float | None
    pending_max_s: float | None
    comm_ratio_mean: float | None
    comm_ratio_max: float | None
    unowned: int
    unknown_topology: int


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def succeeded(row: JobRow, within_s: float) -> bool:
    return row.fully_bound and row.pending_s is not None and row.pending_s <= within_s


def summarize(rows: Sequence[JobRow], within_s: float) -> Summary:
    counts = {o: 0 for o in OUTCOMES}
    for r in rows:
        counts[r.outcome] += 1
    admitted = len(rows) - counts["denied"]
    ok = sum(1 for r in rows if succeeded(r, within_s))
    partial = [r for r in rows if r.outcome == "partly-bound"]
    waits = [r.pending_s for r in rows if r.fully_bound and r.pending_s is not None]
    ratios = [r.comm_ratio for r in rows if r.comm_ratio is not None]
    return Summary(
        jobs=len(rows),
        admitted=admitted,
        outcomes=tuple(counts.items()),
        success_within_s=within_s,
        succeeded=ok,
        success_rate=ok / admitted if admitted else None,
        partial_gangs=len(partial),
        partial_gpus=sum(g for r in partial for _, g in r.nodes),
        pending_p50_s=_quantile(waits, 0.5),
        pending_max_s=max(waits) if waits else None,
        comm_ratio_mean=sum(ratios) / len(ratios) if ratios else None,
        comm_ratio_max=max(ratios) if ratios else None,
        unowned=sum(1 for r in rows if r.unowned),
        unknown_topology=counts["unknown-topology"],
    )


# -- a whole cluster at once (gpu-admission placement) ------------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    jobs: tuple[JobRow, ...]
    inference: tuple[InferenceRow, ...]
    skipped: int  # pod objects that could not be read


def build(
    pods: Iterable[Any],
    topo: Topology,
    admissions: Mapping[str, Admission],
    *,
    now: float,
    model: Comm | None = None,
) -> Ledger:
    """The ledger of a list of pods (and the admissions of an audit log): each job's best placement is
    computed from the GPUs the listed pods held when its first pod was created (pods that ended and are gone
    from the list are not counted: the best is then no worse than the real one was)."""
    model = model or Comm()
    facts: list[PodFact] = []
    skipped = 0
    for obj in pods:
        try:
            fact = pod_fact(obj)
        except (ValueError, TypeError, AttributeError):
            skipped += 1
            continue
        if fact is not None:
            facts.append(fact)
    groups: dict[str, list[PodFact]] = {}
    for f in facts:
        groups.setdefault(f.group, []).append(f)
    inference = {g for g, members in groups.items() if members[0].workload == "inference"}
    alloc = {name: f.gpus for name, f in topo.nodes.items() if not f.shared and f.gpus > 0}
    events = sorted((p.scheduled if p.scheduled is not None else -math.inf, p.node, p.gpus) for p in facts if p.node)
    starts = sorted(
        (min((p.created for p in members if p.created is not None), default=math.inf), g)
        for g, members in groups.items()
        if g not in inference
    )
    used: dict[str, int] = {}
    rows: list[JobRow] = []
    i = 0
    for created, group in starts:
        while i < len(events) and events[i][0] <= created:
            _, node, gpus = events[i]
            used[node] = used.get(node, 0) + gpus
            i += 1
        members = groups[group]
        own: dict[str, int] = {}
        for p in members:
            if p.node and (p.scheduled if p.scheduled is not None else -math.inf) <= created:
                own[p.node] = own.get(p.node, 0) + p.gpus
        free = {n: a - used.get(n, 0) + own.get(n, 0) for n, a in alloc.items()}
        best = best_placement([p.gpus for p in members], free, topo, model)
        rows.append(job_row(group, members, topo, now=now, admission=admissions.get(group), best=best, model=model))
    for group, admission in admissions.items():
        if group not in groups and admission.workload != "inference":
            rows.append(job_row(group, (), topo, now=now, admission=admission, model=model))
    rows.sort(key=lambda r: (r.created if r.created is not None else math.inf, r.group))
    infer = tuple(inference_row(g, groups[g], topo) for g in sorted(inference))
    return Ledger(tuple(rows), infer, skipped)
