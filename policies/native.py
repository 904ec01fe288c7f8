"""Native admission policies: the rules that need no node inventory, no pod view and no other object, written
as ValidatingAdmissionPolicies (CEL run inside the API server) from the same policy document.

Pure: a compiled policy in, plain JSON objects out. `gpu-admission policy native` prints them; `serve --native`
then skips the same rules (`NATIVE_RULES`) so no check runs twice. Each rule here mirrors its Python twin in
policies/rules.py, on the object after every mutating webhook (ours included) has run, as the webhook's
validating call sees it; `tests/e2e/test_native_e2e.py` runs every golden case through both and compares.

What is not generated, and why, is in `NOT_NATIVE` (docs/policy.md, "Native policies").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.classify import BATCH_KINDS, INFERENCE_KINDS, TRAINING_KINDS
from policies.document import Policy
from policies.mutations import QUEUE_ANNOTATIONS, QUEUE_LABELS
from policies.userkeys import CLASSES, ENFORCEMENT, NATIVE_EXCEPTED, PREFIX, WORKLOAD
from policies.workloads import KUBEFLOW_REPLICA_SPECS

Json = dict[str, Any]

API = "admissionregistration.k8s.io/v1"
NAME_PREFIX = "gpu-admission-"
MANAGED_BY = {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/component": "native-policy"}
DEFAULT_EXCLUDED = ("kube-system", "kube-node-lease", "kube-public", "gpu-admission")
_VAP_ACTION = {"enforce": "Deny", "warn": "Warn", "audit": "Audit"}
_RANK = {"off": 0, "audit": 1, "warn": 2, "enforce": 3}
_MODES = ("enforce", "warn", "audit", "off")


@dataclass(frozen=True)
class NativeRule:
    id: str
    checklist: str
    validation: str  # CEL: true when the object passes
    message: str  # CEL messageExpression: the webhook's denial message, to the letter
    elasticity_kinds_stay: bool  # the HPA / ScaledObject half stays in the webhook (it reads another object)


# --- CEL building blocks (object is dyn in ValidatingAdmissionPolicy: every field read is guarded) ----------


def _q(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _list(items: Any) -> str:
    return "[" + ", ".join(_q(i) for i in sorted(items)) + "]"


def _meta(base: str, section: str, key: str) -> str:
    """The value of a label or annotation, '' when absent (or when metadata is not a mapping)."""
    return f"{base}.?metadata.?{section}[?{_q(key)}].orValue('')"


def _has_key(base: str, section: str, keys: Any) -> str:
    return f"{_list(keys)}.exists(k, k in {base}.?metadata.?{section}.orValue({{}}))"


def _one(optional: str) -> str:
    """[value] of an optional field path, [] when it is absent."""
    return f"({optional}.hasValue() ? [{optional}.value()] : [])"


def _templates() -> str:
    """Every pod template of the object (the object itself for a Pod), as policies/workloads.templates."""
    spec = "object.?spec"
    branches = [
        ("variables.kind == 'Pod'", "[object]"),
        (
            f"variables.kind in {_list(['Deployment', 'StatefulSet', 'ReplicaSet', 'DaemonSet', 'Job'])}",
            _one(f"{spec}.?template"),
        ),
        ("variables.kind == 'CronJob'", _one(f"{spec}.?jobTemplate.?spec.?template")),
    ]
    for kind, key in sorted(KUBEFLOW_REPLICA_SPECS.items()):
        specs = f"{spec}.?{key}.orValue({{}})"
        branches.append(
            (
                f"variables.kind == {_q(kind)}",
                f"{specs}.map(r, {specs}[r]).filter(rs, has(rs.template)).map(rs, rs.template)",
            )
        )
    rjs = f"{spec}.?replicatedJobs.orValue([])"
    branches.append(
        (
            "variables.kind == 'JobSet'",
            f"{rjs}.filter(rj, rj.?template.?spec.?template.hasValue()).map(rj, rj.template.spec.template)",
        )
    )
    lwt = f"{spec}.?leaderWorkerTemplate"
    branches.append(
        (
            "variables.kind == 'LeaderWorkerSet'",
            f"{_one(lwt + '.?leaderTemplate')} + {_one(lwt + '.?workerTemplate')}",
        )
    )
    tasks = f"{spec}.?tasks.orValue([])"
    branches.append(("variables.kind == 'VolcanoJob'", f"{tasks}.filter(t, has(t.template)).map(t, t.template)"))
    for kind, base in (("RayJob", f"{spec}.?rayClusterSpec"), ("RayCluster", spec)):
        head = _one(f"{base}.?headGroupSpec.?template")
        wgs = f"{base}.?workerGroupSpecs.orValue([]).filter(w, has(w.template)).map(w, w.template)"
        branches.append((f"variables.kind == {_q(kind)}", f"{head} + {wgs}"))
    expr = "[]"
    for cond, value in reversed(branches):
        expr = f"{cond} ? {value} : ({expr})"
    return expr


def _asks_gpu(t: str) -> str:
    """The template asks for a GPU (policies/resources.PodAsk.asks_gpu): an nvidia.com/ resource in limits, or
    in requests without a limit, whose amount is not a whole zero (an unparsable amount counts: the
    gpu-request-fits rule judges it)."""
    containers = f"({t}.?spec.?containers.orValue([]) + {t}.?spec.?initContainers.orValue([]))"
    nonzero = "!(string({v}).matches('^[0-9]+$') && int(string({v})) == 0)"
    limits, requests = "c.?resources.?limits.orValue({})", "c.?resources.?requests.orValue({})"
    in_limits = f"{limits}.exists(k, k.startsWith('nvidia.com/') && {nonzero.format(v=limits + '[k]')})"
    in_requests = (
        f"{requests}.exists(k, k.startsWith('nvidia.com/') && !(k in {limits}) && {nonzero.format(v=requests + '[k]')})"
    )
    return f"{containers}.exists(c, {in_limits} || {in_requests})"


def _by_pod() -> str:
    """A bare pod's class from its controller's labels, then its controlling owner (policies/classify.by_pod)."""
    from policies import classify

    owners = "object.?metadata.?ownerReferences.orValue([]).filter(o, o.?controller.orValue(true) != false && "
    owner_class = dict(sorted(classify._OWNER_CLASS.items()))
    owners += f"o.?kind.orValue('') in {_list(owner_class)})"
    table = "{" + ", ".join(f"{_q(k)}: {_q(v)}" for k, v in owner_class.items()) + "}"
    return (
        f"{_has_key('object', 'labels', classify._TRAINING_POD_LABELS)} ? 'training' : "
        f"{_has_key('object', 'labels', ['leaderworkerset.sigs.k8s.io/name'])} ? 'inference' : "
        f"{_has_key('object', 'labels', ['batch.kubernetes.io/job-name', 'job-name', 'ray.io/cluster'])} ? 'batch' : "
        f"size({owners}) > 0 ? {table}[{owners}[0].kind] : ''"
    )


def _kind_class() -> str:
    """The class from the kind (policies/classify.by_kind; by_pod for a Pod)."""
    par = "object.?spec.?parallelism.orValue(1)"
    return (
        f"variables.kind in {_list(TRAINING_KINDS)} ? 'training' : "
        f"variables.kind in {_list(INFERENCE_KINDS)} ? 'inference' : "
        f"variables.kind in {_list(BATCH_KINDS)} ? 'batch' : "
        f"variables.kind == 'Job' ? (type({par}) == int && {par} > 1 ? 'training' : 'batch') : "
        f"variables.kind == 'Pod' ? ({_by_pod()}) : ''"
    )


def _class(t: str) -> str:
    """A template's class: its valid gpu-admission.io/workload label, the object's, then the kind's."""
    own = _meta(t, "labels", WORKLOAD)
    return f"({own} in {_list(CLASSES)} ? {own} : variables.objectClass)"


def _variables() -> list[Json]:
    obj_label = _meta("object", "labels", WORKLOAD)
    return [
        {
            "name": "kind",
            "expression": "request.kind.kind == 'Job' && request.kind.group == 'batch.volcano.sh' ? 'VolcanoJob' : "
            "request.kind.kind",
        },
        {"name": "templates", "expression": _templates()},
        {
            "name": "objectClass",
            "expression": f"variables.kind != 'Pod' && {obj_label} in {_list(CLASSES)} ? {obj_label} : "
            f"({_kind_class()})",
        },
        {"name": "gpu", "expression": f"variables.templates.filter(t, {_asks_gpu('t')})"},
        {"name": "training", "expression": f"variables.gpu.filter(t, {_class('t')} == 'training')"},
    ]


# --- the rules --------------------------------------------------------------------------------------------


def _queue_priority() -> NativeRule:
    labels = _has_key("object", "labels", QUEUE_LABELS) + " || " + _has_key("t", "labels", QUEUE_LABELS)
    annotations = (
        _has_key("object", "annotations", QUEUE_ANNOTATIONS) + " || " + _has_key("t", "annotations", QUEUE_ANNOTATIONS)
    )
    volcano = "(variables.kind == 'VolcanoJob' && object.?spec.?queue.orValue('') != '')"
    queued = f"({labels} || {annotations} || {volcano})"
    owned = "object.?metadata.?ownerReferences.orValue([]).exists(o, o.?controller.orValue(false) == true)"
    fine = f"{queued} || t.?spec.?priorityClassName.orValue('') != ''"
    # Cheapest first (the API server stops at the first true): every template queued or prioritised passes
    # without classifying anything, as most workloads do.
    validation = (
        f"variables.templates.all(t, {fine}) || (variables.kind == 'Pod' && {owned}) || "
        f"variables.training.all(t, {fine})"
    )
    message = _q(
        "training-queue-priority: training has neither a queue label nor a priorityClassName. Fix: add "
        "kueue.x-k8s.io/queue-name (or Volcano/KAI queue) or a priorityClassName"
    )
    return NativeRule("training-queue-priority", "2. queue + priority", validation, message, False)


def _elastic_shrink() -> NativeRule:
    ep = "object.?spec.?elasticPolicy"
    lo, hi = f"{ep}.?minReplicas.orValue(0)", f"{ep}.?maxReplicas.orValue(0)"
    elastic_policy = (
        f"variables.kind == 'PyTorchJob' && type({lo}) == int && type({hi}) == int && "
        f"{ep}.?minReplicas.hasValue() && {ep}.?maxReplicas.hasValue() && {lo} < {hi}"
    )
    kueue_key = "kueue.x-k8s.io/elastic-job"
    holders = "([object] + variables.templates)"
    kueue = (
        f"{holders}.exists(h, {_meta('h', 'labels', kueue_key)} == 'true' || "
        f"{_meta('h', 'annotations', kueue_key)} == 'true')"
    )
    env = (
        "variables.templates.map(t, t.?spec.?containers.orValue([]) + t.?spec.?initContainers.orValue([]))"
        ".map(cs, cs.map(c, c.?env.orValue([]).filter(e, e.?name.orValue('') == 'PET_NNODES' && "
        "type(e.?value.orValue(0)) == string && e.value.matches('^[0-9]+:[0-9]+$') && "
        "int(e.value.split(':')[0]) < int(e.value.split(':')[1])).map(e, e.value)))"
    )
    pet = f"{env}.exists(cs, cs.exists(vs, size(vs) > 0))"
    pet_value = f"{env}.filter(cs, cs.exists(vs, size(vs) > 0))[0].filter(vs, size(vs) > 0)[0][0]"
    tasks = "object.?spec.?tasks.orValue([]).filter(t, has(t.template))"
    total = f"{tasks}.map(t, type(t.?replicas.orValue(1)) == int ? t.?replicas.orValue(1) : 1).sum()"
    ma = "object.?spec.?minAvailable.orValue(0)"
    volcano = (
        f"variables.kind == 'VolcanoJob' && object.?spec.?minAvailable.hasValue() && type({ma}) == int && "
        f"{ma} < {total}"
    )
    validation = f"!({elastic_policy} || {kueue} || {pet} || {volcano}) || size(variables.training) == 0"
    signal = (
        f"{elastic_policy} ? 'elasticPolicy minReplicas ' + string({lo}) + ' < maxReplicas ' + string({hi}) : "
        f"{kueue} ? 'kueue.x-k8s.io/elastic-job is true' : "
        f"{pet} ? 'PET_NNODES=' + {pet_value} + ' lets the job shrink' : "
        f"'minAvailable ' + string({ma}) + ' < ' + string({total}) + ' replicas'"
    )
    message = (
        f"'training-elastic-shrink: elastic training: ' + ({signal}) + '; a shrink restarts the job from its last "
        "checkpoint. Fix: fix the replica count (min = max) and use a queue with priority for fragments'"
    )
    return NativeRule("training-elastic-shrink", "2. never shrink training", validation, message, True)


def _tier_ok(opt: str) -> str:
    """A Volcano highest tier that places something (policies/schedkeys._tier): a whole number >= 1. (By
    pattern: the API server's CEL refused int() of an optional's value, "no such overload: int(string)".)"""
    v = f"{opt}.value()"
    return (
        f"({opt}.hasValue() && ((type({v}) == int && {v} >= 1) || "
        f"(type({v}) == string && {v}.matches('^0*[1-9][0-9]*$'))))"
    )


def _topology_keys() -> NativeRule:
    from policies import schedkeys as sk

    own = "object.?metadata.?annotations.orValue({})"
    kueue = f"variables.kind != 'Pod' && {own}.exists(k, k.startsWith({_q(sk.KUEUE_PREFIX)}) && k.endsWith('topology'))"
    kai_keys = _list(sk.KAI_KEYS)
    on_templates = (
        f"variables.kind != 'Pod' && variables.templates.exists(t, {kai_keys}.exists(k, "
        f"k in t.?metadata.?annotations.orValue({{}}) && !(k in {own})))"
    )
    preferred = "kai.scheduler/topology-preferred-placement"
    placement = (
        f"({_meta('object', 'annotations', sk.KAI_REQUIRED)} != '' || {_meta('object', 'annotations', preferred)} "
        f"!= '') && {_meta('object', 'annotations', sk.KAI_TOPOLOGY)} == ''"
    )
    nt = "object.?spec.?networkTopology"

    def hard_without_tier(holder: str) -> str:
        mode = _meta(holder, "annotations", sk.VOLCANO_MODE)
        tier = f"{holder}.?metadata.?annotations[?{_q(sk.VOLCANO_TIER)}]"
        return f"({mode} == 'hard' && !{_tier_ok(tier)})"

    volcano = (
        f"variables.templates.exists(t, variables.kind == 'VolcanoJob' && type({nt}.orValue(0)) == map ? "
        f"({nt}.?mode.orValue('') == 'hard' && !{_tier_ok(nt + '.?highestTierAllowed')}) : "
        f"{_meta('t', 'annotations', sk.VOLCANO_MODE)} != '' ? {hard_without_tier('t')} : "
        f"{hard_without_tier('object')})"
    )
    found = (
        f"[{kueue} ? 'Kueue reads kueue.x-k8s.io/podset-*-topology from pod templates, not the ' + variables.kind "
        f": '', {on_templates} ? 'KAI reads kai.scheduler/topology* from the ' + variables.kind + ', not its pod "
        f"templates' : '', {placement} ? 'KAI placement annotations need {sk.KAI_TOPOLOGY} (the name of the "
        f"Topology)' : '', {volcano} ? 'Volcano hard network topology without highestTierAllowed confines "
        f"nothing' : ''].filter(m, m != '')"
    )
    # Cheapest first: no key of these schedulers anywhere (most objects) passes without building the findings.
    keys = _list([sk.KUEUE_PREFIX, "kai.scheduler/topology", sk.VOLCANO_MODE])
    holders = "([object] + variables.templates)"
    any_key = (
        f"variables.kind == 'VolcanoJob' || {holders}.exists(h, h.?metadata.?annotations.orValue({{}}).exists(k, "
        f"{keys}.exists(p, k.startsWith(p))))"
    )
    validation = f"!({any_key}) || size({found}) == 0 || size(variables.gpu) == 0"
    message = (
        f"'scheduler-topology-keys: ' + {found}[0] + (size({found}) > 1 ? ' (+' + string(size({found}) - 1) + "
        f"' more)' : '') + '. Fix: move each key to where its scheduler reads it (docs/policy.md)'"
    )
    return NativeRule("scheduler-topology-keys", "4. topology schedulers", validation, message, False)


NATIVE: tuple[NativeRule, ...] = (_queue_priority(), _elastic_shrink(), _topology_keys())
NATIVE_RULES = frozenset(r.id for r in NATIVE)

# GPUPolicyExceptions for native rules. A ValidatingAdmissionPolicy cannot read them (a parameter resource is
# evaluated one at a time, every one must pass: the opposite of "any live exception lets it through"), so the
# webhook's mutating call, which reads them, writes the native rules a live exception lets this object skip
# here, comma-separated, and each policy skips its rule when named. The webhook sets or removes the annotation
# on every object it reviews under `serve --native`, so a value a user wrote never reaches the policies
# (docs/policy.md, "Native policies": what that relies on).
EXCEPTED_ANNOTATION = NATIVE_EXCEPTED

# --- mutations: MutatingAdmissionPolicies (JSONPatch) ------------------------------------------------------

MAP_MUTATIONS = ("gpu-toleration", "scheduler-queue")  # the registry ids that need no inventory or pod view
_CHECKLIST = {"gpu-toleration": "GPU nodes' taints tolerated", "scheduler-queue": "2. queue + priority"}
KAI_SCHEDULER = "kai-scheduler"


def mutation_blocker(mid: str, policy: Policy) -> str:
    """Why this mutation cannot be a MutatingAdmissionPolicy under this policy ('' when it can). The API server
    runs MutatingAdmissionPolicies BEFORE mutating webhooks, so a mutation is native only where no earlier
    mutation of the webhook reads what it writes; and one that would change nothing gets no object."""
    if not policy.mutations.get(mid, False):
        return "off in the policy"
    if mid == "gpu-toleration":
        return "" if policy.tolerations else "no gpuNodes.tolerations in the policy: nothing to add"
    if not (policy.scheduler_name or policy.queue_system or policy.priority_class):
        return "no training schedulerName, queue or priorityClassName in the policy: nothing to add"
    if policy.queue_system == "kai":
        return (
            "a KAI queue label goes on the object and on the first template lacking one (an order CEL over a "
            "map does not keep)"
        )
    rack = policy.mutations.get("training-rack", False)
    if rack and policy.gang_kueue and policy.queue_system == "kueue":
        return "training-rack reads the Kueue queue label it adds (gangSchedulers.kueue) and runs first in the webhook"
    if rack and policy.gang_kai_topology and policy.scheduler_name == KAI_SCHEDULER:
        return (
            "training-rack reads the schedulerName it sets (gangSchedulers.kaiTopology) and runs first in the webhook"
        )
    return ""


def native_mutations(policy: Policy) -> frozenset[str]:
    """The mutations `generate` writes as MutatingAdmissionPolicies for this policy (`serve --native-mutations`
    skips exactly these, on the pods `cel_asks_gpu` sees)."""
    return frozenset(m for m in MAP_MUTATIONS if not mutation_blocker(m, policy))


def _gpu_amount(value: Any) -> bool:
    """A nvidia.com/ amount that asks (the CEL of `_asks_gpu`: anything but a whole-number zero)."""
    text = str(value) if not isinstance(value, bool) else ("true" if value else "false")
    return not (text.isascii() and text.isdigit() and int(text) == 0)


def cel_asks_gpu(pod: Any) -> bool:
    """The Python twin of `_asks_gpu`: what the MutatingAdmissionPolicies see as a GPU template. A pod the
    webhook counts as asking for GPUs for another reason (DRA claims, an extended resource of a DeviceClass)
    is mutated by the webhook itself."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return False
    for key in ("containers", "initContainers"):
        cs = spec.get(key)
        for c in cs if isinstance(cs, list) else []:
            res = c.get("resources") if isinstance(c, dict) else None
            limits = res.get("limits") if isinstance(res, dict) else None
            requests = res.get("requests") if isinstance(res, dict) else None
            limits = limits if isinstance(limits, dict) else {}
            requests = requests if isinstance(requests, dict) else {}
            for k, v in limits.items():
                if isinstance(k, str) and k.startswith("nvidia.com/") and _gpu_amount(v):
                    return True
            for k, v in requests.items():
                if isinstance(k, str) and k.startswith("nvidia.com/") and k not in limits and _gpu_amount(v):
                    return True
    return False


def _ptr(*keys: str) -> str:
    """A JSON pointer (RFC 6901) of constant keys."""
    return "".join("/" + k.replace("~", "~0").replace("/", "~1") for k in keys)


def _patch(path: str, value: str) -> str:
    """One JSONPatch `add` (CEL); `path` is a CEL string expression."""
    return f"JSONPatch{{op: 'add', path: {path}, value: {value}}}"


def _cel(value: Any) -> str:
    """A constant JSON value as a CEL literal."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_q(k)}: {_cel(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_cel(v) for v in value) + "]"
    return _q(value)


def _set_key(holder: str, path: str, section: str, key: str, value: str) -> str:
    """Patches adding metadata.<section>[key] = value to the object at `holder` (CEL) / `path` (CEL string),
    creating metadata and the section when missing, as the webhook's `_path` does."""
    whole = _patch(f"{path} + {_q(_ptr('metadata'))}", f"{{{_q(section)}: {{{_q(key)}: {_q(value)}}}}}")
    sec = _patch(f"{path} + {_q(_ptr('metadata', section))}", f"{{{_q(key)}: {_q(value)}}}")
    one = _patch(f"{path} + {_q(_ptr('metadata', section, key))}", _q(value))
    return (
        f"(!{holder}.?metadata.hasValue() || {holder}.metadata == null ? [{whole}] : "
        f"!{holder}.metadata.?{section}.hasValue() || {holder}.metadata[{_q(section)}] == null ? [{sec}] : "
        f"type({holder}.metadata[{_q(section)}]) == map ? [{one}] : [])"
    )


def _per_template(body: Any) -> str:
    """Every pod template of the object with its JSON pointer, as `_templates` lists them: body(t, path) is the
    CEL list of patches for one template; the result is the flattened list over all of them."""
    spec = "object.?spec"
    single = _list(["Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job"])
    branches = [
        ("variables.kind == 'Pod'", body("object", "''")),
        (f"variables.kind in {single}",
         f"({spec}.?template.hasValue() ? {body('object.spec.template', _q('/spec/template'))} : [])"),
        ("variables.kind == 'CronJob'",
         f"({spec}.?jobTemplate.?spec.?template.hasValue() ? "
         f"{body('object.spec.jobTemplate.spec.template', _q('/spec/jobTemplate/spec/template'))} : [])"),
    ]  # fmt: skip
    for kind, key in sorted(KUBEFLOW_REPLICA_SPECS.items()):
        specs = f"{spec}.?{key}.orValue({{}})"
        path = f"{_q('/spec/' + key + '/')} + jsonpatch.escapeKey(r) + '/template'"
        branches.append(
            (f"variables.kind == {_q(kind)}",
             f"{specs}.filter(r, has({specs}[r].template)).map(r, {body(specs + '[r].template', path)}).flatten()")
        )  # fmt: skip
    rjs = f"{spec}.?replicatedJobs.orValue([])"
    rj_path = "'/spec/replicatedJobs/' + string(i) + '/template/spec/template'"
    branches.append(
        ("variables.kind == 'JobSet'",
         f"{rjs}.transformList(i, rj, rj.?template.?spec.?template.hasValue(), "
         f"{body('rj.template.spec.template', rj_path)}).flatten()")
    )  # fmt: skip
    lwt = f"{spec}.?leaderWorkerTemplate"
    lws = [
        f"({lwt}.?{role}.hasValue() ? "
        f"{body('object.spec.leaderWorkerTemplate.' + role, _q('/spec/leaderWorkerTemplate/' + role))} : [])"
        for role in ("leaderTemplate", "workerTemplate")
    ]
    branches.append(("variables.kind == 'LeaderWorkerSet'", " + ".join(lws)))
    tasks = f"{spec}.?tasks.orValue([])"
    task_path = "'/spec/tasks/' + string(i) + '/template'"
    branches.append(
        ("variables.kind == 'VolcanoJob'",
         f"{tasks}.transformList(i, tk, has(tk.template), {body('tk.template', task_path)}).flatten()")
    )  # fmt: skip
    expr = "[]"
    for cond, value in reversed(branches):
        expr = f"{cond} ? {value} : ({expr})"
    return expr


def _same_toleration(x: str, t: Json) -> str:
    """The existing toleration x equals t (the webhook compares the whole item: t has no tolerationSeconds)."""
    fields = [f"{x}.?{f}.orValue('') == {_q(t.get(f, ''))}" for f in ("key", "operator", "value", "effect")]
    return "(" + " && ".join([*fields, f"!{x}.?tolerationSeconds.hasValue()"]) + ")"


def _toleration_patches(policy: Policy) -> str:
    wanted: list[Json] = []
    for t in policy.tolerations:
        if t.as_json() not in wanted:  # the webhook skips an item it has just added
            wanted.append(t.as_json())

    def body(t: str, path: str) -> str:
        tols = f"{t}.spec.?tolerations"
        missing = [(w, f"!{tols}.orValue([]).exists(x, {_same_toleration('x', w)})") for w in wanted]
        each = " + ".join(f"({cond} ? [{_cel(w)}] : [])" for w, cond in missing)
        # absent or null: all of them (reading a null list would fail the whole patch, refusing the object)
        whole = _patch(f"{path} + '/spec/tolerations'", _cel(wanted))
        append = "(" + each + ").map(v, " + _patch(path + " + '/spec/tolerations/-'", "v") + ")"
        absent = f"(!{tols}.hasValue() || {t}.spec.tolerations == null)"
        listed = f"type({tols}.orValue(0)) == list"
        return f"(!{_asks_gpu(t)} ? [] : {absent} ? [{whole}] : {listed} ? {append} : [])"

    return _per_template(body)


def _queued(t: str) -> str:
    labels = _has_key("object", "labels", QUEUE_LABELS) + " || " + _has_key(t, "labels", QUEUE_LABELS)
    annotations = (
        _has_key("object", "annotations", QUEUE_ANNOTATIONS) + " || " + _has_key(t, "annotations", QUEUE_ANNOTATIONS)
    )
    volcano = "(variables.kind == 'VolcanoJob' && object.?spec.?queue.orValue('') != '')"
    return f"({labels} || {annotations} || {volcano})"


def _queue_patches(policy: Policy) -> str:
    def body(t: str, path: str) -> str:
        ops: list[str] = []
        if policy.scheduler_name:
            name = _patch(f"{path} + '/spec/schedulerName'", _q(policy.scheduler_name))
            ops.append(f"({t}.spec.?schedulerName.orValue('') in ['', 'default-scheduler'] ? [{name}] : [])")
        if policy.queue_system == "volcano":
            add = _set_key(t, path, "annotations", "scheduling.volcano.sh/queue-name", policy.queue_name)
            ops.append(f"(variables.kind != 'VolcanoJob' && !{_queued(t)} ? {add} : [])")
        if policy.priority_class:
            prio = _patch(f"{path} + '/spec/priorityClassName'", _q(policy.priority_class))
            ops.append(f"(variables.kind != 'Pod' && {t}.spec.?priorityClassName.orValue('') == '' ? [{prio}] : [])")
        training = f"{_asks_gpu(t)} && {_class(t)} == 'training'"
        return f"(!({training}) ? [] : {' + '.join(ops) or '[]'})"

    out = f"({_per_template(body)})"  # parenthesised: the object-level patches are appended
    lacking = "variables.training.exists(t, !" + _queued("t") + ")"
    if policy.queue_system == "kueue":  # on the workload object (the pod itself for a plain pod), once
        label = _set_key("object", "''", "labels", "kueue.x-k8s.io/queue-name", policy.queue_name)
        out += f" + ({lacking} ? {label} : [])"
    if policy.queue_system == "volcano":
        spec_queue = _patch("'/spec/queue'", _q(policy.queue_name))
        out += f" + (variables.kind == 'VolcanoJob' && {lacking} ? [{spec_queue}] : [])"
    return out


def _map(mid: str, policy: Policy) -> Json:
    expression = _toleration_patches(policy) if mid == "gpu-toleration" else _queue_patches(policy)
    return {
        "apiVersion": API,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {
            "name": NAME_PREFIX + mid,
            "labels": dict(MANAGED_BY),
            "annotations": {
                "gpu-admission.io/mutation": mid,
                "gpu-admission.io/checklist": _CHECKLIST[mid],
                "gpu-admission.io/policy-hash": policy.hash,
            },
        },
        "spec": {
            "failurePolicy": "Fail" if policy.failure_mode == "closed" else "Ignore",
            # Like the webhook's configurations: run again when a later mutation changes the object
            # (every patch here checks for its own earlier output, so a second run adds nothing).
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {"resourceRules": _resource_rules()},
            "matchConditions": _match_conditions(),
            "variables": _variables(),
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
        },
    }


def _map_binding(mid: str, policy: Policy, excluded: tuple[str, ...]) -> Json:
    """Mutations apply in every namespace whose enforcement is not `off` (policies/engine.py)."""
    exprs: list[Json] = [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(excluded)}]
    if policy.default_enforcement == "off":  # only namespaces labelled with another valid mode
        exprs.append({"key": ENFORCEMENT, "operator": "In", "values": [m for m in _MODES if m != "off"]})
    else:
        exprs.append({"key": ENFORCEMENT, "operator": "NotIn", "values": ["off"]})
    return {
        "apiVersion": API,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": NAME_PREFIX + mid, "labels": dict(MANAGED_BY)},
        "spec": {"policyName": NAME_PREFIX + mid, "matchResources": {"namespaceSelector": {"matchExpressions": exprs}}},
    }


# Why each other rule and mutation stays in the webhook (docs/policy.md, "Native policies").
NOT_NATIVE: Mapping[str, str] = {
    "training-same-rack": "needs the node inventory (topology levels) and the pod view (placement)",
    "training-topology-scheduler": "needs the node inventory (GPUs per node, NVLink cliques)",
    "shared-gpu-single": "needs the node inventory (which nodes a plain nvidia.com/gpu pod can land on are shared)",
    "online-no-timeslice": "needs the node inventory (time-sliced nodes a pod is pinned to)",
    "inference-warm-pool": "reads another object (the autoscaler's target)",
    "gpu-request-fits": "needs the node inventory (largest node, offered MIG profiles, GPU memory)",
    "dra-claims": "reads other objects (the pod's ResourceClaims and templates) and the cluster's DeviceClasses",
    "gpu-admission-annotations": "its value parsing and did-you-mean hints have no CEL equivalent with the same "
    "verdicts (quantities are parsed by our own grammar)",
    "training-elastic-shrink (HorizontalPodAutoscaler, ScaledObject)": "reads another object (the target's class)",
    "gpu-slice": "needs the node inventory (the smallest slice the nodes offer that covers the ask)",
    "gpu-memory-class": "needs the cluster's ResourceSlices and the DeviceClasses `policy deviceclasses` "
    "generated (the best-fit class)",
    "training-pool": "needs the node inventory (whole-card GPU nodes, or the policy's pool)",
    "online-exclusive": "needs the node inventory (time-sliced and MPS nodes)",
    "training-rack": "needs the node inventory (topology levels) and the pod view (the domain that holds the gang)",
    "training-node-pack": "needs the node inventory (GPUs per node)",
    "reserved-keep-off": "needs the pod view and the server's live reservations (GPUs promised to pinned gangs)",
    "inference-spread": "needs the node inventory (whether GPU nodes carry zones)",
    "inference-group": "needs the node inventory (the level that holds a group's GPUs)",
    "job-size": "counts the job's GPUs with our quantity grammar over every template (parallelism x per-pod "
    "whole GPUs), which has no CEL twin with the same result",
}

# The (effective) kinds the policies judge: the webhook skips native rules on these only (policies/engine.py).
# A kind the engine learns later (TrainJob, RayService, ...) keeps every rule in the webhook until it is added
# here, to `_MATCH_RULES` and to `_templates`. RayJob and RayCluster are out: a Ray autoscaler that can
# shrink a GPU worker group is elastic training (policies/ownscaling.py), which the CEL here does not read.
COVERED_KINDS = frozenset(
    {"Pod", "Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job", "CronJob", *KUBEFLOW_REPLICA_SPECS,
     "JobSet", "LeaderWorkerSet", "VolcanoJob"}
)  # fmt: skip

# What each VAP matches: every kind the engine reviews for these rules (pod templates), CREATE and UPDATE.
_MATCH_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "v1", ("pods",)),
    ("apps", "v1", ("deployments", "statefulsets", "replicasets", "daemonsets")),
    ("batch", "v1", ("jobs", "cronjobs")),
    ("kubeflow.org", "*", ("pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs")),
    ("jobset.x-k8s.io", "*", ("jobsets",)),
    ("leaderworkerset.x-k8s.io", "*", ("leaderworkersets",)),
    ("batch.volcano.sh", "*", ("jobs",)),
)


def _cap(action: str, mode: str) -> str:
    return action if _RANK[action] <= _RANK[mode] else mode


def _namespace_groups(action: str, default_mode: str) -> dict[str, list[str]]:
    """VAP action -> the namespace label values that lead to it ("" stands for no label or an invalid one,
    which take the policy's defaultEnforcement, as policies/userkeys.namespace_mode)."""
    out: dict[str, list[str]] = {}
    for mode in ("", *_MODES):
        effective = _cap(action, mode or default_mode)
        if effective != "off":
            out.setdefault(_VAP_ACTION[effective], []).append(mode)
    return out


def _selector(values: list[str], excluded: tuple[str, ...]) -> Json:
    exprs: list[Json] = [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(excluded)}]
    if "" in values:  # the default: every value not listed for another action (NotIn also matches no label)
        others = [m for m in _MODES if m not in values]
        if others:
            exprs.append({"key": ENFORCEMENT, "operator": "NotIn", "values": others})
    else:
        exprs.append({"key": ENFORCEMENT, "operator": "In", "values": values})
    return {"matchExpressions": exprs}


def _resource_rules() -> list[Json]:
    return [
        {
            "apiGroups": [g],
            "apiVersions": [v],
            "resources": list(r),
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
        for g, v, r in _MATCH_RULES
    ]


def _match_conditions() -> list[Json]:
    # Pod specs are immutable after create; the webhook allows pod UPDATEs untouched too.
    pod_update = "!(request.kind.kind == 'Pod' && request.operation == 'UPDATE')"
    return [
        {"name": "not-a-pod-update", "expression": pod_update},
        {"name": "object", "expression": "object != null"},
    ]


def not_excepted(rule_id: str) -> Json:
    """The matchCondition that skips a rule the webhook marked as excepted (EXCEPTED_ANNOTATION)."""
    marked = _meta("object", "annotations", EXCEPTED_ANNOTATION) + f".matches({_q('(^|,)' + rule_id + '(,|$)')})"
    return {"name": "not-excepted", "expression": f"!{marked}"}


def _vap(rule: NativeRule, policy: Policy) -> Json:
    return {
        "apiVersion": API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {
            "name": NAME_PREFIX + rule.id,
            "labels": dict(MANAGED_BY),
            "annotations": {
                "gpu-admission.io/rule": rule.id,
                "gpu-admission.io/checklist": rule.checklist,
                "gpu-admission.io/policy-hash": policy.hash,
            },
        },
        "spec": {
            "failurePolicy": "Fail" if policy.failure_mode == "closed" else "Ignore",
            "matchConstraints": {"resourceRules": _resource_rules()},
            "matchConditions": [*_match_conditions(), not_excepted(rule.id)],
            "variables": _variables(),
            "validations": [{"expression": rule.validation, "messageExpression": rule.message, "reason": "Forbidden"}],
        },
    }


def _bindings(rule: NativeRule, policy: Policy, excluded: tuple[str, ...]) -> list[Json]:
    action = policy.rules.get(rule.id, "enforce")
    if action == "off":
        return []
    out = []
    for vap_action, modes in sorted(_namespace_groups(action, policy.default_enforcement).items()):
        out.append(
            {
                "apiVersion": API,
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": f"{NAME_PREFIX}{rule.id}-{vap_action.lower()}", "labels": dict(MANAGED_BY)},
                "spec": {
                    "policyName": NAME_PREFIX + rule.id,
                    "validationActions": [vap_action],
                    "matchResources": {"namespaceSelector": _selector(modes, excluded)},
                },
            }
        )
    return out


def generate(policy: Policy, excluded: tuple[str, ...] = DEFAULT_EXCLUDED, mutations: bool = True) -> list[Json]:
    """The ValidatingAdmissionPolicies and bindings of the native rules for this policy: a rule the policy
    turns off gets neither; each binding carries the action its namespaces' enforcement caps it at. With
    `mutations` (Kubernetes >= 1.36), also a MutatingAdmissionPolicy and binding per `native_mutations`."""
    out: list[Json] = []
    for rule in NATIVE:
        bindings = _bindings(rule, policy, excluded)
        if bindings:
            out.append(_vap(rule, policy))
            out.extend(bindings)
    if mutations:
        for mid in MAP_MUTATIONS:
            if mid in native_mutations(policy):
                out.append(_map(mid, policy))
                out.append(_map_binding(mid, policy, excluded))
    return out


def report(policy: Policy, mutations: bool = True) -> list[tuple[str, str]]:
    """(rule or mutation, what happens to it natively) for the operator."""
    rows = []
    for rule in NATIVE:
        action = policy.rules.get(rule.id, "enforce")
        if action == "off":
            rows.append((rule.id, "not generated: off in the policy"))
        else:
            half = " (templates; its HPA/ScaledObject half stays in the webhook)" if rule.elasticity_kinds_stay else ""
            rows.append((rule.id, f"ValidatingAdmissionPolicy, {action}{half}"))
    for mid in MAP_MUTATIONS:
        why = mutation_blocker(mid, policy)
        if not mutations:
            rows.append((mid, "webhook: MutatingAdmissionPolicy not generated (--no-mutations: Kubernetes < 1.36)"))
        else:
            rows.append((mid, f"webhook: {why}" if why else "MutatingAdmissionPolicy (JSONPatch)"))
    rows.extend((k, f"webhook: {v}") for k, v in NOT_NATIVE.items())
    return rows


__all__ = [
    "EXCEPTED_ANNOTATION",
    "MAP_MUTATIONS",
    "NATIVE",
    "NATIVE_RULES",
    "NOT_NATIVE",
    "PREFIX",
    "NativeRule",
    "cel_asks_gpu",
    "generate",
    "mutation_blocker",
    "native_mutations",
    "report",
]
