"""Dynamic Resource Allocation (resource.k8s.io/v1): GPUs asked through ResourceClaims, read into the
device-plugin vocabulary every rule already judges.

A claim request for `gpu.nvidia.com` devices counts as that many `nvidia.com/gpu`, one for a MIG class
fixed to a profile as `nvidia.com/mig-<profile>`, and one whose claim config shares the GPU (the NVIDIA
driver's opaque `GpuConfig` with `sharing.strategy` TimeSlicing or MPS) as `nvidia.com/gpu.shared`: sharing
is per claim under DRA, not per node. ResourceSlices become the same per-node offers a device plugin would
advertise (`node_devices`). Field names follow resource.k8s.io/v1 (Kubernetes 1.34+) and the attributes the
NVIDIA driver publishes (kubernetes-sigs/dra-driver-nvidia-gpu, docs/reference/resourceslice-attributes.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from policies.quantity import QuantityError, parse_bytes
from policies.resources import GPU, GPU_SHARED, ContainerAsk, is_gpu_resource, parse_count
from policies.workloads import Json

# A pod asks any class by this extended-resource prefix (KEP-5004): an implicit claim of N devices.
EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"
NVIDIA_DRIVER = "gpu.nvidia.com"
CHANNEL_DRIVER = "compute-domain.nvidia.com"
SHARING_STRATEGIES = frozenset({"TimeSlicing", "MPS"})
# Requests (and subrequests) read per pod: more is malformed input, not a GPU job (the API allows 32).
MAX_REQUESTS = 32

Resolver = Callable[[str, str, str], Json | None]  # (kind, namespace, name) -> object or None


@dataclass(frozen=True)
class DeviceClass:
    """What a DeviceClass selects: `kind` gpu | mig | channel | other, a MIG profile its CEL fixes, and the
    extended resource it maps (spec.extendedResourceName)."""

    name: str
    kind: str
    profile: str = ""
    extended: str = ""


# The NVIDIA driver's classes (deployments/helm/.../templates/deviceclass-*.yaml): known without a cluster.
BUILT_IN = {
    c.name: c
    for c in (
        DeviceClass("gpu.nvidia.com", "gpu", extended=GPU),
        DeviceClass("mig.nvidia.com", "mig"),
        DeviceClass("vfio.gpu.nvidia.com", "other"),
        DeviceClass("compute-domain-default-channel.nvidia.com", "channel"),
        DeviceClass("compute-domain-daemon.nvidia.com", "other"),
    )
}

_TYPE = re.compile(r"""\.type\s*==\s*['"](gpu|mig|vfio)['"]""")
_PROFILE = re.compile(r"""\.profile\s*==\s*['"]([0-9]+g\.[0-9]+gb[a-z0-9+.]*)['"]""")
_MEMORY = re.compile(
    r"""capacity\[\s*['"]gpu\.nvidia\.com['"]\s*\]\.memory\s*\.\s*(?:isGreaterThan|compareTo)\s*\(\s*"""
    r"""quantity\(\s*['"]([^'"]+)['"]\s*\)\s*\)"""
)


def _name(obj: Json, default: str) -> str:
    value = obj.get("name")
    return value if isinstance(value, str) else default


def _selector_text(selectors: Any) -> list[str]:
    out = []
    for s in selectors if isinstance(selectors, list) else []:
        cel = s.get("cel") if isinstance(s, dict) else None
        expr = cel.get("expression") if isinstance(cel, dict) else None
        if isinstance(expr, str):
            out.append(expr)
    return out


# Extended resources the NVIDIA driver's own classes serve (gpu.nvidia.com: nvidia.com/gpu on resource.k8s.io/v1).
BUILT_IN_EXTENDED = frozenset(c.extended for c in BUILT_IN.values() if c.extended)


def class_from_object(obj: Json) -> DeviceClass | None:
    """A DeviceClass object read by what its CEL selects (None when it has no name)."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        return None
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    exprs = " && ".join(_selector_text(spec.get("selectors")))
    extended = spec.get("extendedResourceName")
    extended = extended if isinstance(extended, str) else ""
    kind = "other"
    if CHANNEL_DRIVER in exprs:
        kind = "channel" if "channel" in name else "other"
    elif NVIDIA_DRIVER in exprs and (m := _TYPE.search(exprs)):
        kind = {"gpu": "gpu", "mig": "mig"}.get(m.group(1), "other")
    elif name in BUILT_IN:
        kind = BUILT_IN[name].kind
    profile = m.group(1) if kind == "mig" and (m := _PROFILE.search(exprs)) else ""
    return DeviceClass(name, kind, profile, extended)


@dataclass(frozen=True)
class Classes:
    """The DeviceClasses of one inventory version. `served`: read from the cluster (or a nodes file), so a
    name not among them is unknown; otherwise the NVIDIA driver's built-in names are assumed."""

    by_name: Mapping[str, DeviceClass] = field(default_factory=dict)
    served: bool = False

    def get(self, name: str) -> DeviceClass | None:
        if self.served:
            return self.by_name.get(name)
        return BUILT_IN.get(name)

    def for_extended(self, resource: str) -> DeviceClass | None:
        """The class a pod's extended resource is allocated from: `deviceclass.resource.kubernetes.io/<class>`,
        or a class whose extendedResourceName it is (the one sorted first when several claim it)."""
        if resource.startswith(EXTENDED_PREFIX):
            return self.get(resource[len(EXTENDED_PREFIX) :])
        mapped = self._extended.get(resource)
        return mapped

    @cached_property
    def _extended(self) -> Mapping[str, DeviceClass]:
        table: dict[str, DeviceClass] = {}
        for c in sorted(self.by_name.values(), key=lambda c: c.name, reverse=True):
            if c.extended:
                table[c.extended] = c
        return table

    @cached_property
    def served_names(self) -> frozenset[str]:
        """Every extended resource a class serves (pods may ask devices by these names)."""
        if not self.served:
            return BUILT_IN_EXTENDED
        return frozenset(c.extended for c in self.by_name.values() if c.extended)

    @cached_property
    def extended_names(self) -> frozenset[str]:
        """Extended resources served through DRA that are not nvidia.com/ names (those are read as such)."""
        return frozenset(c.extended for c in self.by_name.values() if c.extended and not is_gpu_resource(c.extended))


def classes_from_objects(objects: Iterable[Json], served: bool = True) -> Classes:
    found = (class_from_object(o) for o in objects if isinstance(o, dict))
    return Classes({c.name: c for c in found if c is not None}, served)


@dataclass(frozen=True)
class ClaimAsk:
    """One device request of a pod's claim, as the device-plugin resource it amounts to (`resource` is ""
    for devices that are no GPU: a ComputeDomain channel, a NIC)."""

    claim: str  # the pod's name for the claim (spec.resourceClaims[].name)
    request: str
    resource: str
    count: int
    sharing: str = ""  # TimeSlicing | MPS from the claim's GpuConfig, else ""
    memory: int | None = None  # bytes a CEL selector asks at least
    channel: bool = False

    def describe(self) -> str:
        how = f", GpuConfig sharing {self.sharing}" if self.sharing else ""
        return f"claim {self.claim} request {self.request} ({self.count} x {self.resource}{how})"


@dataclass(frozen=True)
class PodClaims:
    """A pod's claims read: per container name the asks it uses, the pod-wide asks, and one-line problems
    (`errors`: unknown class, CEL that does not parse; `notes`: what could not be read, e.g. a template not
    created yet, which is allowed: `kubectl apply -f dir/` may create it after the workload)."""

    asks: tuple[ClaimAsk, ...] = ()
    containers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # container -> indexes in asks
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lookup:
    """What reading a pod's claims needs beyond the pod: the classes, and ResourceClaims /
    ResourceClaimTemplates of the pod's namespace (the server's cache, or `check`'s inputs)."""

    classes: Classes
    resolve: Resolver | None
    namespace: str
    cel_check: Callable[[str], str | None] | None = None  # a one-line parse error, or None

    def reads(self, spec: Json) -> bool:
        """The pod spec asks anything through DRA (cheap: most pods do not)."""
        return asks_through_dra(spec, self.classes)

    def with_claims(self, pod: Json, containers: list[ContainerAsk]) -> tuple[list[ContainerAsk], PodClaims | None]:
        return with_claims(pod, containers, self)


def pod_claims(pod: Json, lookup: Lookup) -> PodClaims:
    spec = pod.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    refs = spec.get("resourceClaims")
    if not isinstance(refs, list) or not refs:
        return PodClaims()
    asks: list[ClaimAsk] = []
    by_claim: dict[str, list[int]] = {}
    errors: list[str] = []
    notes: list[str] = []
    for ref in refs[:MAX_REQUESTS]:
        if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
            continue
        name = ref["name"]
        claim_spec, problem = _claim_spec(ref, lookup)
        if claim_spec is None:
            if problem:
                notes.append(f"claim {name}: {problem}")
            continue
        found, errs = _requests(name, claim_spec, lookup)
        errors += errs
        by_claim[name] = [len(asks) + i for i in range(len(found))]
        asks += found
    return PodClaims(tuple(asks), _by_container(spec, by_claim, asks), tuple(errors), tuple(notes))


def _claim_spec(ref: Json, lookup: Lookup) -> tuple[Json | None, str]:
    """The claim's spec (a template's spec.spec), or None and why not."""
    for key, kind in (("resourceClaimName", "ResourceClaim"), ("resourceClaimTemplateName", "ResourceClaimTemplate")):
        target = ref.get(key)
        if not isinstance(target, str) or not target:
            continue
        obj = lookup.resolve(kind, lookup.namespace, target) if lookup.resolve else None
        if obj is None:
            where = lookup.namespace or "default"
            return None, f"{kind} {target} not found in namespace {where}: its devices are not judged"
        spec = obj.get("spec")
        if kind == "ResourceClaimTemplate":
            spec = spec.get("spec") if isinstance(spec, dict) else None
        return (spec if isinstance(spec, dict) else {}), ""
    return None, ""


def _requests(claim: str, spec: Json, lookup: Lookup) -> tuple[list[ClaimAsk], list[str]]:
    devices = spec.get("devices")
    devices = devices if isinstance(devices, dict) else {}
    requests = devices.get("requests")
    sharing = _sharing(devices.get("config"))
    out: list[ClaimAsk] = []
    errors: list[str] = []
    for req in requests[:MAX_REQUESTS] if isinstance(requests, list) else []:
        if not isinstance(req, dict):
            continue
        rname = _name(req, "")
        exact = req.get("exactly")
        first = req.get("firstAvailable")
        if isinstance(exact, dict):
            alternatives = [(rname, exact)]
        elif isinstance(first, list) and first:
            # The scheduler tries subrequests in order and gives the first that fits: the first one is what
            # the pod asks for when the cluster has room; the others are fallbacks.
            alternatives = [(f"{rname}/{s.get('name')}", s) for s in first[:MAX_REQUESTS] if isinstance(s, dict)]
        else:
            continue
        found = []
        for qualified, body in alternatives:
            ask, err = _one(claim, qualified, rname, body, sharing, lookup)
            errors += [err] if err else []
            found += [ask] if ask is not None else []
        if found:
            # Judged as the first alternative, but shared when any alternative is: the pod may get that one.
            shared = next((a.sharing for a in found if a.sharing), "")
            out.append(replace(found[0], sharing=found[0].sharing or shared))
    return out, errors


def _one(
    claim: str, qualified: str, rname: str, body: Json, sharing: Mapping[str, str], lookup: Lookup
) -> tuple[ClaimAsk | None, str]:
    cls_name = body.get("deviceClassName")
    if not isinstance(cls_name, str) or not cls_name:
        return None, ""
    exprs = _selector_text(body.get("selectors"))
    for e in exprs:
        problem = lookup.cel_check(e) if lookup.cel_check else None
        if problem:
            return None, f"claim {claim} request {qualified}: CEL selector does not parse ({problem})"
    cls = lookup.classes.get(cls_name)
    if cls is None:
        return None, f"claim {claim} request {qualified}: DeviceClass {cls_name} does not exist"
    mode = body.get("allocationMode")
    count = body.get("count", 1)  # ExactCount's default
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        count = 0  # the API server rejects it; nothing to count
    if mode == "All":
        count = 0  # every matching device of one node: as many as the node has, unknown here
    text = " && ".join(exprs)
    strategy = sharing.get(qualified) or sharing.get(rname) or sharing.get("", "")
    resource = _resource(cls, text, strategy)
    memory = _memory_asked(text, body.get("capacity"))
    return ClaimAsk(claim, qualified, resource, count, strategy, memory, cls.kind == "channel"), ""


# capacity.requests keys naming GPU memory: a QualifiedName, its domain the driver's when left out.
_MEMORY_KEYS = ("memory", f"{NVIDIA_DRIVER}/memory")


def _memory_asked(selectors: str, capacity: Any) -> int | None:
    """Bytes of GPU memory a request asks each device to have at least: a CEL selector's memory comparison,
    or `capacity.requests` (the same filter, resource.k8s.io/v1 CapacityRequirements); the larger of both."""
    found: list[str | int] = []
    if (m := _MEMORY.search(selectors)) is not None:
        found.append(m.group(1))
    requests = capacity.get("requests") if isinstance(capacity, dict) else None
    for key in _MEMORY_KEYS:
        value = requests.get(key) if isinstance(requests, dict) else None
        if isinstance(value, str | int) and not isinstance(value, bool):
            found.append(value)
    out: int | None = None
    for raw in found:
        try:
            n = parse_bytes(raw)
        except (QuantityError, ValueError):
            continue
        out = n if out is None else max(out, n)
    return out


def _resource(cls: DeviceClass, selectors: str, sharing: str) -> str:
    if cls.kind == "gpu":
        return GPU_SHARED if sharing else GPU
    if cls.kind == "mig":
        profile = cls.profile or (m.group(1) if (m := _PROFILE.search(selectors)) else "")
        return f"nvidia.com/mig-{profile}" if profile else "nvidia.com/mig"
    return ""


def _sharing(config: Any) -> dict[str, str]:
    """Request name ("" for all) -> the GpuConfig sharing strategy the claim's config sets for it."""
    out: dict[str, str] = {}
    for entry in config if isinstance(config, list) else []:
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        params = opaque.get("parameters") if isinstance(opaque, dict) else None
        if not isinstance(opaque, dict) or not isinstance(params, dict):
            continue
        if opaque.get("driver") != NVIDIA_DRIVER or params.get("kind") != "GpuConfig":
            continue
        share = params.get("sharing")
        strategy = share.get("strategy") if isinstance(share, dict) else None
        if not isinstance(strategy, str) or strategy not in SHARING_STRATEGIES:
            continue
        names = entry.get("requests")
        for n in names if isinstance(names, list) and names else [""]:
            if isinstance(n, str):
                out[n] = str(strategy)
    return out


def _by_container(spec: Json, by_claim: Mapping[str, list[int]], asks: list[ClaimAsk]) -> dict[str, tuple[int, ...]]:
    """Each ask goes to the first container that uses it (a claim shared by containers is one set of devices
    on the node); asks no container names go to the first app container (still allocated to the pod)."""
    taken: set[int] = set()
    out: dict[str, list[int]] = {}
    first_app = ""
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        for i, c in enumerate(items if isinstance(items, list) else []):
            if not isinstance(c, dict):
                continue
            cname = _name(c, f"#{i}")
            if key == "containers" and not first_app:
                first_app = cname
            res = c.get("resources")
            used = res.get("claims") if isinstance(res, dict) else None
            for u in used if isinstance(used, list) else []:
                if not isinstance(u, dict) or not isinstance(u.get("name"), str) or u["name"] not in by_claim:
                    continue
                req = u.get("request")
                for idx in by_claim[u["name"]]:
                    if idx in taken:
                        continue
                    if isinstance(req, str) and req and asks[idx].request.split("/")[0] != req.split("/")[0]:
                        continue
                    taken.add(idx)
                    out.setdefault(cname, []).append(idx)
    rest = [i for ids in by_claim.values() for i in ids if i not in taken]
    if rest:
        out.setdefault(first_app or "#0", []).extend(rest)
    return {k: tuple(v) for k, v in out.items()}


def extended_ask(resource: str, classes: Classes) -> tuple[str | None, str]:
    """The device-plugin resource an extended resource allocated through DRA amounts to (None: not a DRA
    one), and an error when it names a class that does not exist."""
    cls = classes.for_extended(resource)
    if cls is None:
        if resource.startswith(EXTENDED_PREFIX):
            return "", f"{resource}: DeviceClass {resource[len(EXTENDED_PREFIX) :]} does not exist"
        return None, ""
    return _resource(cls, "", ""), ""


# --- Allocated claims: the GPUs a pod holds through DRA ----------------------------------------------

# Set by the scheduler on the claim it makes for a pod's DRA extended resources (k8s.io/api resource/v1
# ExtendedResourceClaimAnnotation): those devices are counted from the pod's limits, not again from the claim.
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def claim_held(claim: Json, classes: Classes) -> tuple[str, dict[str, int]]:
    """The node an allocated claim's devices are on ("" when it is not allocated, or not to one node) and the
    GPU units they amount to: one per allocated device, as the resource its request's class reads as."""
    meta = claim.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, dict) else None
    if isinstance(notes, dict) and notes.get(EXTENDED_CLAIM_ANNOTATION) == "true":
        return "", {}
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    if not isinstance(allocation, dict):
        return "", {}
    node = _allocated_node(allocation.get("nodeSelector"))
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, dict) else None
    spec = claim.get("spec")
    claim_devices = spec.get("devices") if isinstance(spec, dict) else None
    claim_devices = claim_devices if isinstance(claim_devices, dict) else {}
    bodies = _request_bodies(claim_devices.get("requests"))
    sharing = _sharing(claim_devices.get("config"))
    units: dict[str, int] = {}
    for r in results[: MAX_REQUESTS * 128] if isinstance(results, list) else []:
        request = r.get("request") if isinstance(r, dict) else None
        body = bodies.get(request) if isinstance(request, str) else None
        cls_name = body.get("deviceClassName") if body is not None else None
        cls = classes.get(cls_name) if isinstance(cls_name, str) else None
        if cls is None or not isinstance(request, str):
            continue
        strategy = sharing.get(request) or sharing.get(request.split("/")[0]) or sharing.get("", "")
        resource = _resource(cls, " && ".join(_selector_text(body.get("selectors") if body else None)), strategy)
        if resource:
            units[resource] = units.get(resource, 0) + 1
    return node, units


def _request_bodies(requests: Any) -> dict[str, Json]:
    """Request name ("name", or "name/sub" for a firstAvailable subrequest) -> its exactly / subrequest body, as
    allocation results name them."""
    out: dict[str, Json] = {}
    for req in requests[:MAX_REQUESTS] if isinstance(requests, list) else []:
        if not isinstance(req, dict) or not isinstance(name := req.get("name"), str):
            continue
        if isinstance(exact := req.get("exactly"), dict):
            out[name] = exact
        subs = req.get("firstAvailable")
        for sub in subs[:MAX_REQUESTS] if isinstance(subs, list) else []:
            if isinstance(sub, dict) and isinstance(sub.get("name"), str):
                out[f"{name}/{sub['name']}"] = sub
    return out


def _allocated_node(selector: Any) -> str:
    """The node a node-local allocation is on: the scheduler's nodeSelector names it by metadata.name."""
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, dict) else None
    for term in terms if isinstance(terms, list) else []:
        fields = term.get("matchFields") if isinstance(term, dict) else None
        for f in fields if isinstance(fields, list) else []:
            if not isinstance(f, dict) or f.get("key") != "metadata.name" or f.get("operator") != "In":
                continue
            values = f.get("values")
            if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
                return values[0]
    return ""


# --- ResourceSlices: the devices of each node --------------------------------------------------------


@dataclass(frozen=True)
class NodeDevices:
    """What the NVIDIA driver's ResourceSlices publish for one node, as device-plugin offers."""

    resources: Mapping[str, int]
    product: str  # GFD-style (spaces as dashes), "" when unknown
    memory_bytes: int  # the largest full GPU's memory capacity


def _attr(device: Json, key: str) -> Any:
    attrs = device.get("attributes")
    value = attrs.get(key) if isinstance(attrs, dict) else None
    if isinstance(value, dict):
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                return value[kind]
    return None


def _capacity(device: Json, key: str) -> int:
    caps = device.get("capacity")
    value = caps.get(key) if isinstance(caps, dict) else None
    raw = value.get("value") if isinstance(value, dict) else None
    try:
        return parse_bytes(raw) if isinstance(raw, str | int) else 0
    except (QuantityError, ValueError):
        return 0


def node_devices(slices: Iterable[Json]) -> dict[str, NodeDevices]:
    """Node name -> its GPUs and MIG devices from the `gpu.nvidia.com` driver's node-local ResourceSlices."""
    counts: dict[str, dict[str, int]] = {}
    product: dict[str, str] = {}
    memory: dict[str, int] = {}
    for s in slices:
        spec = s.get("spec") if isinstance(s, dict) else None
        if not isinstance(spec, dict) or spec.get("driver") != NVIDIA_DRIVER:
            continue
        node = spec.get("nodeName")
        devices = spec.get("devices")
        if not isinstance(node, str) or not node or not isinstance(devices, list):
            continue
        table = counts.setdefault(node, {})
        for d in devices:
            if not isinstance(d, dict):
                continue
            kind = _attr(d, "type")
            if kind == "gpu":
                table[GPU] = table.get(GPU, 0) + 1
                memory[node] = max(memory.get(node, 0), _capacity(d, "memory"))
            elif kind == "mig" and isinstance(p := _attr(d, "profile"), str) and p:
                name = f"nvidia.com/mig-{p}"
                table[name] = table.get(name, 0) + 1
            else:
                continue
            name_attr = _attr(d, "productName")
            if isinstance(name_attr, str) and name_attr and node not in product:
                product[node] = "-".join(name_attr.split())
    return {n: NodeDevices(c, product.get(n, ""), memory.get(n, 0)) for n, c in counts.items() if c}


def slice_node(obj: Json) -> str:
    """The node a ResourceSlice belongs to ("" for network-attached pools)."""
    spec = obj.get("spec")
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    return node if isinstance(node, str) else ""


def with_claims(
    pod: Json, containers: list[ContainerAsk], lookup: Lookup
) -> tuple[list[ContainerAsk], PodClaims | None]:
    """The containers' asks with what DRA gives them added as `claimed`, and the pod's claims as read (None
    when the pod asks nothing through DRA)."""
    claims = pod_claims(pod, lookup)
    extra: dict[str, dict[str, int]] = {}
    errors = list(claims.errors)
    for cname, idxs in claims.containers.items():
        table = extra.setdefault(cname, {})
        for i in idxs:
            a = claims.asks[i]
            if a.resource and a.count:
                table[a.resource] = table.get(a.resource, 0) + a.count
    mapped = lookup.classes.extended_names
    raw = _container_limits(pod)
    for c in containers:
        for name, value in raw.get(c.name, {}).items():
            if not name.startswith(EXTENDED_PREFIX) and name not in mapped:
                continue  # a device-plugin name (or one a class maps to it): counted in `amounts` already
            resource, err = extended_ask(name, lookup.classes)
            errors += [f"container {c.name}: {err}"] if err else []
            count = parse_count(value)
            if resource and count:
                table = extra.setdefault(c.name, {})
                table[resource] = table.get(resource, 0) + count
    if not claims.asks and not extra and not errors and not claims.notes:
        return containers, None
    out = [replace(c, claimed=extra[c.name]) if extra.get(c.name) else c for c in containers]
    return out, replace(claims, errors=tuple(errors))


def _container_limits(pod: Json) -> dict[str, dict[str, Any]]:
    """Container name -> its limits (else requests) of extended resources that are not nvidia.com/ names."""
    spec = pod.get("spec")
    out: dict[str, dict[str, Any]] = {}
    for key in ("initContainers", "containers"):
        items = spec.get(key) if isinstance(spec, dict) else None
        for i, c in enumerate(items if isinstance(items, list) else []):
            if not isinstance(c, dict):
                continue
            res = c.get("resources")
            table: dict[str, Any] = {}
            for section in ("requests", "limits"):  # limits win
                amounts = res.get(section) if isinstance(res, dict) else None
                if isinstance(amounts, dict):
                    table.update((k, v) for k, v in amounts.items() if isinstance(k, str) and "/" in k)
            name = _name(c, f"#{i}")
            out[name] = table
    return out


def asks_through_dra(spec: Json, classes: Classes) -> bool:
    """Cheap test before reading claims: the pod has claims, or a container names a DRA extended resource."""
    if spec.get("resourceClaims"):
        return True
    mapped = classes.extended_names
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        for c in items if isinstance(items, list) else []:
            res = c.get("resources") if isinstance(c, dict) else None
            for section in ("limits", "requests"):
                amounts = res.get(section) if isinstance(res, dict) else None
                if isinstance(amounts, dict) and any(
                    isinstance(k, str) and (k.startswith(EXTENDED_PREFIX) or k in mapped) for k in amounts
                ):
                    return True
    return False
