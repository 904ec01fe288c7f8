"""Node objects cut down at decode time to what the GPU inventory reads, like client-go's transform functions.

A kubelet-managed Node carries status.images, conditions, nodeInfo and managedFields: tens of KB the
inventory never reads. `NodeTransform` keeps metadata.name, metadata.labels, metadata.resourceVersion (the
reflector compares versions on a relist), spec.taints, spec.unschedulable and the GPU resources of
status.allocatable / status.capacity (names under RESOURCE_PREFIXES: what policies.resources calls a GPU
resource), and drops the rest before the object is cached: ~1 KB a node instead of ~15-40 KB.

Hostile or broken content never reaches the inventory and never stops the others (limits below, each
counted by reason in `counts`, exported as gpu_admission_node_objects_clipped_total):
- a label whose key or value breaks the API server's own validation lengths is dropped ("label-too-long");
- a Node with more than MAX_LABELS labels is skipped whole ("too-many-labels"): which of them to keep is
  a guess, and a wrong guess (say, losing the sharing-strategy label) would put pods on the wrong nodes;
- a GPU resource whose amount is not a non-negative integer is dropped ("bad-resource"), as are entries past
  MAX_RESOURCES of a resource map;
- a Node without a name is skipped ("no-name"); so is one that is not a JSON object ("not-an-object").

Decoding is cut down too (`decode_list`, `decode_event`): a 50,000-node list is ~700 MB of JSON, mostly
images and managedFields. msgspec reads each page against the shape below and skips every other field while
parsing, without building it (a fifth of the CPU of decoding whole objects). A page or event of any other
shape (a non-object item, a string where an object belongs) is decoded whole instead, and the transform
judges it as before; nesting deeper than Python's recursion limit is refused like orjson's depth limit.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from cluster.interned import shared
from cluster.labelsets import LabelSets

JSON = dict[str, Any]

# The API server's validation: a qualified name is an optional DNS-subdomain prefix (<= 253) + "/" + a name
# (<= 63); a label value is <= 63 characters. Nothing longer can come from a real API server.
MAX_KEY = 253 + 1 + 63
MAX_VALUE = 63
MAX_LABELS = 1000  # real GPU nodes carry 50-200 (GFD, NFD, cloud); the API server sets no count limit
MAX_RESOURCES = 128
MAX_TAINTS = 64
MAX_QUANTITY = 64  # characters of a resource amount
RESOURCE_PREFIXES = ("nvidia.com/",)  # the resources kept (policies.resources.NVIDIA_PREFIX; cluster/ cannot import it)


class NodeTransform:
    """Callable Node -> slim Node (or None: skip it), counting what it drops. Thread-safe counts."""

    def __init__(self, label_sets: LabelSets | None = None) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.label_sets = label_sets if label_sets is not None else LabelSets()  # shared by this watch's nodes

    def _count(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.counts[reason] = self.counts.get(reason, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def __call__(self, obj: Any) -> JSON | None:
        if not isinstance(obj, dict):
            self._count("not-an-object")
            return None
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            self._count("no-name")
            return None
        labels = self._labels(meta.get("labels"))
        if labels is None:
            return None
        slim_meta: JSON = {"name": sys.intern(name), "labels": labels}  # the same string as its hostname label
        rv = meta.get("resourceVersion")
        if isinstance(rv, str):
            slim_meta["resourceVersion"] = rv
        out: JSON = {"metadata": slim_meta}
        spec = obj.get("spec")
        if isinstance(spec, dict):
            slim_spec: JSON = {}
            taints = spec.get("taints")
            if isinstance(taints, list) and taints:
                slim_spec["taints"] = [t for t in taints[:MAX_TAINTS] if isinstance(t, dict)]
            if spec.get("unschedulable") is True:
                slim_spec["unschedulable"] = True
            if slim_spec:
                out["spec"] = slim_spec
        status = obj.get("status")
        if isinstance(status, dict):
            out["status"] = slim_status = {}
            for key in ("allocatable", "capacity"):
                section = status.get(key)
                if isinstance(section, dict):
                    slim_status[key] = self._resources(section)
                    if any(isinstance(k, str) and k.startswith(RESOURCE_PREFIXES) for k in section):
                        break  # capacity is read only when allocatable names no GPU resource
        return out

    def _labels(self, raw: Any) -> Mapping[str, str] | None:
        if not isinstance(raw, dict):
            return {}
        if len(raw) > MAX_LABELS:
            self._count("too-many-labels")
            return None
        out: dict[str, str] = {}
        dropped = 0
        for k, v in raw.items():
            if not isinstance(k, str) or len(k) > MAX_KEY:
                dropped += 1
                continue
            value = v if isinstance(v, str) else str(v)
            if len(value) > MAX_VALUE:
                dropped += 1
                continue
            # Interned: 50,000 nodes share a few hundred distinct keys and values (products, zones, strategies).
            out[sys.intern(k)] = sys.intern(value)
        if dropped:
            self._count("label-too-long", dropped)
        return self.label_sets.share(out)

    def _resources(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        dropped = 0
        for i, (name, amount) in enumerate(raw.items()):
            if i >= MAX_RESOURCES or not isinstance(name, str) or len(name) > MAX_KEY:
                dropped += 1
            elif not name.startswith(RESOURCE_PREFIXES):
                continue  # cpu, memory, pods, other devices: nothing the inventory reads
            elif not _amount_ok(name, amount):
                dropped += 1
            else:
                out[sys.intern(name)] = sys.intern(amount) if isinstance(amount, str) else amount
        if dropped:
            self._count("bad-resource", dropped)
        return out


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A cut-down Node as the node Reflector keeps it: the slim object's few fields without its four nested
    dicts (~700 bytes a node: 33 MB at 50,000 nodes), the resource section shared by nodes with the same
    resources. `as_object()` gives the slim object back for the inventory (its labels the same dict)."""

    name: str
    version: str | None
    labels: Mapping[str, str]  # a NodeLabels (cluster/labelsets.py), or a dict without a hostname
    spec: JSON | None  # the slim spec (taints, unschedulable), None without
    status: JSON | None  # the slim status (GPU allocatable / capacity), shared, None without

    def as_object(self) -> JSON:
        meta: JSON = {"name": self.name, "labels": self.labels}
        if self.version is not None:
            meta["resourceVersion"] = self.version
        out: JSON = {"metadata": meta}
        if self.spec is not None:
            out["spec"] = self.spec
        if self.status is not None:
            out["status"] = self.status
        return out


_STATUSES: dict[Any, JSON] = {}
MAX_SHARED_STATUSES = 4096  # distinct resource sections kept shared (a cluster has a few dozen node shapes)


def record(slim: JSON | None) -> NodeRecord | None:
    """The record of a slim Node (NodeTransform's output); None for None."""
    if slim is None:
        return None
    meta = slim["metadata"]
    return NodeRecord(
        meta["name"], meta.get("resourceVersion"), meta["labels"], slim.get("spec"), _shared(slim.get("status"))
    )


def _shared(status: JSON | None) -> JSON | None:
    """One dict per distinct resource section (read-only, like every cached object)."""
    if status is None:
        return None
    try:
        key = tuple((section, tuple(sorted(values.items()))) for section, values in status.items())
    except TypeError:  # an amount of no order or hash: kept as it is
        return status
    return shared(_STATUSES, key, status, MAX_SHARED_STATUSES)


def as_object(node: JSON | NodeRecord) -> JSON:
    """A slim Node object, from a record or as it is."""
    return node.as_object() if isinstance(node, NodeRecord) else node


def same_content(old: JSON | NodeRecord | None, new: JSON | NodeRecord | None) -> bool:
    """Two cut-down Nodes equal but for their resourceVersion: nothing the inventory reads has changed. Most
    Node updates are such (kubelet status: conditions, images, heartbeats; all cut away by the transform)."""
    if isinstance(old, NodeRecord) and isinstance(new, NodeRecord):
        return (old.name, old.labels, old.spec, old.status) == (new.name, new.labels, new.spec, new.status)
    old, new = as_object(old) if old is not None else None, as_object(new) if new is not None else None
    if old is None or new is None or old.keys() != new.keys():
        return False
    for key, value in old.items():
        other = new[key]
        if key != "metadata":
            if value != other:
                return False
        elif not isinstance(value, dict) or not isinstance(other, dict) or _unversioned(value) != _unversioned(other):
            return False
    return True


def _unversioned(meta: JSON) -> JSON:
    return {k: v for k, v in meta.items() if k != "resourceVersion"}


def _amount_ok(name: str, amount: Any) -> bool:
    """Extended resources (GPUs among them) are whole, non-negative counts."""
    if isinstance(amount, bool):
        return False
    if isinstance(amount, int):
        return amount >= 0
    return isinstance(amount, str) and 0 < len(amount) <= MAX_QUANTITY and amount.isascii() and amount.isdigit()


# What the transform reads, and nothing else: msgspec skips every other field without building it. Leaves are
# `Any` so that odd values reach the transform (which counts and drops them) instead of failing the page.
class _Meta(msgspec.Struct):
    name: Any = None
    resourceVersion: Any = None
    labels: Any = None


class _Spec(msgspec.Struct):
    taints: Any = None
    unschedulable: Any = None


class _Status(msgspec.Struct):
    allocatable: Any = None
    capacity: Any = None


class _Node(msgspec.Struct):
    metadata: _Meta | None = None
    spec: _Spec | None = None
    status: _Status | None = None


class _NodeList(msgspec.Struct):
    metadata: Any = None
    items: list[_Node] | None = None


class _Event(msgspec.Struct):
    type: Any = None
    object: msgspec.Raw = msgspec.Raw(b"null")


_LIST = msgspec.json.Decoder(_NodeList)
_NODE = msgspec.json.Decoder(_Node)
_EVENT = msgspec.json.Decoder(_Event)
_UNEXPECTED = (msgspec.ValidationError, msgspec.DecodeError, RecursionError)
NODE_EVENTS = ("ADDED", "MODIFIED", "DELETED")  # other types (BOOKMARK, ERROR) are decoded whole


def decode_list(data: bytes | memoryview) -> Any:
    """A NodeList page as {"metadata", "items"} with each item cut down to what the transform reads."""
    try:
        page = _LIST.decode(data)
    except _UNEXPECTED:
        return orjson.loads(data)  # not the usual shape: whole, for the transform to judge item by item
    items = page.items
    return {"metadata": page.metadata, "items": [_plain(n) for n in items] if items is not None else None}


def decode_event(line: bytes) -> Any:
    """One watch line as {"type", "object"}; a Node event's object cut down like a list item."""
    try:
        event = _EVENT.decode(line)
        if event.type not in NODE_EVENTS:
            return orjson.loads(line)
        return {"type": event.type, "object": _plain(_NODE.decode(event.object))}
    except _UNEXPECTED:
        return orjson.loads(line)


NODE_DECODERS = (decode_list, decode_event)  # for Reflector(decoders=...)


def _plain(n: _Node) -> JSON:
    out: JSON = {}
    if (m := n.metadata) is not None:
        out["metadata"] = {"name": m.name, "resourceVersion": m.resourceVersion, "labels": m.labels}
    if (spec := n.spec) is not None:
        out["spec"] = {"taints": spec.taints, "unschedulable": spec.unschedulable}
    if (st := n.status) is not None:
        out["status"] = {k: v for k, v in (("allocatable", st.allocatable), ("capacity", st.capacity)) if v is not None}
    return out
