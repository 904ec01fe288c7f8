"""What the engine knows about one object under review: its class, pod templates, job size and identity.

Built once per review from the working copy; mutations edit the templates in place (they are the same
dicts as in the working copy), and rules read the result.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies import dra, placement, podviews, userkeys
from policies.classify import classify, default_latency
from policies.document import Policy
from policies.exceptions import Exemption
from policies.inventory import Inventory, NodeSet
from policies.resources import PodAsk, pod_ask
from policies.workloads import JOB_IDENTITY_LABEL, POD_JOB_LABELS, Json, Template, effective_kind, templates

# The label the webhook puts on pod templates of kinds whose controller sets no job label of its own.
OWN_JOB_LABEL = userkeys.JOB
# Pods of these controllers form one distributed job (gpu-resources.md §6).
_DISTRIBUTED_POD_LABELS = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-completion-index",
)

Resolver = Callable[[str, str, str], Json | None]  # (kind, namespace, name) -> object or None

# What a mutation may edit (Mutation.touches), so Subject.invalidate forgets only what was derived from it.
RESOURCES = "resources"  # containers' resources: the ask, gpu_pods, the job's size
NODE_SELECTION = "node-selection"  # nodeName, nodeSelector, required node affinity: candidates, rack constraint
POD_AFFINITY = "pod-affinity"  # podAffinity / podAntiAffinity: rack constraint
METADATA = "metadata"  # labels and annotations of the object or a template: job identity, rack constraint
SCHEDULING = "scheduling"  # tolerations, spread constraints, scheduler, queue, priority: nothing is derived
EVERYTHING = frozenset({RESOURCES, NODE_SELECTION, POD_AFFINITY, METADATA, SCHEDULING})
_RACK_INPUTS = frozenset({NODE_SELECTION, POD_AFFINITY, METADATA})


@dataclass(frozen=True)
class ReviewContext:
    """What the caller knows beyond the object: the namespace's labels, and a lookup of related objects
    (HPA / ScaledObject targets) — the same input set offline, a read-only cache when serving."""

    namespace_labels: Mapping[str, str] | None = None
    resolve: Resolver | None = None
    operation: str = "CREATE"
    namespace: str = ""  # the request's namespace (a pod's metadata may not carry it yet)
    # The pod view (None: none, placement falls back to the static rule) and every job's reservation.
    capacity: placement.Capacity | None = None
    reservations: tuple[placement.Reservation, ...] = ()
    # The GPUPolicyExceptions of the object's namespace, and the time to judge their `until` by (Unix
    # seconds; None: expiry not judged, the caller passes only live ones). The engine reads no clock.
    exceptions: tuple[Exemption, ...] = ()
    now: float | None = None
    # Rules and mutations the API server runs itself as Validating/MutatingAdmissionPolicies (policies/native.py,
    # `serve --native [--native-mutations]`): skipped here on what those policies cover, so nothing runs twice.
    native: frozenset[str] = frozenset()
    # Checks a DRA CEL selector parses (one-line error or None); None: not checked (the API server compiles
    # the selectors of every ResourceClaim, template and class it stores, so only offline input needs it).
    cel_check: Callable[[str], str | None] | None = None


@dataclass
class Pod:
    """One pod template (or the pod itself) in the working copy."""

    template: Template
    keys: userkeys.UserKeys
    workload: str | None
    latency: str
    lookup: dra.Lookup | None = None  # reads the pod's DRA claims (None: only device-plugin resources)
    # Derived from the pod spec and cached: rules read them many times. The engine calls Subject.invalidate
    # after every mutation that changed something, with what that mutation touches.
    _ask: PodAsk | None = None
    _candidates: NodeSet | None = None
    _rack_constraint: bool | None = None  # see mutations.has_rack_constraint

    @property
    def pod(self) -> Json:
        return self.template.pod

    @property
    def ask(self) -> PodAsk:
        if self._ask is None:
            self._ask = pod_ask(self.template.pod, self.lookup)
        return self._ask

    def candidates(self, inventory: Inventory) -> NodeSet:
        """GPU nodes this pod's node selection allows (cached like `ask`, reset by Subject.invalidate)."""
        if self._candidates is None:
            self._candidates = inventory.candidates(self.template.pod)
        return self._candidates

    @property
    def spec(self) -> Json:
        spec = self.template.pod.get("spec")
        return spec if isinstance(spec, dict) else {}

    def labels(self) -> Json:
        return meta_map(self.template.pod, "labels")


@dataclass(frozen=True)
class Job:
    """The job a training pod belongs to: identity label (key, value) if known, size in GPUs, and whether it
    spans several pods.
    `gpus_known` is False for a pod of a multi-pod job without `gpu-admission.io/job-gpus`: `gpus` is then only
    this pod's share, a lower bound."""

    key: str | None
    value: str | None
    gpus: int
    multi_pod: bool
    gpus_known: bool = True
    sizes: tuple[int, ...] = ()  # GPUs of each pod of the gang, when known (placement.gang_sizes)


@dataclass
class Subject:
    kind: str
    obj: Json
    name: str
    namespace: str
    pods: list[Pod]
    policy: Policy
    inventory: Inventory
    ctx: ReviewContext
    notes: list[str] = field(default_factory=list)
    _gpu_pods: list[Pod] | None = None
    _training_pods: list[Pod] | None = None
    _obj_keys: userkeys.UserKeys = field(default_factory=userkeys.UserKeys)
    _job: Job | None = None
    _job_id: tuple[Job | None, str | None] = (None, None)  # (the job it was worked out for, its id)
    _placement: placement.Decision | bool | None = False  # False: not decided yet
    # mutations.job_domain, asked by training-rack, placement and two rules per review (False: not yet).
    _domain: tuple[str, frozenset[str]] | bool | None = False
    pinned: placement.Decision | None = None  # the decision training-rack pinned the job's rack by

    @property
    def job(self) -> Job:
        """Derived on first use, and again after a mutation that touched resources or labels: the mutations
        after gpu-slice, and a second pass over the result, must see the same job."""
        if self._job is None:
            self._job = _derive_job(self.kind, self.obj, self.name, self.pods, self._obj_keys)
        return self._job

    @property
    def gpu_pods(self) -> list[Pod]:
        if self._gpu_pods is None:
            self._gpu_pods = [p for p in self.pods if p.ask.asks_gpu or p.keys.gpu_memory is not None]
        return self._gpu_pods

    @property
    def training_pods(self) -> list[Pod]:
        """The GPU pods of class training (four rules ask; forgotten with gpu_pods)."""
        if self._training_pods is None:
            self._training_pods = [p for p in self.gpu_pods if p.workload == "training"]
        return self._training_pods

    def invalidate(self, touched: Collection[str] = EVERYTHING) -> None:
        """Forget what was derived from the parts of the pod specs a mutation edited (`touched`, of the
        constants above; by default all of it)."""
        if RESOURCES in touched:
            self._gpu_pods = self._training_pods = None
        if RESOURCES in touched or METADATA in touched:
            self._job = None
            self._domain = False  # job size and claims (resources), job identity (metadata)
        if not {RESOURCES, METADATA, NODE_SELECTION}.isdisjoint(touched):
            self._placement = False
        rack = not _RACK_INPUTS.isdisjoint(touched)
        for p in self.pods:
            if RESOURCES in touched:
                p._ask = None
            if NODE_SELECTION in touched:
                p._candidates = None
            if rack:
                p._rack_constraint = None

    @property
    def placement(self) -> placement.Decision | None:
        """Where the job's gang goes on the rack label (None: not a multi-pod job of known identity, or no
        rack label). Decided once per review, again only after a mutation changed what it reads."""
        if self._placement is False:
            self._placement = _decide_placement(self)
        return self._placement if isinstance(self._placement, placement.Decision) else None

    def job_id(self) -> str | None:
        job = self.job
        if self._job_id[0] is not job:  # once per job derived (asked by several mutations and the engine)
            jid = (
                None
                if job.key is None or job.value is None
                else placement.job_id(self.ctx.namespace or self.namespace, job.key, job.value)
            )
            self._job_id = (job, jid)
        return self._job_id[1]

    @property
    def workload(self) -> str | None:
        classes = [p.workload for p in self.gpu_pods if p.workload] or [p.workload for p in self.pods if p.workload]
        return classes[0] if classes else None

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where or '(unnamed)'}"


def meta_map(obj: Any, key: str) -> Json:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


def meta_str(obj: Json, key: str) -> str:
    meta = obj.get("metadata")
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, str) else ""


def build(obj: Json, policy: Policy, inventory: Inventory, ctx: ReviewContext) -> Subject:
    kind = effective_kind(obj)
    obj_keys = userkeys.read(obj, where=(kind,)) if kind != "Pod" else userkeys.NONE
    pods: list[Pod] = []
    lookup = dra.Lookup(inventory.classes, ctx.resolve, ctx.namespace or meta_str(obj, "namespace"), ctx.cel_check)
    for tpl in templates(obj, ctx.resolve):
        if tpl.path:
            keys = userkeys.read(obj, tpl.pod, where=(kind, f"pod template {tpl.role}"))
        else:
            keys = userkeys.read(obj, where=("Pod",))
        workload = classify(kind, obj if kind != "Pod" else tpl.pod, keys.workload)
        latency = keys.latency or default_latency(workload)
        pods.append(Pod(tpl, keys, workload, latency, lookup))
    name = meta_str(obj, "name")
    namespace = meta_str(obj, "namespace")
    s = Subject(kind, obj, name, namespace, pods, policy, inventory, ctx, _obj_keys=obj_keys)
    if kind == "TrainJob" and any(p.template.readonly for p in pods):
        s.notes.append(_unresolved_runtime_note(obj))
    return s


def _unresolved_runtime_note(obj: Json) -> str:
    spec = obj.get("spec")
    if isinstance(spec, dict) and "runtimePatches" in spec and not isinstance(spec["runtimePatches"], list):
        return "TrainJob: spec.runtimePatches is not a list: judged, not mutated"
    ref = podviews.runtime_ref(obj)
    what = f"{ref[0]} {ref[2]}" if ref else "its runtime"
    return f"TrainJob: {what} not found: nodes judged from spec.trainer only, not mutated"


_JOB_LABELS = (OWN_JOB_LABEL, *POD_JOB_LABELS)


def job_label(labels: Mapping[str, Any]) -> str | None:
    """The label that names a bare pod's job, most specific first."""
    for k in _JOB_LABELS:
        if isinstance(labels.get(k), str):
            return k
    return None


def pod_facts(pod: Mapping[str, Any]) -> tuple[dict[str, int], str | None]:
    """What the pod view keeps of a pod: GPU units per resource, and its job (placement.job_id)."""
    if not isinstance(pod, dict):
        raise ValueError("pod is not an object")
    units = pod_ask(pod).units()
    labels = meta_map(pod, "labels")
    key = job_label(labels)
    job = placement.job_id(meta_str(pod, "namespace"), key, labels[key]) if key else None
    return units, job


def _decide_placement(s: Subject) -> placement.Decision | None:
    from policies.mutations import job_domain  # (mutations imports this module)

    domain = job_domain(s)  # the narrowest topology level whose domains can hold the job
    key = domain[0] if domain is not None else None
    job = s.job
    jid = s.job_id()
    pods = [p for p in s.gpu_pods if p.workload == "training" and p.ask.whole_gpus > 0]
    if key is None or jid is None or not job.multi_pod or not pods:
        return None
    if any(p.keys.gpu_memory is not None for p in s.gpu_pods):
        return None  # gpu-slice picks their GPU among the candidates: narrowing the racks would change its pick
    inv, cands, cap, held = s.inventory, pods[0].candidates(s.inventory), s.ctx.capacity, s.ctx.reservations

    def decide() -> tuple[Any, ...]:
        nodes = grouping(inv, cands, key).at(cap)
        return (inv, cands, placement.decide(nodes, key, job.sizes, cap, held, jid))

    # Once per snapshot of the pod view (or inventory) for each job and gang: the pods of one job share it.
    # Keyed on the inventory's topology epoch, not the version: a storm of heartbeats and label changes no
    # level reads makes a version every batch. Within one epoch the nodes' slots, names, level labels and
    # GPUs are the same, so the candidate bitmask means the same nodes, and their grouping by domain
    # (O(candidates), ~0.25 s at 50,000 nodes) is built once per epoch and brought up to each snapshot by
    # the nodes whose GPUs changed (`grouping`).
    memo_key = ("decide", inv.topology_epoch, key, cands.mask, job.sizes, held, jid)
    store = cap if cap is not None else inv
    return store.memo(memo_key, decide)[2]  # type: ignore[no-any-return]


def grouping(inv: Inventory, cands: NodeSet, key: str) -> placement.Grouping:
    """The candidates by domain of `key`, built once per topology epoch (the bitmask means the same nodes
    throughout one), then kept current per pod-view snapshot from the nodes whose GPUs changed."""
    epoch = inv.topology_epoch
    return epoch.memo(("grouping", key, cands.mask), lambda: placement.Grouping(cands, key))  # type: ignore[no-any-return]


def job_identity(kind: str, name: str, labels: Iterable[Mapping[str, Any]]) -> tuple[str | None, str | None]:
    """The label that names an object's job and its value, as its pods will carry them: the engine's job and
    the ledger's group of an admitted object (`ledger.admitted_group`) both come from here, so they agree.
    `labels`: the pod's labels for a Pod, else each pod template's. (None, ...): no job identity."""
    if kind == "Pod":
        own = next(iter(labels), {})
        key = job_label(own)
        return key, own[key] if key else None
    if not uses_own_job_label(kind):
        return JOB_IDENTITY_LABEL[kind] if name else None, name or None
    value = _own_job_value(labels, name or None)
    return OWN_JOB_LABEL if value else None, value


def uses_own_job_label(kind: str) -> bool:
    """Kinds whose controller puts no job label on its pods (RayJob, a Deployment, ...): ours names the job."""
    return kind != "Pod" and not JOB_IDENTITY_LABEL.get(kind)


def own_job_values(labels: Iterable[Mapping[str, Any]]) -> list[str]:
    """The distinct values our job label has on the pod templates (strings only; another type is refused by
    the annotations rule), sorted."""
    return sorted({v for lb in labels if isinstance(v := lb.get(OWN_JOB_LABEL), str)})


def _own_job_value(labels: Iterable[Mapping[str, Any]], name: str | None) -> str | None:
    """The job's value of our job label: the one its templates already carry (their pods will, so the affinity
    terms must select it, not the object's name), else the name. Templates naming different jobs have no one
    value a selector could match, and an empty value names none: no job identity then (the rules say so)."""
    given = own_job_values(labels)
    if len(given) > 1:
        return None
    return given[0] if given else name


def _derive_job(kind: str, obj: Json, name: str, pods: Sequence[Pod], obj_keys: userkeys.UserKeys) -> Job:
    job_gpus = next((p.keys.job_gpus for p in pods if p.keys.job_gpus), None) or obj_keys.job_gpus
    key, value = job_identity(kind, name, (p.labels() for p in pods))
    if kind == "Pod":
        pod = pods[0] if pods else None
        labels = pod.labels() if pod else {}
        per_pod = pod.ask.whole_gpus if pod else 0
        distributed = not labels.keys().isdisjoint(_DISTRIBUTED_POD_LABELS)
        multi = (job_gpus is not None and job_gpus > per_pod) or distributed
        if job_gpus is not None and job_gpus <= per_pod:
            multi = False  # the whole job is this one pod (a 1-pod indexed Job, say): nothing to co-locate
        known = job_gpus is not None or not multi
        gang = placement.gang_sizes(job_gpus, per_pod) if job_gpus is not None and multi else ()
        return Job(key, value, job_gpus or per_pod, multi, known, gang)
    gpu_pods = [p for p in pods if p.ask.asks_gpu]
    total_pods = sum(p.template.replicas for p in gpu_pods)
    total_gpus = sum(p.template.replicas * p.ask.whole_gpus for p in gpu_pods)
    sizes: tuple[int, ...] = ()
    if 1 < total_pods <= placement.MAX_GANG_PODS:
        sizes = tuple(p.ask.whole_gpus for p in gpu_pods for _ in range(p.template.replicas) if p.ask.whole_gpus > 0)
    return Job(key, value, job_gpus or total_gpus, total_pods > 1, sizes=sizes)
