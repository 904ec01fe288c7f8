"""The engine: mutate, then validate, as the API server would on CREATE; returns a frozen `Review`.

Pure: plain JSON objects and a compiled policy in, a decision out. The web layer and the `check` command
both call `review`; neither holds decision logic of its own.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from policies import dra, placement, userkeys
from policies.document import Policy
from policies.exceptions import Exemption
from policies.inventory import Inventory
from policies.mutations import MUTATIONS, Mutation, later_pods_reservation
from policies.native import COVERED_KINDS as NATIVE_KINDS
from policies.native import EXCEPTED_ANNOTATION, NATIVE_RULES, cel_asks_gpu, native_mutations
from policies.patch import JsonOp, diff
from policies.resources import EXTENDED_PREFIX, NVIDIA_PREFIX
from policies.rules import RULES, Rule
from policies.subject import ReviewContext, Subject, build
from policies.workloads import ELASTICITY_KINDS, TEMPLATE_KINDS, Json, effective_kind, suspended, templates

# Resource names that ask for a GPU: device-plugin ones, and DRA's implicit claims of a class.
GPU_PREFIXES = (NVIDIA_PREFIX, EXTENDED_PREFIX)

__all__ = ["Finding", "Placement", "Review", "ReviewContext", "RuleResult", "review"]

EXCEPTED = "excepted"  # a rule's outcome when a GPUPolicyException let the violation through
_RANK = {"off": 0, "audit": 1, "warn": 2, "enforce": 3}
WARNING_LIMIT = 120  # the API server keeps warnings short; kubectl prints each on one line


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str


@dataclass(frozen=True)
class RuleResult:
    """Outcome of one rule or mutation: pass | deny | warn | audit | excepted | error | skip | native | applied."""

    rule: str
    action: str
    outcome: str
    message: str = ""


@dataclass(frozen=True)
class Placement:
    """A gang pinned to one domain at this review: what the server keeps reserved until its pods bind."""

    job: str
    key: str
    domain: str
    sizes: tuple[int, ...]
    renewed: bool = False  # the pods of a job pinned earlier that holds no reservation (later_pods_reservation)


@dataclass(frozen=True)
class Review:
    kind: str
    workload: str | None
    allowed: bool
    denials: tuple[Finding, ...]
    warnings: tuple[str, ...]
    mutations: tuple[str, ...]
    patch: tuple[JsonOp, ...]
    object: Json
    results: tuple[RuleResult, ...]
    policy_hash: str
    handled: bool = True
    # The domain training-rack pinned from the capacity view (the server reserves it), else None.
    placement: Placement | None = None
    # (rule, GPUPolicyException namespace/name) for each violation an exception let through, and the expired
    # exceptions that would have let one through (ignored, reported).
    excepted: tuple[tuple[str, str], ...] = ()
    expired: tuple[str, ...] = ()

    @property
    def exceptions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(ref for _, ref in self.excepted))

    @property
    def verdict(self) -> str:
        if not self.allowed:
            return "deny"
        return "warn" if self.warnings else "allow"

    def denial_message(self) -> str:
        """One line for the API server's Status message."""
        return " | ".join(f.message for f in self.denials)


@lru_cache(maxsize=1024)
def _plain(rule: str, action: str, outcome: str) -> RuleResult:
    """The message-less results (pass, skip, applied), made once: they are immutable, and building ~20
    frozen dataclasses per review was ~10% of the engine's budget. Bounded by rules × actions × outcomes."""
    return RuleResult(rule, action, outcome)


def _cap(action: str, mode: str) -> str:
    return action if _RANK[action] <= _RANK[mode] else mode


@dataclass(frozen=True)
class _Plan:
    """What a policy asks of every review in one enforcement mode, worked out once: the mutations it turns
    on, and each rule with its action capped by the mode and its message-less results. Built from the
    registries it names (tests swap them), kept per policy object (equal hashes may differ: tests replace
    fields)."""

    policy: Policy
    mutations_from: tuple[Mutation, ...]
    rules_from: tuple[Rule, ...]
    mutations: tuple[tuple[Mutation, RuleResult, RuleResult], ...]  # with its applied and native results
    rules: tuple[tuple[Rule, str, RuleResult, RuleResult], ...]  # with its action, pass and skip results


_PLANS: dict[tuple[int, str], _Plan] = {}
_PLANS_LIMIT = 64  # policies x modes; a server holds one policy at a time, tests a few dozen


def _plan(policy: Policy, mode: str) -> _Plan:
    found = _PLANS.get((id(policy), mode))
    if found is not None and found.policy is policy and found.mutations_from is MUTATIONS and found.rules_from is RULES:
        return found
    mutations = tuple(
        (m, _plain(m.id, "mutate", "applied"), _plain(m.id, "mutate", "native"))
        for m in MUTATIONS
        if policy.mutations.get(m.id, False)
    )
    rules = []
    for rule in RULES:
        action = _cap(policy.rules.get(rule.id, "enforce"), mode)
        rules.append((rule, action, _plain(rule.id, action, "pass"), _plain(rule.id, action, "skip")))
    plan = _Plan(policy, MUTATIONS, RULES, mutations, tuple(rules))
    if len(_PLANS) >= _PLANS_LIMIT:
        _PLANS.clear()
    _PLANS[(id(policy), mode)] = plan  # the plan holds the policy: its id is not reused while the entry lives
    return plan


def short(text: str, limit: int = WARNING_LIMIT) -> str:
    text = " ".join(text.split())  # the API server drops warnings with control characters
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Pod-spec fields no mutation edits (each writes affinity, tolerations, scheduler fields, labels, annotations
# or a container's resources): shared with the input instead of copied, like metadata.managedFields. On a
# controller-made pod they are most of the bytes left (env alone ~1 KB on a training worker).
# tests/test_engine_cache.py checks on every golden case that no mutation reaches into them.
_SHARED_CONTAINER_KEYS = frozenset(
    {"env", "envFrom", "volumeMounts", "volumeDevices", "command", "args", "ports"}
    | {"livenessProbe", "readinessProbe", "startupProbe", "lifecycle"}
)
_CONTAINER_LISTS = ("initContainers", "containers")


def _copy(obj: Json) -> Json:
    """A deep copy for the mutations to edit, except what no mutation touches: `metadata.managedFields` (on a
    controller-made pod half the bytes; decoding it was ~10 µs of the 100 µs budget) and, on a Pod, the
    container fields above and the volumes. They are shared with the input: the diff sees them as equal, so
    the patch never names them. Placeholders hold their places, so every mapping keeps its key order."""
    bare = _without_shared(obj)
    try:
        out: Json = orjson.loads(orjson.dumps(bare))  # several times faster than deepcopy for JSON
    except (TypeError, orjson.JSONEncodeError):
        out = copy.deepcopy(bare)  # big integers or non-str keys: slower but exact
    if bare is not obj:
        _put_back(out, obj)
    return out


def _pod_spec(obj: Json) -> Json | None:
    spec = obj.get("spec") if obj.get("kind") == "Pod" else None
    return spec if isinstance(spec, dict) else None


def _without_shared(obj: Json) -> Json:
    """`obj` with None in place of the shared values (shallow copies on the way to them; `obj` itself when
    it has none)."""
    meta = obj.get("metadata")
    managed = isinstance(meta, dict) and meta.get("managedFields") is not None
    spec = _pod_spec(obj)
    if not managed and spec is None:
        return obj
    out = dict(obj)
    if managed:
        out["metadata"] = bare_meta = dict(meta)  # type: ignore[arg-type]
        bare_meta["managedFields"] = None
    if spec is not None:
        bare = dict(spec)
        if "volumes" in bare:
            bare["volumes"] = None
        for key in _CONTAINER_LISTS:
            items = bare.get(key)
            if isinstance(items, list):
                bare[key] = [_bare_container(c) for c in items]
        out["spec"] = bare
    return out


def _bare_container(c: Any) -> Any:
    shared = _SHARED_CONTAINER_KEYS.intersection(c) if isinstance(c, dict) else ()
    if not shared:
        return c
    out = dict(c)
    for key in shared:
        out[key] = None
    return out


def _put_back(copied: Json, obj: Json) -> None:
    """The shared values of `obj` into their places in `copied` (a copy of `_without_shared(obj)`)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and meta.get("managedFields") is not None:
        copied["metadata"]["managedFields"] = meta["managedFields"]
    spec = _pod_spec(obj)
    if spec is None:
        return
    target = copied["spec"]
    if "volumes" in spec:
        target["volumes"] = spec["volumes"]
    for key in _CONTAINER_LISTS:
        items = spec.get(key)
        if isinstance(items, list):
            for new, old in zip(target[key], items, strict=True):
                if isinstance(old, dict):
                    for k in _SHARED_CONTAINER_KEYS.intersection(old):
                        new[k] = old[k]


def _untouched(obj: Json, kind: str, policy: Policy, warnings: tuple[str, ...] = (), handled: bool = True) -> Review:
    return Review(kind, None, True, (), warnings, (), (), obj, (), policy.hash, handled)


def review(
    obj: Any,
    *,
    policy: Policy,
    inventory: Inventory,
    ctx: ReviewContext | None = None,
    mutate: bool = True,
    validate: bool = True,
) -> Review:
    """Mutate-then-validate one object. Never raises for any JSON input. The mutating webhook passes
    validate=False (its validating twin judges the final object); the validating one mutate=False."""
    ctx = ctx or ReviewContext()
    if not isinstance(obj, dict):
        return _untouched({}, "", policy, ("object is not a JSON object: not handled",), handled=False)
    kind = effective_kind(obj)
    if kind not in TEMPLATE_KINDS and kind not in ELASTICITY_KINDS:
        return _untouched(obj, kind, policy, handled=False)

    if kind not in ELASTICITY_KINDS and not _mentions_gpu(obj, ctx, inventory.classes):
        return _untouched(obj, kind, policy)  # the cheap path for the many pods that ask for no GPU

    mode, mode_warning = userkeys.namespace_mode(ctx.namespace_labels, policy.default_enforcement)
    notes = [mode_warning] if mode_warning else []
    if mode == "off":
        return _untouched(obj, kind, policy)

    work = _copy(obj) if mutate else obj
    subject = build(work, policy, inventory, ctx)
    elastic = kind in ELASTICITY_KINDS
    if not elastic and not subject.gpu_pods:
        if not any(p.keys.errors for p in subject.pods):
            return _untouched(obj, kind, policy)  # no GPU asked: allowed untouched, empty patch
        # No GPU, but a misspelled gpu-admission.io/ key (often a GPU ask that never happened): never ignore it.
        mutate, only = False, frozenset({"gpu-admission-annotations"})
    else:
        only = None

    results: list[RuleResult] = []
    denials: list[Finding] = []
    warnings: list[str] = [short(n) for n in notes]
    failed_closed = False
    excepted: list[tuple[str, str]] = []
    expired: list[str] = []

    plan = _plan(policy, mode)
    applied: list[str] = []
    if mutate and not elastic:
        for m, applied_result, native_result in plan.mutations:
            # A MutatingAdmissionPolicy made this mutation in the API server (`serve --native-mutations`) on
            # the pods its CEL sees as asking for GPUs; the rest (DRA claims, ...) it leaves to us.
            native_here = m.id in ctx.native and kind in NATIVE_KINDS and m.id in native_mutations(policy)
            try:
                changed = False
                for pod in subject.pods:
                    if native_here and cel_asks_gpu(pod.pod):
                        continue
                    if not pod.template.readonly:
                        changed |= m.fn(subject, pod)
            except Exception as exc:  # a bug in one mutation must not crash admission
                outcome = _internal_error(m.id, exc, policy, denials, warnings)
                results.append(RuleResult(m.id, "mutate", "error", outcome))
                if policy.failure_mode == "open":
                    work = obj  # never ship a half-applied mutation: fall back to the original
                    subject = build(work, policy, inventory, ctx)
                    results[:] = [_dropped(r, m.id) if r.outcome == "applied" else r for r in results]
                    applied.clear()
                    break
                failed_closed = True
                subject.invalidate()  # it may have edited anything before it failed
                continue
            if changed:
                subject.invalidate(m.touches)
                applied.append(m.id)
                results.append(applied_result)
            elif native_here:
                results.append(native_result)

    for rule, action, passed, skipped in plan.rules if validate else ():
        if (elastic and not rule.elasticity) or (only is not None and rule.id not in only):
            continue
        if rule.id in ctx.native and kind in NATIVE_KINDS:  # a ValidatingAdmissionPolicy judges it there
            live = _exemption(rule.id, obj, ctx)[0]
            skip = f"excepted by {live.ref} until {live.until_text}: the API server's policy skips it" if live else ""
            results.append(RuleResult(rule.id, action, "native", skip))
            continue
        if action == "off":
            results.append(skipped)
            continue
        try:
            violations = rule.fn(subject)
        except Exception as exc:
            outcome = _internal_error(rule.id, exc, policy, denials, warnings)
            results.append(RuleResult(rule.id, action, "error", outcome))
            failed_closed = failed_closed or policy.failure_mode == "closed"
            continue
        if not violations:
            results.append(passed)
            continue
        v = violations[0]
        exemption, lapsed = _exemption(rule.id, obj, ctx)
        if lapsed is not None and lapsed.ref not in expired:
            expired.append(lapsed.ref)
            warnings.append(short(f"{rule.id} applies again: exception {lapsed.ref} expired {lapsed.until_text}"))
        if exemption is not None:
            message = f"{rule.id}: {v.found} (excepted by {exemption.ref} until {exemption.until_text})"
            results.append(RuleResult(rule.id, action, EXCEPTED, " ".join(message.split())))
            warnings.append(short(f"{rule.id} excepted by {exemption.ref} until {exemption.until_text}"))
            excepted.append((rule.id, exemption.ref))
            continue
        if action == "enforce":
            message = f"{rule.id}: {v.found}. Fix: {v.fix}"
            denials.append(Finding(rule.id, " ".join(message.split())))
            results.append(RuleResult(rule.id, action, "deny", message))
        else:
            message = f"{rule.id}: {v.found}"
            if action == "warn":
                warnings.append(short(message))
            results.append(RuleResult(rule.id, action, action, message))

    warnings.extend(short(n) for n in subject.notes)
    if inventory.warnings and any(r.outcome in ("deny", "warn") and "rack" in r.rule for r in results):
        warnings.append(short(inventory.warnings[0]))
    if applied:
        for pod in subject.pods:
            if pod.template.fold is not None:
                pod.template.fold(pod.template.pod)  # views (policies/podviews.py) write back into the object
    marked = mutate and only is None and _mark_native_exceptions(work, kind, ctx)
    # Mutations report every change, so with none applied there is nothing to diff (the common case for
    # pods of an already-mutated template).
    patch = tuple(diff(obj, work)) if mutate and (applied or marked) and work is not obj else ()
    if only is not None:
        work = obj
    allowed = not denials and not failed_closed
    return Review(
        kind=kind,
        workload=subject.workload,
        allowed=allowed,
        denials=tuple(denials),
        warnings=tuple(dict.fromkeys(warnings)),
        mutations=tuple(applied),
        patch=patch,
        object=work,
        results=tuple(results),
        policy_hash=policy.hash,
        placement=_pinned(subject),
        excepted=tuple(excepted),
        expired=tuple(expired),
    )


def _mark_native_exceptions(work: Json, kind: str, ctx: ReviewContext) -> bool:
    """Under `serve --native`, write on the object the native rules a live exception lets it skip in the
    API server's policies (native.EXCEPTED_ANNOTATION), and remove any other value: the policies trust it only
    because every object they judge passes here first. True when the object changed."""
    if not ctx.native:
        return False
    rules = ctx.native & NATIVE_RULES
    meta = work.get("metadata")
    if not rules or kind not in NATIVE_KINDS or not isinstance(meta, dict):
        return False
    value = ",".join(r for r in sorted(rules) if _exemption(r, work, ctx)[0] is not None)
    annotations = meta.get("annotations")
    current = annotations.get(EXCEPTED_ANNOTATION) if isinstance(annotations, dict) else None
    if current == (value or None):  # already what it should be (absent when nothing is excepted)
        return False
    if value:
        if not isinstance(annotations, dict):
            annotations = meta["annotations"] = {}
        annotations[EXCEPTED_ANNOTATION] = value
    elif isinstance(annotations, dict):
        del annotations[EXCEPTED_ANNOTATION]
    return True


def _exemption(rule_id: str, obj: Json, ctx: ReviewContext) -> tuple[Exemption | None, Exemption | None]:
    """The live exception that lets `obj` through `rule_id`, and an expired one that would have (reported).
    Only the namespace's own exceptions are in `ctx` (indexed by the caller), so this reads a handful."""
    lapsed = None
    if not ctx.exceptions:
        return None, None
    ns = ctx.namespace or _namespace(obj)
    for e in ctx.exceptions:
        if e.covers(rule_id, obj, ns):
            if ctx.now is not None and e.expired(ctx.now):
                lapsed = lapsed or e
            else:
                return e, lapsed
    return None, lapsed


def _namespace(obj: Json) -> str:
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return ns if isinstance(ns, str) and ns else "default"


def _pinned(s: Subject) -> Placement | None:
    """What the server should reserve after this review: the gang training-rack pinned by best fit, or the
    unbound pods of a pinned job whose pod is created while the job holds no reservation. Nothing for a
    suspended workload: it makes no pod until resumed (its pods then reserve, as later pods)."""
    d = s.pinned
    job = s.job_id()
    if d is not None and job is not None and d.domain is not None and d.source == placement.BEST_FIT:
        return None if suspended(s.obj) else Placement(job, d.key, d.domain, s.job.sizes)
    again = later_pods_reservation(s, job)
    return Placement(again.job, again.key, again.domain, again.sizes, renewed=True) if again is not None else None


def _mentions_gpu(obj: Json, ctx: ReviewContext, classes: dra.Classes) -> bool:
    """Any nvidia.com/ resource in any container, DRA claims or extended resources, or any gpu-admission.io/
    key on the object or a pod template: a superset of what the engine acts on, read without copying or
    classifying anything."""
    pods = [obj] if effective_kind(obj) == "Pod" else [t.pod for t in templates(obj, ctx.resolve)]
    mapped = classes.extended_names
    for pod in pods:
        spec = pod.get("spec")
        if isinstance(spec, dict) and (spec.get("resourceClaims") or _names_gpu(spec, mapped)):
            return True
    for holder in (obj, *pods):
        meta = holder.get("metadata")
        if isinstance(meta, dict):
            for section in ("labels", "annotations"):
                keys = meta.get(section)
                if isinstance(keys, dict) and any(isinstance(k, str) and k.startswith(userkeys.PREFIX) for k in keys):
                    return True
    return False


def _names_gpu(spec: Json, mapped: frozenset[str]) -> bool:
    """A container of the pod spec names a GPU resource in its limits or requests (plain loops: this runs
    for every pod the API server sends)."""
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if not isinstance(items, list):
            continue
        for c in items:
            res = c.get("resources") if isinstance(c, dict) else None
            if not isinstance(res, dict):
                continue
            for section in ("limits", "requests"):
                amounts = res.get(section)
                if isinstance(amounts, dict):
                    for k in amounts:
                        if isinstance(k, str) and (k.startswith(GPU_PREFIXES) or k in mapped):
                            return True
    return False


def _dropped(r: RuleResult, failed: str) -> RuleResult:
    """An applied mutation's result once a later one raised under failureMode open: the original object is
    shipped, so its change was not made (the result must not say `applied`)."""
    message = f"{r.rule}: not applied: {failed} failed, and failing open ships the object unchanged"
    return RuleResult(r.rule, r.action, "skip", message)


def _internal_error(rule_id: str, exc: Exception, policy: Policy, denials: list[Finding], warnings: list[str]) -> str:
    what = f"{rule_id}: internal error ({type(exc).__name__})"
    if policy.failure_mode == "closed":
        message = f"{what}; failing closed per policy. Fix: report this object to the platform team"
        denials.append(Finding(rule_id, message))
    else:
        message = f"{what}; allowed (failing open per policy)"
        warnings.append(short(message))
    return message
