"""Validation rules (spec §6): the AI-scheduling checklist as small functions in a registry.

Each rule reads the subject AFTER mutation and returns its violations: what was found and how to fix it.
The engine turns them into deny / warn / audit according to the policy and the namespace's enforcement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies import comm, ownscaling, placement, schedkeys
from policies.classify import classify
from policies.mutations import (
    claims_nvlink_domain,
    domain_level,
    has_queue,
    has_rack_constraint,
    job_domain,
    larger_than_any_clique,
    larger_than_any_rack,
    level_penalty,
    no_domain_fits_note,
    only_reserved_gpus,
    prefers_domain,
)
from policies.quantity import format_bytes
from policies.resources import GPU, ContainerAsk, is_mig, is_shared, pod_ask
from policies.subject import OWN_JOB_LABEL, Pod, Subject, meta_map, own_job_values, uses_own_job_label
from policies.topology import Level, domain_text, domains_text
from policies.workloads import KUBEFLOW_REPLICA_SPECS, Json, containers, effective_kind, templates


@dataclass(frozen=True)
class Violation:
    found: str
    fix: str


RuleFn = Callable[[Subject], list[Violation]]


@dataclass(frozen=True)
class Rule:
    id: str
    fn: RuleFn
    doc: str
    elasticity: bool = False  # evaluated for HPA / ScaledObject objects rather than pod templates


def _training_pods(s: Subject) -> list[Pod]:
    return s.training_pods


def _job_level(s: Subject) -> Level | None:
    """The level the job is kept at (mutations.job_domain, mutations.domain_level), None when none is known."""
    domain = job_domain(s)
    return domain_level(s, domain[0]) if domain else None


def training_same_rack(s: Subject) -> list[Violation]:
    """Checklist 1: pin training pods of one job to the same node or rack. Denies a multi-pod training job
    that has, after mutation, no required constraint at the narrowest topology level that can hold it (the
    rack, an NVLink clique, a coarser switch level) or finer."""
    pods = _training_pods(s)
    if not pods or not s.job.multi_pod:
        return []
    missing = [p for p in pods if not has_rack_constraint(s, p)]
    if not missing:
        return []  # (first: the common case, a pod of a pinned template, decides no placement at all)
    if larger_than_any_rack(s) or (s.inventory.empty and not s.inventory.levels):
        return []  # cannot be met in one domain / nothing known to place by: training-topology-scheduler speaks
    d = s.placement
    if d is not None and d.source == placement.NONE_FITS_NOW:
        if s.policy.when_no_domain_fits == "prefer" and all(prefers_domain(p, d.key) for p in missing):
            # A pod of such a gang that could run now only on GPUs reserved for another (pinned, whole) gang
            # is held back until the reservation ends: taking them leaves both gangs partly placed.
            held = next(((p, h) for p in missing if (h := only_reserved_gpus(s, p, d.key))), None)
            if held:
                return [_held_for_reservation(s, d, *held)]
            # The webhook's own fallback: no rack holds the gang now, a required term would strand it. Said
            # here too: a workload's /validate call is the one whose warnings kubectl shows.
            s.notes.append(no_domain_fits_note(s, d))
            return []
        if s.policy.when_no_domain_fits == "deny":
            return [_no_domain_fits(s, d)]
    roles = ", ".join(sorted({p.template.role for p in missing}))
    size = f"{s.job.gpus} GPUs" if s.job.gpus else "multi-pod"
    level = _job_level(s)
    penalty = level_penalty(s, level)
    why = f"; {penalty}" if penalty else ""
    if level is None:
        found = f"{size} training job with no same-rack constraint ({roles}) and no rack label on GPU nodes{why}"
        return [Violation(found, "set topology.rack in the policy or label GPU nodes with their rack")]
    key = level.key
    if s.job.key is None:
        return [_no_job_identity(s, f"{size} training job ({roles}) has no job identity", why, key)]
    across = domains_text(level, s.inventory.rack_label)
    found = f"{size} training job ({roles}) may be spread across {across}{why}"
    if schedkeys.has_job_constraints(s):
        # The Workload API's gang with constraints of the user's, none at this level: podAffinity beside them may
        # leave the PodGroup unplaceable (upstream), so the fix is in the gang's own constraint.
        return [Violation(found, f"set spec.scheduling.schedulingConstraints.topology to [{{key: {key}}}]")]
    fix = (
        f"add required podAffinity with topologyKey {key}, Kueue podset-required-topology, or enable the "
        f"training-rack mutation"
    )
    return [Violation(found, fix)]


def _no_job_identity(s: Subject, head: str, why: str, key: str) -> Violation:
    """Why the job has no identity, and the fix that gives it one: our label's values on the templates, when
    they are the cause (two different jobs, or an empty value), else no job label at all."""
    values = own_job_values(p.labels() for p in s.pods) if uses_own_job_label(s.kind) else []
    label = OWN_JOB_LABEL
    if "" in values:
        found = f"{head}: a pod template sets {label}='' (an empty value names no job)"
        fix = f"set {label} to the job's name on every pod template, or remove it (the object's name is then used)"
    elif len(values) > 1:
        found = f"{head}: its pod templates name different jobs with {label} ({', '.join(values)})"
        fix = f"give every pod template the same {label} value, or remove it (the object's name is then used)"
    else:
        found = head
        fix = f"give the pods a job label (e.g. {label}) or a required podAffinity with topologyKey {key}"
    return Violation(f"{found}, so no same-rack affinity could be added{why}", fix)


def _no_domain_fits(s: Subject, d: placement.Decision) -> Violation:
    noun = _domain_noun(s, d.key)
    found = (
        f"no {noun} ({d.key}) has room for the {s.job.gpus}-GPU job ({_gang_shape(s.job.sizes)} GPUs) now; "
        f"{d.closest} would once {d.shortfall} more GPUs free up there"
    )
    return Violation(found, "retry when GPUs free up, or set placement.whenNoDomainFits: prefer in the policy")


def _gang_shape(sizes: tuple[int, ...]) -> str:
    """`6x4`, or `1x8 + 4x4` for a gang of unequal pods: pods x GPUs, sizes in the order the gang lists them."""
    counts: dict[int, int] = {}
    for size in sizes:
        counts[size] = counts.get(size, 0) + 1
    return " + ".join(f"{n}x{size}" for size, n in counts.items())


def _domain_noun(s: Subject, key: str) -> str:
    """How a message names one domain of `key`, a level's key or the NVLink key: a ComputeDomain job is kept
    in one clique even where the clique is no level (not on every whole-card node; mutations.job_domain)."""
    level = domain_level(s, key)
    return domain_text(level, s.inventory.rack_label) if level is not None else "rack"


def _held_for_reservation(s: Subject, d: placement.Decision, pod: Pod, held: tuple[str, ...]) -> Violation:
    noun = _domain_noun(s, d.key)
    found = (
        f"no {noun} holds the {s.job.gpus}-GPU job now, and this {pod.ask.whole_gpus}-GPU pod fits only on GPUs "
        f"reserved for another job's gang in {noun} {', '.join(held)}: held until that gang binds (at most "
        f"placement.reservationSeconds, {s.policy.reservation_seconds:g} s)"
    )
    return Violation(found, "none for a Job's pods (its controller retries creating them); retry shortly otherwise")


def training_topology_scheduler(s: Subject) -> list[Violation]:
    """Checklist 4: 8+ GPU multi-node training uses a topology-aware scheduler. Flags a job of more GPUs
    than one node holds that is not handled by Volcano, Kueue TAS or KAI."""
    pods = _training_pods(s)
    if not pods or s.inventory.empty or s.inventory.max_whole_gpus == 0:
        return []
    if s.job.gpus <= s.inventory.max_whole_gpus:
        return []
    if claims_nvlink_domain(s) and larger_than_any_clique(s):
        # Whatever the scheduler: no placement gives a ComputeDomain more than one clique.
        largest = s.inventory.nvlink_largest
        penalty = _clique_penalty(s)
        cost = f": all-reduce ≈{penalty:.1f}× slower" if penalty else ""
        # Short: a warning is cut at 120 characters with its rule id; the fix says why.
        found = f"ComputeDomain job of {s.job.gpus} GPUs > largest NVLink clique ({largest}){cost}"
        fix = (
            "a ComputeDomain's IMEX channels reach only within one clique: shrink the job to one clique's GPUs, "
            "or drop the ComputeDomain claim and run across cliques"
        )
        return [Violation(found, fix)]
    for p in pods:
        if p.spec.get("schedulerName") in s.policy.topology_schedulers:
            continue
        if s.kind == "VolcanoJob" or schedkeys.uses_topology_scheduler(s, p):
            continue
        found = _spans_cliques(s) or (
            f"{s.job.gpus}-GPU job spans nodes (largest has {s.inventory.max_whole_gpus}) without a "
            f"topology-aware scheduler"
        )
        return [Violation(found, "use Volcano, Kueue topology-aware scheduling or KAI (schedulerName/annotations)")]
    return []


def _spans_cliques(s: Subject) -> str:
    """On clique-labelled nodes, a job larger than any NVLink clique: what leaving NVLink costs it."""
    cost = _cliques_cost(s)
    return f"{cost}; no topology-aware scheduler" if cost else ""


def _cliques_cost(s: Subject) -> str:
    """'N GPUs span NVLink cliques (max M): all-reduce ≈X× slower' for a job larger than the largest clique of
    the NVLink level, else ""."""
    i = s.inventory.level_index("nvlink")
    largest = s.inventory.levels[i].largest_gpus if i is not None else 0
    if not largest or s.job.gpus <= largest:
        return ""
    penalty = _clique_penalty(s)
    cost = f": all-reduce ≈{penalty:.1f}× slower" if penalty else ""
    return f"{s.job.gpus} GPUs span NVLink cliques (max {largest}){cost}"


def _clique_penalty(s: Subject) -> float | None:
    try:
        return comm.nvlink_domain_penalty(s.policy.comm.message_bytes, s.job.gpus, s.policy.comm.bandwidths())
    except ValueError:
        return None


def scheduler_topology_keys(s: Subject) -> list[Violation]:
    """Topology keys on an object their scheduler does not read them from (Kueue: pod templates; KAI: the
    workload, with kai.scheduler/topology; Volcano hard mode: a highest tier) place nothing: warns where each
    belongs, since training-rack and training-same-rack then rightly ignore them."""
    if not s.gpu_pods:
        return []
    found = schedkeys.misplaced(s)
    if not found:
        return []
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return [Violation(found[0] + more, "move each key to where its scheduler reads it (docs/policy.md)")]


def _elastic_signal(s: Subject) -> str | None:
    spec = s.obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    if s.kind == "PyTorchJob":
        ep = spec.get("elasticPolicy")
        if isinstance(ep, dict):
            lo, hi = ep.get("minReplicas"), ep.get("maxReplicas")
            if isinstance(lo, int) and isinstance(hi, int) and lo < hi:
                return f"elasticPolicy minReplicas {lo} < maxReplicas {hi}"
    for src in (s.obj, *(p.pod for p in s.pods if p.pod is not s.obj)):  # (a Pod is its own template)
        for section in ("labels", "annotations"):
            if meta_map(src, section).get("kueue.x-k8s.io/elastic-job") == "true":
                return "kueue.x-k8s.io/elastic-job is true"
    for p in s.pods:
        for c in containers(p.pod):
            env = c.get("env")
            if not isinstance(env, list):
                continue
            for e in env:  # (every pod of a training operator has a dozen or more: the loop is kept plain)
                if isinstance(e, dict) and e.get("name") == "PET_NNODES" and isinstance(e.get("value"), str):
                    lo_s, _, hi_s = e["value"].partition(":")
                    if lo_s.isdigit() and hi_s.isdigit() and int(lo_s) < int(hi_s):
                        return f"PET_NNODES={e['value']} lets the job shrink"
    if s.kind in ownscaling.ELASTIC_KINDS:
        own = ownscaling.elastic_training(s.kind, s.obj, {p.template.role for p in s.gpu_pods})
        if own:
            return own
    if s.kind == "VolcanoJob":
        total = sum(p.template.replicas for p in s.pods)
        ma = spec.get("minAvailable")
        if isinstance(ma, int) and not isinstance(ma, bool) and ma < total:
            return f"minAvailable {ma} < {total} replicas"
    return None


def training_elastic_shrink(s: Subject) -> list[Violation]:
    """Checklist 2: training is never shrunk mid-run. Denies elastic training (PyTorchJob elasticPolicy,
    PET_NNODES range, Kueue elastic-job, Volcano minAvailable < replicas) and HPA/KEDA on training."""
    if s.kind in ("HorizontalPodAutoscaler", "ScaledObject"):
        target, tkind, tname = _target(s)
        cls = None
        if target is not None:
            cls = _target_class(target)
        elif tkind in (*KUBEFLOW_REPLICA_SPECS, "JobSet", "RayJob", "TrainJob"):
            cls = "training"
        if cls == "training":
            return [
                Violation(
                    f"{s.kind} scales training workload {tkind} {tname}; shrinking training restarts it "
                    f"from a checkpoint",
                    "queue and prioritise training instead of autoscaling it",
                )
            ]
        return []
    if not _training_pods(s):
        return []
    signal = _elastic_signal(s)
    if signal:
        return [
            Violation(
                f"elastic training: {signal}; a shrink restarts the job from its last checkpoint",
                "fix the replica count (min = max) and use a queue with priority for fragments",
            )
        ]
    return []


def training_queue_priority(s: Subject) -> list[Violation]:
    """Checklist 2: training is queued and prioritised. Flags training with neither a queue label nor a
    priorityClassName."""
    pods = _training_pods(s)
    if not pods or (s.kind == "Pod" and _controller_owned(s.obj)):
        return []  # a controller's pod: the queue and priority were judged on its workload at apply time
    for p in pods:
        if not has_queue(s, p) and not p.spec.get("priorityClassName"):
            return [
                Violation(
                    "training has neither a queue label nor a priorityClassName",
                    "add kueue.x-k8s.io/queue-name (or Volcano/KAI queue) or a priorityClassName",
                )
            ]
    return []


def _controller_owned(obj: Json) -> bool:
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    if isinstance(owners, list):
        for o in owners:  # (a loop, not any(): every controller-made pod is asked)
            if isinstance(o, dict) and o.get("controller") is True:
                return True
    return False


def _pinned_shared(s: Subject, p: Pod) -> bool:
    """Plain `nvidia.com/gpu` is shared when every node the pod may land on that offers it is time-sliced
    or MPS (by selector or because those are the only GPU nodes)."""
    return p.candidates(s.inventory).offer_gpu.all_shared


def shared_gpu_single(s: Subject) -> list[Violation]:
    """Checklist 3: a time-sliced / MPS GPU is one share; asking for more gives no extra GPU (or fails late
    at the kubelet with UnexpectedAdmissionError). Denies more than one unit of a shared resource."""
    out = []
    for p in s.gpu_pods:
        for c in p.ask.containers:
            for name, n in c.amounts.items():
                if n > 1 and (is_shared(name) or (name == GPU and _pinned_shared(s, p))):
                    out.append(
                        Violation(
                            f"container {c.name} asks {n} x {name} on time-sliced/MPS GPUs, which gives no extra GPU",
                            f"ask for 1 {name}, or use whole GPUs",
                        )
                    )
    return out[:1]


def _unshared_choice(config: str) -> str:
    # A shared MIG device is already a MIG device: only its sharing can go.
    return "use a MIG device (mig.nvidia.com), " if config == "GpuConfig" else ""


def online_no_timeslice(s: Subject) -> list[Violation]:
    """Checklist 3: time-slicing only for latency-insensitive work. Denies online inference on a
    time-sliced or MPS GPU (by resource name or by pinning to such nodes)."""
    for p in s.gpu_pods:
        if p.workload != "inference" or p.latency != "online":
            continue
        claimed = next((a for a in p.ask.claim_asks() if a.sharing), None)
        if claimed is not None:
            return [
                Violation(
                    f"online inference asks a time-sliced/MPS GPU through {claimed.describe()}: sharers get no "
                    f"memory or fault isolation",
                    f"drop the {claimed.config} sharing from the claim, {_unshared_choice(claimed.config)}or annotate "
                    "gpu-admission.io/latency: offline",
                )
            ]
        names = p.ask.resource_names()
        shared = sorted(n for n in names if is_shared(n))
        if shared or (GPU in names and _pinned_shared(s, p)):
            what = shared[0] if shared else "nvidia.com/gpu on time-sliced/MPS nodes"
            return [
                Violation(
                    f"online inference asks {what}: sharers get no memory or fault isolation",
                    "use whole GPUs or a MIG slice, or annotate gpu-admission.io/latency: offline",
                )
            ]
    return []


def inference_warm_pool(s: Subject) -> list[Violation]:
    """Checklist 2: inference scales with a warm pool (cold starts take seconds to minutes). Denies an HPA
    or KEDA ScaledObject for GPU inference whose minimum is below the warm pool, and the same minimum where a
    kind sets it itself (KServe minReplicas and scaling, Ray autoscaled worker groups: policies/ownscaling.py)."""
    if s.kind not in ("HorizontalPodAutoscaler", "ScaledObject"):
        return _own_warm_pool(s)
    target, tkind, tname = _target(s)
    if target is None or _target_class(target) != "inference":
        return []
    if not any(pod_ask(t.pod).asks_gpu for t in templates(target)):
        return []
    spec = s.obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    if s.kind == "HorizontalPodAutoscaler":
        field, default = "minReplicas", 1
    else:
        field, default = "minReplicaCount", 0
    value = spec.get(field, default)
    minimum = value if isinstance(value, int) and not isinstance(value, bool) else default
    if minimum < s.policy.warm_pool:
        return [
            Violation(
                f"{s.kind} {field} {minimum} lets GPU inference {tkind} {tname} drop below the warm "
                f"pool of {s.policy.warm_pool}",
                f"set {field}: {s.policy.warm_pool} or more",
            )
        ]
    return []


def _own_warm_pool(s: Subject) -> list[Violation]:
    if s.kind not in ownscaling.WARM_KINDS:
        return []
    roles = {p.template.role for p in s.gpu_pods if p.workload == "inference"}
    for field, minimum in ownscaling.warm_minimums(s.kind, s.obj, roles):
        if minimum < s.policy.warm_pool:
            return [
                Violation(
                    f"{field} {minimum} lets GPU inference {s.describe()} drop below the warm pool of "
                    f"{s.policy.warm_pool}",
                    f"set {field.rpartition('.')[2]}: {s.policy.warm_pool} or more",
                )
            ]
    return []


def _target(s: Subject) -> tuple[Json | None, str, str]:
    spec = s.obj.get("spec")
    ref: Any = spec.get("scaleTargetRef") if isinstance(spec, dict) else None
    ref = ref if isinstance(ref, dict) else {}
    kind = ref.get("kind") if isinstance(ref.get("kind"), str) else ("Deployment" if s.kind == "ScaledObject" else "")
    name = ref.get("name") if isinstance(ref.get("name"), str) else ""
    resolve = s.ctx.resolve
    target = resolve(str(kind), s.namespace, str(name)) if resolve and kind and name else None
    return target, str(kind), str(name)


def _target_class(target: Json) -> str | None:
    from policies import userkeys

    kind = effective_kind(target)
    keys = userkeys.read(target)
    return classify(kind, target, keys.workload)


def gpu_request_fits(s: Subject) -> list[Violation]:
    """Checklist 3 (slicing) and §1 of the GPU facts: a request the cluster can never satisfy is rejected
    at apply time, not left Pending. Checks whole-GPU count, MIG profiles, memory asks, mixing, and
    requests == limits."""
    inv = s.inventory
    for p in s.gpu_pods:
        ask = p.ask
        for c in ask.containers:
            if c.unparsable:
                return [
                    Violation(
                        f"container {c.name}: {c.unparsable[0]} is not a whole number",
                        "GPU resources are whole integers, e.g. nvidia.com/gpu: 1",
                    )
                ]
            if c.mismatched:
                return [
                    Violation(
                        f"container {c.name}: {c.mismatched[0]} request differs from its limit",
                        "set the GPU in limits (a request, if given, must equal the limit)",
                    )
                ]
            if GPU in c.amounts and any(is_mig(n) for n in c.amounts):
                return [
                    Violation(
                        f"container {c.name} mixes whole GPUs and MIG slices",
                        "ask for either nvidia.com/gpu or one nvidia.com/mig-* resource",
                    )
                ]
        if inv.empty:
            continue
        whole = ask.whole_gpus
        # A time-sliced / MPS node advertises replicas x GPUs units of nvidia.com/gpu: they are shares, not
        # GPUs, and more than one share gives nothing (shared-gpu-single). Count such a node as one.
        largest = inv.largest_gpu_units
        if whole > largest:
            return [
                Violation(
                    f"one pod asks {whole} nvidia.com/gpu but the largest GPU node has {largest}",
                    "split the job into more pods (one node's worth each)",
                )
            ]
        for name in sorted(n for n in ask.resource_names() if is_mig(n)):
            if not inv.offers(name):
                offered = sorted(r for r in inv.resources if is_mig(r))
                hint = f"; offered: {', '.join(offered[:4])}" if offered else ""
                claimed = any(name in c.claimed for c in ask.containers)
                fix = (
                    "select an offered profile in the claim (device.attributes['gpu.nvidia.com'].profile)"
                    if claimed
                    else "use gpu-admission.io/gpu-memory to get the matching slice"
                )
                return [Violation(f"no GPU in the cluster offers {name}{hint}", fix)]
        for a in ask.claim_asks():
            if a.memory is not None and inv.max_memory_bytes and a.memory > inv.max_memory_bytes:
                return [
                    Violation(
                        f"{a.describe()} selects GPUs with more than {format_bytes(a.memory)} of memory; the "
                        f"largest has {format_bytes(inv.max_memory_bytes)}",
                        "lower the memory in the claim's CEL selector or ask for more GPUs",
                    )
                ]
        memory = p.keys.gpu_memory
        if memory is not None and memory > inv.max_memory_bytes:
            most = format_bytes(inv.max_memory_bytes)
            return [
                Violation(
                    f"gpu-memory {format_bytes(memory)} is more than any GPU has ({most})",
                    "ask for less memory or whole GPUs",
                )
            ]
    return []


def dra_claims(s: Subject) -> list[Violation]:
    """GPUs asked through DRA must be judgeable: denies a claim request (or `deviceclass.resource.kubernetes.io/`
    extended resource) naming a DeviceClass the cluster does not have, or a CEL selector that does not parse,
    which would leave the pod Pending; a claim whose template is not there yet is a warning only (`kubectl
    apply -f dir/` may create it after the workload)."""
    errors: list[str] = []
    for p in s.pods:
        claims = p.ask.claims
        if claims is None:
            continue
        errors += claims.errors
        s.notes.extend(f"dra-claims: {n}" for n in claims.notes if f"dra-claims: {n}" not in s.notes)
    if not errors:
        return []
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return [Violation(errors[0] + more, "use a DeviceClass the cluster has (kubectl get deviceclasses) and valid CEL")]


def gpu_admission_annotations(s: Subject) -> list[Violation]:
    """Users asked for rejections rather than silently ignored annotations: denies an unknown
    `gpu-admission.io/` key or a value that does not parse."""
    errors = sorted({e for p in s.pods for e in p.keys.errors})
    for p in s.pods:
        if p.keys.gpu_memory is not None and p.ask.asks_gpu and not any(_one_unit(p, c) for c in p.ask.containers):
            errors.append(
                f"annotation gpu-admission.io/gpu-memory on {p.template.role} has no effect: it applies to a "
                f"container asking exactly one nvidia.com/gpu"
            )
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return [Violation(errors[0] + more, "fix or remove the key (see docs/policy.md for the keys)")]
    return []


def _one_unit(p: Pod, c: ContainerAsk) -> bool:
    """The container asks one GPU unit: one `nvidia.com/` unit in its limits, or (no claims in the pod) one
    device of a DeviceClass by extended resource, as gpu-memory-class leaves it."""
    asked = c.claimed if not c.amounts and not p.ask.claim_asks() else c.amounts
    return len(asked) == 1 and next(iter(asked.values())) == 1


def _registry() -> tuple[Rule, ...]:
    fns: tuple[tuple[str, RuleFn, bool], ...] = (
        ("gpu-admission-annotations", gpu_admission_annotations, False),
        ("gpu-request-fits", gpu_request_fits, False),
        ("dra-claims", dra_claims, False),
        ("training-same-rack", training_same_rack, False),
        ("training-topology-scheduler", training_topology_scheduler, False),
        ("scheduler-topology-keys", scheduler_topology_keys, False),
        ("training-elastic-shrink", training_elastic_shrink, True),
        ("training-queue-priority", training_queue_priority, False),
        ("shared-gpu-single", shared_gpu_single, False),
        ("online-no-timeslice", online_no_timeslice, False),
        ("inference-warm-pool", inference_warm_pool, True),
    )
    return tuple(Rule(rid, fn, (fn.__doc__ or "").strip(), el) for rid, fn, el in fns)


RULES: tuple[Rule, ...] = _registry()
