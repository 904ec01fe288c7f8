"""The GPU inventory the engine decides with, read from Node objects (GFD + topology labels) or declared pools.

Live nodes are the truth; declared pools describe nodes the webhook cannot see (or name the pool training
must land in). Everything here is computed once per inventory change, not per request.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, overload

import orjson

from policies import affinity, comm, dra, gpulabels, mig, nodeindex, topology
from policies.document import Policy, Pool
from policies.levelcounts import LevelCounts, Shape
from policies.nodeindex import NodeIndex
from policies.placement import memoize
from policies.resources import GPU, GPU_SHARED, is_gpu_resource, parse_count
from policies.selectors import NodeSelection, node_selection, selection_filter
from policies.workloads import Json

SHARING_LABEL = gpulabels.SHARING
PRODUCT_LABEL = gpulabels.PRODUCT
MIG_STRATEGY_LABEL = gpulabels.MIG_STRATEGY
SHARED_STRATEGIES = gpulabels.SHARED_STRATEGIES
_MIB = 2**20
# Candidates cached per inventory: distinct node selections seen (pods of one job share one), and the
# longest selection worth keeping (a normal one is a few hundred characters; a huge one is just recomputed).
CANDIDATES_CACHE_SIZE = 128
CANDIDATES_KEY_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class Offer:
    """One GPU resource a node advertises: `kind` is whole, mig or shared (time-sliced / MPS)."""

    resource: str
    count: int
    memory_bytes: int
    compute: int
    kind: str
    profile: str = ""
    # Published by a DRA driver under a name no DeviceClass serves as an extended resource: pods can claim
    # such devices, never ask them by this name (gpu-slice must not rewrite a container to it).
    claim_only: bool = False
    # Published by a DRA driver's ResourceSlices (not the Node's allocatable): a DeviceClass can select it by
    # memory or MIG profile, device by device (gpu-memory-class).
    dra: bool = False
    # A DRA whole-GPU offer: the largest capacity `memory` the slices publish (what a class's CEL compares),
    # 0 when none parses. `memory_bytes` keeps the nominal reading the other offers are ranked by.
    device_memory: int = 0


@dataclass(frozen=True, slots=True)  # slots: 50,000 of them, a dict each would be ~30 MB
class GpuNode:
    name: str
    labels: Mapping[str, str]
    product: str
    sharing: str
    mig_strategy: str
    whole_gpus: int
    memory_bytes: int
    offers: tuple[Offer, ...]
    rack: str | None
    pool: str | None
    # MIG is on for some GPU of the node (gpulabels.partitioned), whatever `mig_strategy` (GFD's naming
    # scheme, labelled on every GPU node by a default GPU Operator) says.
    partitioned: bool = False
    declared: bool = False  # synthesised from a declared pool: no live labels to select it by

    @property
    def shared(self) -> bool:
        return self.sharing in SHARED_STRATEGIES

    @property
    def whole_card(self) -> bool:
        """Whole, unshared cards only: not MIG, not time-sliced or MPS (the training-pool definition)."""
        return not self.shared and not self.partitioned and self.whole_gpus > 0

    def offer(self, resource: str) -> Offer | None:
        for o in self.offers:
            if o.resource == resource:
                return o
        return None


@dataclass(frozen=True, eq=False)
class NodeSet(Sequence[GpuNode]):
    """Some of an inventory's nodes (a bitmask over its index): the aggregates reviews ask for are mask
    operations; the nodes themselves are listed only when iterated."""

    universe: NodeIndex
    mask: int

    def __bool__(self) -> bool:
        return self.mask != 0

    def __len__(self) -> int:
        return self.mask.bit_count()

    @overload
    def __getitem__(self, i: int) -> GpuNode: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[GpuNode]: ...
    def __getitem__(self, i: int | slice) -> GpuNode | Sequence[GpuNode]:
        return self.nodes[i]

    def __iter__(self) -> Iterator[GpuNode]:
        return iter(self.nodes)

    @cached_property
    def nodes(self) -> tuple[GpuNode, ...]:
        return tuple(self.universe.node_list(self.mask))

    def having(self, *sets: Any) -> NodeSet:
        """The members that are in every one of the named sets (see _sets_of)."""
        mask = self.mask
        for name in sets:
            mask &= self.universe.set(name)
        return NodeSet(self.universe, mask)

    @property
    def offer_gpu(self) -> NodeSet:
        """The members that offer plain nvidia.com/gpu."""
        return NodeSet(self.universe, self.mask & self.universe.set(OFFERS_GPU))

    @property
    def all_shared(self) -> bool:
        """Not empty, and every member time-sliced or MPS."""
        return self.mask != 0 and not self.mask & ~self.universe.set(SHARED)

    @property
    def any_whole_card(self) -> bool:
        return (self.mask & self.universe.set(WHOLE_CARD)) != 0

    def members_of(self, kind: str) -> Iterator[tuple[Any, NodeSet]]:
        """(set name, members in it) for each named set of this kind (e.g. "offer", "product") it meets."""
        for name, posting in self.universe.sets.items():
            if isinstance(name, tuple) and name[0] == kind:
                mask = self.mask & nodeindex.as_mask(posting)
                if mask:
                    yield name, NodeSet(self.universe, mask)


OFFERS_GPU = "offers-gpu"
SHARED = "shared"
WHOLE_CARD = "whole-card"
DECLARED = "declared"


def _sets_of(node: GpuNode) -> list[Any]:
    """The named node sets of the index a node belongs to: kinds, its offers (with the memory a unit really
    gives: a time-sliced share is the card's memory / replicas) and its product."""
    out: list[Any] = [("product", node.product)]
    if node.shared:
        out.append(SHARED)
    if node.whole_card:
        out.append(WHOLE_CARD)
    if node.declared:
        out.append(DECLARED)
    for o in node.offers:
        if o.resource == GPU:
            out.append(OFFERS_GPU)
        mem = o.memory_bytes
        if o.kind == "shared" and o.resource in (GPU, GPU_SHARED):
            mem = node.memory_bytes // _replicas(node.labels)
        out.append(("offer", o, mem))
    return out


def _replicas(labels: Mapping[str, str]) -> int:
    """The units each GPU of a shared node is advertised as: GFD's replicas label, or on GKE (no GFD) its
    clients per GPU (time-sharing and MPS alike)."""
    gfd = _int_label(labels, "nvidia.com/gpu.replicas")
    return max(gfd or _int_label(labels, gpulabels.GKE_MAX_CLIENTS), 1)


@dataclass(frozen=True)
class Totals:
    """Counts the inventory's maxima come from, kept per value so one node's change is O(1) to apply."""

    whole_gpus: Mapping[int, int] = field(default_factory=dict)  # whole-card nodes by GPU count
    memory: Mapping[int, int] = field(default_factory=dict)  # offers by memory per unit
    gpu_units: Mapping[int, int] = field(default_factory=dict)  # nvidia.com/gpu offers by units (shared: 1)
    resources: Mapping[str, int] = field(default_factory=dict)  # nodes offering each resource
    rack_gpus: Mapping[str, int] = field(default_factory=dict)  # whole-card GPUs per rack
    rack_sizes: Mapping[int, int] = field(default_factory=dict)  # racks by whole-card GPUs
    pools: Mapping[str, int] = field(default_factory=dict)  # live nodes per declared pool

    def apply(self, removed: Iterable[GpuNode], added: Iterable[GpuNode]) -> Totals:
        edit = _CopyOnWrite(self)
        for sign, nodes in ((-1, removed), (1, added)):
            for n in nodes:
                _count(n, sign, edit)
        return Totals(**{name: edit.get(name, getattr(self, name)) for name in self.__dataclass_fields__})


class _CopyOnWrite(dict[str, dict[Any, int]]):
    """Totals' tables, each copied the first time it is edited."""

    def __init__(self, base: Totals) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, name: str) -> dict[Any, int]:
        table = self[name] = dict(getattr(self.base, name))
        return table


def _count(n: GpuNode, sign: int, t: dict[str, dict[Any, int]]) -> None:
    def bump(table: dict[Any, int], key: Any, by: int = 1) -> None:
        value = table.get(key, 0) + sign * by
        if value:
            table[key] = value
        else:
            table.pop(key, None)

    if n.whole_card:
        bump(t["whole_gpus"], n.whole_gpus)
        if n.rack:
            before = t["rack_gpus"].get(n.rack, 0)
            bump(t["rack_gpus"], n.rack, n.whole_gpus)
            after = t["rack_gpus"].get(n.rack, 0)
            if before:
                t["rack_sizes"][before] -= 1
                if not t["rack_sizes"][before]:
                    del t["rack_sizes"][before]
            if after:
                t["rack_sizes"][after] = t["rack_sizes"].get(after, 0) + 1
    for o in n.offers:
        bump(t["memory"], o.memory_bytes)
        bump(t["resources"], o.resource)
        if o.resource == GPU:
            bump(t["gpu_units"], 1 if o.kind == "shared" else o.count)
    if n.pool and not n.declared:
        bump(t["pools"], n.pool)


class TopologyEpoch:
    """One topology epoch (Inventory.topology_epoch): its identity, and answers derived from what stays the
    same through it (bounded like every memo)."""

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        self._memo: dict[Any, Any] = {}

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        return memoize(self._memo, key, compute)


@dataclass(frozen=True, eq=False)
class Inventory:
    """One immutable version of the GPU inventory: nodes in a NodeIndex, the maxima rules read, the rack
    label. `apply` makes the next version from node changes, sharing everything the changes do not touch."""

    index: NodeIndex
    totals: Totals
    rack_label: str | None
    rack_or_finer: frozenset[str]
    warnings: tuple[str, ...]
    rack_setting: str = "auto"  # the policy's topology.rack this version was built for
    pools: tuple[Pool, ...] = ()
    # Node-affinity expressions selecting the whole-card GPU nodes (training-pool) and the unshared ones
    # (online-exclusive), exact on this inventory.
    whole_card_expressions: tuple[Json, ...] = gpulabels.BASE_EXPRESSIONS
    not_shared_expressions: tuple[Json, ...] = gpulabels.BASE_EXPRESSIONS[:1]
    label_problems: tuple[str, ...] = ()  # GPU nodes those expressions cannot tell apart (also in warnings)
    # Topology levels narrowest first (topology.py), and per level the keys at that level or finer.
    levels: tuple[topology.Level, ...] = ()
    level_finer: tuple[frozenset[str], ...] = ()
    nvlink_key: str | None = None  # an NVLink-domain key on some GPU node, even when not a level
    nvlink_largest: int = 0  # whole GPUs of the largest domain of nvlink_key (ComputeDomains fit in one)
    level_setting: tuple[str, ...] = ()  # the policy's topology.levels this version was built for
    level_warnings: tuple[str, ...] = ()  # the levels' own warnings (also in warnings)
    # What the levels are read from, per label value: a node added or removed updates them in O(its keys).
    level_counts: LevelCounts = field(default_factory=lambda: LevelCounts(()))
    # The same object from version to version while no node came or went and nothing the levels read changed
    # (names, slots, level labels, whole-card GPUs): answers derived from those alone (placement's grouping
    # of candidates by domain) are kept on it and reused across heartbeats and label changes elsewhere.
    topology_epoch: TopologyEpoch = field(default_factory=lambda: TopologyEpoch(), compare=False)
    # DeviceClasses (served by the cluster, or the NVIDIA built-ins)
    classes: dra.Classes = field(default_factory=dra.Classes)
    # node selection -> candidates, least recently used first. Safe on the instance: an inventory never
    # changes (a node event makes a new one, which starts empty).
    _candidates: dict[bytes, tuple[NodeSelection, int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()` once per inventory version and key (bounded): answers derived from these nodes only."""
        return memoize(self._memo, key, compute)

    @property
    def empty(self) -> bool:
        return not self.index.slots

    @cached_property
    def nodes(self) -> tuple[GpuNode, ...]:
        """Every node, in slot order (O(nodes): for tests, tools and reports, not for reviews)."""
        return tuple(n for _, n in self.index.all_nodes())

    @property
    def node_count(self) -> int:
        return len(self.index)

    @property
    def zones(self) -> bool:
        return self.index.key_count(topology.ZONE) > 0

    @cached_property
    def max_whole_gpus(self) -> int:
        return max(self.totals.whole_gpus, default=0)

    @cached_property
    def max_memory_bytes(self) -> int:
        return max(self.totals.memory, default=0)

    @cached_property
    def max_rack_gpus(self) -> int:
        """Whole-card GPUs in the largest rack (0: no rack label)."""
        return max(self.totals.rack_sizes, default=0)

    @cached_property
    def largest_gpu_units(self) -> int:
        """The most nvidia.com/gpu one node gives a pod: a time-sliced / MPS node counts as one (its units are
        shares of a card, see shared-gpu-single)."""
        return max(self.totals.gpu_units, default=0)

    def offers(self, resource: str) -> bool:
        return resource in self.totals.resources

    @property
    def resources(self) -> Iterable[str]:
        return self.totals.resources.keys()

    @property
    def all(self) -> NodeSet:
        return NodeSet(self.index, self.index.every)

    def candidates(self, pod: Json) -> NodeSet:
        """GPU nodes the pod's nodeSelector / required node affinity allow (nodeName, nodeSelector and the
        required terms; tolerations, preferred affinity and pod affinity do not narrow it)."""
        selection = node_selection(pod)
        key = _selection_key(selection)
        if key is None:
            return NodeSet(self.index, self._match(selection))
        cache = self._candidates
        # pop + insert keeps the most recently used last. Each step stays valid if another thread's review
        # touches the cache in between: at worst an entry is computed twice or evicted late.
        hit = cache.pop(key, None)
        # The JSON key is one for null and NaN, and for a date and its string: an entry answers only an equal
        # selection (Python's ==, which tells those apart; 1 and 1.0 have different keys).
        if hit is None or hit[0] != selection:
            hit = (copy.deepcopy(selection), self._match(selection))  # a copy: the pod's lists may be edited
        cache[key] = hit
        while len(cache) > CANDIDATES_CACHE_SIZE:
            try:
                del cache[next(iter(cache))]
            except (KeyError, RuntimeError, StopIteration):
                break
        return NodeSet(self.index, hit[1])

    def _match(self, selection: NodeSelection) -> int:
        try:
            return nodeindex.selection_mask(self.index, selection)
        except RecursionError:  # a pathologically nested value: fall back to testing node by node
            allowed = selection_filter(selection)
            return nodeindex.bits(s for s, n in self.index.all_nodes() if allowed(n.labels, n.name))

    def level_for(self, gpus: int, known: bool) -> int | None:
        """Index of the narrowest level whose largest domain holds a job of `gpus` whole GPUs (by total
        capacity); the rack level when the size (or a job of MIG slices only) or the capacity is unknown; None
        when no domain can hold it. Once per inventory and size: every training review asks."""
        return self.memo(("level-for", gpus, known), lambda: (self._level_for(gpus, known),))[0]  # type: ignore[no-any-return]

    def _level_for(self, gpus: int, known: bool) -> int | None:
        if not known or gpus <= 0 or not any(lv.largest_gpus for lv in self.levels):
            return _rack_index(self.levels)
        return next((i for i, lv in enumerate(self.levels) if lv.largest_gpus >= gpus), None)

    def level_index(self, kind: str) -> int | None:
        return next((i for i, lv in enumerate(self.levels) if lv.kind == kind), None)

    def apply(self, changes: Mapping[str, GpuNode | None]) -> Inventory:
        """The next version: entry key -> node (added or replaced) or None (removed). Costs what the changed
        nodes touch, except when the detected rack label changes (every node's rack is re-read)."""
        return _next(self, dict(changes))


def _selection_key(selection: NodeSelection) -> bytes | None:
    """The cache key of a node selection: its JSON (several times faster than repr), or None when it has
    none (non-string keys, huge integers, nesting deeper than 255) or is longer than CANDIDATES_KEY_LIMIT."""
    try:
        key = orjson.dumps(selection)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return key if len(key) <= CANDIDATES_KEY_LIMIT else None


def _labels(node: Json) -> Mapping[str, str]:
    """The node's labels, all strings; a read-only Mapping other than a dict (cluster/labelsets.py's, shared
    between the nodes of a rack) is kept as it is, like a dict."""
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if not isinstance(labels, Mapping):
        return {}
    if all(type(k) is str and type(v) is str for k, v in labels.items()):
        return labels  # shared with the (read-only) Node object: 50,000 nodes need not hold two copies
    return {str(k): str(v) for k, v in labels.items()}


def _int_label(labels: Mapping[str, str], key: str, default: int = 0) -> int:
    value = labels.get(key, "")
    return int(value) if value.isascii() and value.isdigit() else default


def _gpu_resources(node: Json) -> dict[str, int] | None:
    """The GPU resources the status advertises (allocatable, else capacity), None where the node has no status
    of resources to read (a nodes file of labels only). A status naming no GPU, or 0 of one (every GPU unhealthy,
    the device plugin not up yet), offers none: the scheduler places nothing there, whatever GFD's labels say."""
    status = node.get("status")
    if not isinstance(status, dict):
        return None
    for key in ("allocatable", "capacity"):
        res = status.get(key)
        if isinstance(res, dict) and any(isinstance(k, str) and is_gpu_resource(k) for k in res):
            out = {}
            for name, raw in res.items():
                count = parse_count(raw)
                if isinstance(name, str) and is_gpu_resource(name) and count:
                    out[name] = count
            return out
    return {} if any(isinstance(status.get(k), dict) for k in ("allocatable", "capacity")) else None


def _resources_from_labels(labels: Mapping[str, str], sharing: str, mig_strategy: str) -> dict[str, int]:
    """Without a status (a nodes file of labels only), GFD's count labels say what the node advertises."""
    out: dict[str, int] = {}
    gpus = _int_label(labels, "nvidia.com/gpu.count")
    replicas = max(_int_label(labels, "nvidia.com/gpu.replicas", 1), 1)
    for key, value in labels.items():
        if key.startswith("nvidia.com/mig-") and key.endswith(".count") and value.isdigit():
            out[key[: -len(".count")]] = int(value)
    if gpus and (mig_strategy != "mixed" or not out):
        out[GPU] = gpus * (replicas if sharing in SHARED_STRATEGIES else 1)
    return out


def node_from_object(
    node: Json,
    pools: Sequence[Pool] = (),
    devices: dra.NodeDevices | None = None,
    served: frozenset[str] = dra.BUILT_IN_EXTENDED,
) -> GpuNode | None:
    """A GpuNode from a Node object, or None for a node with no GPU. `devices`: what the NVIDIA DRA driver's
    ResourceSlices publish for it, read as the offers a device plugin would advertise (the Node's own
    allocatable wins for a resource both name; `served`: the extended resources DeviceClasses map, the names a
    pod may ask such devices by)."""
    labels = _labels(node)
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    name = name if isinstance(name, str) else labels.get(topology.HOSTNAME, "")
    product = labels.get(PRODUCT_LABEL, "")
    info = mig.parse_product(product) if product else _gke_product(labels)
    if info is None and devices is not None and devices.product:
        info = mig.parse_product(devices.product)  # for the card's memory; node affinity still reads labels
    sharing = labels.get(SHARING_LABEL, "") or gpulabels.gke_sharing(labels)
    if sharing not in ("none", *SHARED_STRATEGIES):
        sharing = (
            "time-slicing" if (info and info.shared) or _int_label(labels, "nvidia.com/gpu.replicas", 1) > 1 else "none"
        )
    mig_strategy = labels.get(MIG_STRATEGY_LABEL, "none")
    if mig_strategy not in ("single", "mixed"):
        mig_strategy = "single" if info and info.mig_profile else "none"
    resources = _gpu_resources(node)
    if resources is None:  # a DRA node's GPUs are what its slices publish, not its labels
        resources = _resources_from_labels(labels, sharing, mig_strategy) if devices is None else {}
    claim_only: frozenset[str] = frozenset()
    published: frozenset[str] = frozenset()
    if devices is not None:
        published = frozenset(devices.resources) - set(resources)
        claim_only = published - served
        resources = {**devices.resources, **resources}
    if not resources and labels.get("nvidia.com/gpu.present") != "true":
        return None
    pool = next((p.name for p in pools if all(labels.get(k) == v for k, v in p.node_selector.items())), None)
    parted = gpulabels.partitioned(labels, info.mig_profile if info else None, resources)
    built = _build(
        name,
        labels,
        product,
        info,
        sharing,
        mig_strategy,
        resources,
        pool,
        partitioned=parted,
        claim_only=claim_only,
        published=published,
    )
    if devices is not None:
        return _with_devices(built, devices.memory_bytes)
    return built


def renamed(n: GpuNode, name: str, labels: Mapping[str, str]) -> GpuNode:
    """`n` as node_from_object reads another node whose labels differ from n's only by the hostname label,
    with the same status, pools and devices: it reads the hostname only through pools that select on it
    (`hostname_pools`), so only the name and the labels differ."""
    values: list[Any] = [name if f == "name" else labels if f == "labels" else getattr(n, f) for f in _NODE_FIELDS]
    return GpuNode(*values)


def hostname_pools(pools: Sequence[Pool]) -> bool:
    """Some pool selects nodes by hostname: `renamed` would not do for them."""
    return any(topology.HOSTNAME in p.node_selector for p in pools)


def _with_devices(n: GpuNode, device_memory: int) -> GpuNode:
    """The node with the card memory the DRA driver reports (capacity `memory`) on its whole-GPU offers: as
    their memory when larger than the nominal one, and as what a DeviceClass's memory selector compares."""
    memory = max(n.memory_bytes, device_memory)
    offers = tuple(
        _shared_offer(
            Offer(o.resource, o.count, memory, o.compute, o.kind, o.profile, o.claim_only, o.dra, device_memory)
        )
        if o.kind == "whole"
        else o
        for o in n.offers
    )
    values: list[Any] = [
        memory if f == "memory_bytes" else offers if f == "offers" else getattr(n, f) for f in _NODE_FIELDS
    ]
    return GpuNode(*values)


def _gke_product(labels: Mapping[str, str]) -> mig.ProductInfo | None:
    """GKE nodes carry no GFD product: the accelerator label (and partition size) say the same thing."""
    gfd = gpulabels.GKE_PRODUCTS.get(labels.get(gpulabels.GKE_ACCELERATOR, ""))
    if gfd is None:
        return None
    partition = labels.get(gpulabels.GKE_PARTITION, "")
    return mig.parse_product(f"{gfd}-MIG-{partition}" if partition else gfd)


def _build(
    name: str,
    labels: Mapping[str, str],
    product: str,
    info: mig.ProductInfo | None,
    sharing: str,
    mig_strategy: str,
    resources: Mapping[str, int],
    pool: str | None,
    *,
    partitioned: bool,
    declared: bool = False,
    claim_only: frozenset[str] = frozenset(),
    published: frozenset[str] = frozenset(),
) -> GpuNode:
    # Same nominal reading for whole cards: an H100 80GB reports 81559 MiB but is "the 80 GiB GPU".
    gpu_mem = _int_label(labels, "nvidia.com/gpu.memory") * _MIB
    if info and info.model:
        gpu_mem = max(gpu_mem, mig.memory_bytes(info.model))
    shared = sharing in SHARED_STRATEGIES
    offers: list[Offer] = []
    whole = 0
    for resource, count in sorted(resources.items()):
        parsed = mig.parse_mig_resource(resource)
        if parsed is not None:
            # Nominal size (the `Ngb` of the name read as GiB, see mig.py): GFD's exact per-profile MiB is a
            # little smaller, and matching on it would push a `10Gi` ask past the 10gb slice users mean.
            mem = parsed.memory_gb * 2**30
            kind = "shared" if parsed.shared or shared else "mig"
            only, dra = resource in claim_only, resource in published
            offers.append(Offer(resource, count, mem, parsed.compute, kind, parsed.profile, only, dra))
        elif resource == GPU and mig_strategy == "single" and info and info.mig_profile:
            try:
                p = mig.parse_mig_resource(mig.resource_name(info.mig_profile))
            except ValueError:  # a product label's profile no device plugin names (`-MIG-1g.05gb`): size unknown
                p = None
            mem = p.memory_gb * 2**30 if p else 0
            offers.append(Offer(resource, count, mem, p.compute if p else 0, "shared" if shared else "mig",
                                info.mig_profile))  # fmt: skip
        elif resource in (GPU, GPU_SHARED):
            kind = "shared" if shared or resource == GPU_SHARED else "whole"
            offers.append(
                Offer(resource, count, gpu_mem, 0, kind, claim_only=resource in claim_only, dra=resource in published)
            )
            if kind == "whole":
                whole = count
    return GpuNode(
        name=name,
        labels=labels,
        product=product,
        sharing=sharing or "none",
        mig_strategy=mig_strategy,
        whole_gpus=whole,
        memory_bytes=gpu_mem,
        offers=tuple(_shared_offer(o) for o in offers),
        rack=None,
        pool=pool,
        partitioned=partitioned,
        declared=declared,
    )


_OFFERS: dict[Offer, Offer] = {}
OFFERS_SHARED = 4096  # distinct offers kept as one instance each; past that (hostile counts) new ones are not


def _shared_offer(o: Offer) -> Offer:
    """One instance per distinct offer: 50,000 nodes advertise a few dozen different ones."""
    hit = _OFFERS.get(o)
    if hit is None and len(_OFFERS) < OFFERS_SHARED:
        hit = _OFFERS[o] = o
    return hit or o


def _pool_nodes(pool: Pool, rack_key: str) -> list[GpuNode]:
    """Synthesise the nodes a declared pool describes, so sizing rules can use it like live nodes."""
    labels = dict(pool.node_selector)
    if pool.product:
        labels[PRODUCT_LABEL] = pool.product
    if pool.rack:
        labels[rack_key] = pool.rack
    labels[SHARING_LABEL] = pool.sharing
    if pool.mig_strategy != "none":
        labels[MIG_STRATEGY_LABEL] = pool.mig_strategy
    info = mig.parse_product(pool.product) if pool.product else None
    resources: dict[str, int] = {}
    if pool.mig_strategy == "mixed":
        resources = {mig.resource_name(p): n for p, n in pool.mig_profiles.items()}
    elif pool.gpus_per_node:
        resources[GPU] = pool.gpus_per_node * (pool.replicas if pool.sharing != "none" else 1)
    if not labels.get("nvidia.com/gpu.memory") and info and info.model:
        labels["nvidia.com/gpu.memory"] = str(mig.memory_bytes(info.model) // _MIB)
    # A declared pool's migStrategy describes its layout (MIG on), not GFD's naming scheme.
    parted = pool.mig_strategy != "none"
    return [
        _build(
            f"{pool.name}-{i}",
            {**labels, topology.HOSTNAME: f"{pool.name}-{i}"},
            pool.product,
            info,
            pool.sharing,
            pool.mig_strategy,
            resources,
            pool.name,
            partitioned=parted,
            declared=True,
        )
        for i in range(pool.nodes)
    ]


def build(
    nodes: Iterable[Any],
    policy: Policy,
    devices: Mapping[str, dra.NodeDevices] | None = None,
    classes: dra.Classes | None = None,
) -> Inventory:
    """The inventory from Node objects (non-GPU nodes are skipped) plus the policy's declared pools; with the
    devices ResourceSlices publish per node name, and the cluster's DeviceClasses, when it serves DRA."""
    found: dict[str, GpuNode] = {}
    devices = devices or {}
    served = classes.served_names if classes is not None else dra.BUILT_IN_EXTENDED
    for obj in nodes:
        n = node_from_object(obj, policy.pools, devices.get(_name(obj)), served) if isinstance(obj, dict) else None
        if n is not None:
            key = n.name if n.name not in found else f"{n.name}\x00{len(found)}"  # a file may repeat names
            found[key] = n
    return from_nodes(found, policy, classes)


def from_nodes(found: Mapping[str, GpuNode], policy: Policy, classes: dra.Classes | None = None) -> Inventory:
    """The inventory of nodes already read (entry key -> node), e.g. while their list was still arriving."""
    # The rack label first (as detection will find it), so no node is indexed twice.
    rack = policy.rack if policy.rack != "auto" else topology.detect_rack_label(n.labels for n in found.values())[0]
    return empty(policy, rack, classes).apply(found)


def build_cluster(objects: Iterable[Any], policy: Policy) -> Inventory:
    """The inventory from what `kubectl get nodes,resourceslices,deviceclasses -o yaml` prints (other kinds are
    ignored): DeviceClasses given are the cluster's classes; without any, the NVIDIA driver's are assumed."""
    objs = [o for o in objects if isinstance(o, dict)]
    classes = [o for o in objs if o.get("kind") == "DeviceClass"]
    return build(
        [o for o in objs if o.get("kind") == "Node"],
        policy,
        devices=dra.node_devices(o for o in objs if o.get("kind") == "ResourceSlice"),
        classes=dra.classes_from_objects(classes) if classes else None,
    )


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def empty(policy: Policy, rack_label: str | None = None, classes: dra.Classes | None = None) -> Inventory:
    """No live node: the policy's declared pools only."""
    return Inventory(
        NodeIndex(),
        Totals(),
        rack_label,
        topology.rack_or_finer(rack_label),
        (),
        policy.rack,
        tuple(policy.pools),
        level_setting=tuple(policy.levels),
        level_counts=LevelCounts(topology.candidate_keys(policy.levels, policy.rack)),
        classes=classes or dra.Classes(),
    ).apply({})


POOL_KEY = "\x00pool/"  # entry keys of declared pools' nodes: no Node name can start with a NUL


def _next(inv: Inventory, changes: dict[str, GpuNode | None]) -> Inventory:
    index = inv.index
    changes.update(_pool_changes(inv, changes))
    rack = inv.rack_label
    removed: list[GpuNode] = []
    added: list[GpuNode] = []
    counts = inv.level_counts
    shapes_gone: list[Shape] = []
    shapes_new: list[Shape] = []
    nvlink_touched = False  # an NVLink key's value changed: under declared levels that leave it out, no shape does
    for key, n in changes.items():
        slot = index.slots.get(key)
        old = index.node(slot) if slot is not None else None
        if n is not None:
            n = changes[key] = _with_rack(n, rack)
        if not _same_level_facts(old, n):
            # (A node that came or went changes the candidates' mask, which the groupings are memoized by.)
            nvlink_touched |= old is not None and n is not None and _nvlink_values(old) != _nvlink_values(n)
            gone, new = _shape(counts, old), _shape(counts, n)
            if gone != new:
                shapes_gone += [gone] if gone is not None else []
                shapes_new += [new] if new is not None else []
        if old is not None and n is not None and _counted(old) == _counted(n):
            continue  # the usual status update: nothing the totals count has changed
        removed += [old] if old is not None else []
        added += [n] if n is not None else []
    index = index.apply(changes, _sets_of)
    totals = inv.totals.apply(removed, added) if removed or added else inv.totals
    counts = counts.apply(shapes_gone, shapes_new) if shapes_gone or shapes_new else counts
    # Any shape change, not the net delta: a node swapped for a same-shaped one still moves the topology epoch.
    levels_touched = bool(shapes_gone or shapes_new)
    # No key came or went and no value changed (an empty value is no rack label: see _labelled).
    same_keys = index.has is inv.index.has and index.labels is inv.index.labels
    detected = rack if same_keys else _rack_label(index, inv.rack_setting)
    if detected != rack:  # every node's rack changes: re-read them all (rare: the first GPU node with a rack label)
        rack = detected
        every = {k: _with_rack(index.node(slot), rack) for k, slot in index.slots.items()}
        index = index.apply(every, _sets_of)
        totals = Totals().apply((), every.values())
    if affinity.same_inputs(inv.index, index):  # heartbeats, and labels the expressions never read
        whole, unshared, problems = inv.whole_card_expressions, inv.not_shared_expressions, inv.label_problems
    else:
        whole, unshared, found = affinity.expressions(index, _groups(index))
        problems = tuple(found)
    if not levels_touched and rack == inv.rack_label:  # heartbeats, and labels no level can read (health...)
        levels, level_warnings = inv.levels, inv.level_warnings
    else:
        # From the counts: O(candidate keys), only when a node came or went or a level input changed.
        levels, found_warnings = _levels(index, inv, counts, rack)
        levels = inv.levels if levels == inv.levels else levels  # the same: keep what is derived from them
        level_warnings = tuple(found_warnings)
    # Every version (O(NVLink keys)): under declared levels that leave it out, an NVLink key's labels (GFD adds
    # the clique once the fabric is up, after the node joined) touch no level count.
    nvlink_key = next((k for k in topology.NVLINK_KEYS if _labelled(index, k)), None)
    # From the same counts (O(1)); 0 when the policy's declared levels leave the key out of them.
    nvlink_largest = counts.view().key(nvlink_key).largest if nvlink_key else 0
    same_levels = levels is inv.levels
    # A new epoch drops what was memoized on the old one: the groupings by domain, a clique's among them.
    same_topology = not levels_touched and not nvlink_touched and rack == inv.rack_label
    epoch = inv.topology_epoch if same_topology else TopologyEpoch()
    return Inventory(
        index=index,
        totals=totals,
        rack_label=rack,
        rack_or_finer=inv.rack_or_finer if same_levels and rack == inv.rack_label else _rack_or_finer(levels, rack),
        warnings=(*level_warnings, *problems),
        rack_setting=inv.rack_setting,
        pools=inv.pools,
        whole_card_expressions=whole,
        not_shared_expressions=unshared,
        label_problems=problems,
        levels=levels,
        level_finer=inv.level_finer
        if same_levels
        else tuple(topology.finer_keys(levels, i) for i in range(len(levels))),
        nvlink_key=nvlink_key,
        nvlink_largest=nvlink_largest,
        level_setting=inv.level_setting,
        level_warnings=level_warnings,
        level_counts=counts,
        topology_epoch=epoch,
        classes=inv.classes,
    )


def _levels(
    index: NodeIndex, inv: Inventory, counts: LevelCounts, rack: str | None
) -> tuple[tuple[topology.Level, ...], list[str]]:
    """The topology levels over the whole-card nodes (all GPU nodes when there are none), and warnings."""
    placed = counts.view()
    # Keys with a value: a label present only with an empty value describes no fabric (and must not make the
    # zone a level, see topology.auto_keys).
    labelled = frozenset(k for k in placed.present() if placed.key(k).have)
    keys = list(inv.level_setting) or topology.auto_keys(labelled, rack)
    levels, warnings = topology.build_levels(placed, keys, declared=bool(inv.level_setting))
    setting = inv.rack_setting
    if not index.slots:
        return levels, warnings
    if setting != "auto" and not _labelled(index, setting):
        warnings.append(f"no GPU node carries the rack label {setting!r} set in topology.rack")
    elif not levels:
        warnings.append(
            "no GPU node carries a rack label (topology.kubernetes.io/rack, EKS/GKE/OKE/Topograph ones) or an "
            "NVLink clique: training-rack cannot be applied; set topology.levels or label the nodes"
        )
    return levels, warnings


def _rack_or_finer(levels: tuple[topology.Level, ...], rack: str | None) -> frozenset[str]:
    index = _rack_index(levels)
    return topology.finer_keys(levels, index) if index is not None else topology.rack_or_finer(rack)


def _rack_index(levels: tuple[topology.Level, ...]) -> int | None:
    """The level a job of unknown size is kept in: the first switch level (the rack), else the first one."""
    return next((i for i, lv in enumerate(levels) if lv.kind == "switch"), 0 if levels else None)


def level_report(inv: Inventory, policy: Policy) -> list[dict[str, Any]]:
    """The levels for /readyz: each with its domains and what spreading a job that fills its largest domain
    over two of them would cost (the policy's comm model)."""
    out = []
    for level in inv.levels:
        across = topology.domains_text(level, inv.rack_label)
        try:
            penalty = comm.level_phrase(
                level.kind,
                across,
                policy.comm.message_bytes,
                max(level.largest_gpus, 2),
                inv.max_whole_gpus or 8,
                policy.comm.bandwidths(),
            )
        except ValueError:
            penalty = ""
        out.append(
            {
                "key": level.key,
                "kind": level.kind,
                "domains": level.domains,
                "nodes": level.nodes,
                "largestDomainGpus": level.largest_gpus,
                "penalty": penalty,
            }
        )
    return out


def _groups(index: NodeIndex) -> affinity.Groups:
    live = index.every & ~index.set(DECLARED)
    gpu = live & index.set(OFFERS_GPU)
    whole = index.set(WHOLE_CARD)
    shared = index.set(SHARED)
    return affinity.Groups(whole=live & whole, not_whole=gpu & ~whole, exclusive=gpu & ~shared, shared=gpu & shared)


def _same_level_facts(old: GpuNode | None, new: GpuNode | None) -> bool:
    """The usual status update (one C comparison of the labels): the node's shape for the levels is the same."""
    return (
        old is not None
        and new is not None
        and old.labels == new.labels
        and old.whole_card == new.whole_card
        and old.whole_gpus == new.whole_gpus
    )


def _nvlink_values(n: GpuNode) -> tuple[str | None, ...]:
    return tuple(n.labels.get(k) for k in topology.NVLINK_KEYS)


def _shape(counts: LevelCounts, n: GpuNode | None) -> Shape | None:
    """What the level counts read of a node (None: no node)."""
    return counts.shape(n.labels, n.whole_card, n.whole_gpus) if n is not None else None


def _counted(n: GpuNode) -> tuple[Any, ...]:
    """What Totals reads of a node."""
    return (n.whole_card, n.whole_gpus, n.rack, n.offers, n.pool, n.declared)


def _with_rack(n: GpuNode, rack_label: str | None) -> GpuNode:
    rack = n.labels.get(rack_label) if rack_label else None
    if n.rack == rack:
        return n
    # Positionally, not dataclasses.replace (keyword matching, several times slower): a first list of 50,000
    # nodes stamps every one of them.
    values: list[Any] = [rack if f == "rack" else getattr(n, f) for f in _NODE_FIELDS]
    return GpuNode(*values)


_NODE_FIELDS = tuple(f.name for f in fields(GpuNode))


def _pool_changes(inv: Inventory, changes: Mapping[str, GpuNode | None]) -> dict[str, GpuNode | None]:
    """Declared pools stand in for nodes the webhook cannot see: a pool's stand-in nodes exist exactly while
    no live node is in the pool."""
    if not inv.pools:
        return {}
    live = dict(inv.totals.pools)
    for key, n in changes.items():
        slot = inv.index.slots.get(key)
        old = inv.index.node(slot) if slot is not None else None
        for node, sign in ((old, -1), (n, 1)):
            if node is not None and node.pool and not node.declared:
                live[node.pool] = live.get(node.pool, 0) + sign
    rack_key = inv.rack_setting if inv.rack_setting != "auto" else "topology.kubernetes.io/rack"
    out: dict[str, GpuNode | None] = {}
    for pool in inv.pools:
        present = f"{POOL_KEY}{pool.name}/0" in inv.index.slots
        if not live.get(pool.name) and not present:
            out.update((f"{POOL_KEY}{pool.name}/{i}", n) for i, n in enumerate(_pool_nodes(pool, rack_key)))
        elif live.get(pool.name) and present:
            out.update((f"{POOL_KEY}{pool.name}/{i}", None) for i in range(pool.nodes))
    return out


def _rack_label(index: NodeIndex, setting: str) -> str | None:
    if setting != "auto":
        return setting
    return next((key for key in topology.AUTO_ORDER if _labelled(index, key)), None)


def _labelled(index: NodeIndex, key: str) -> int:
    """Nodes with a non-empty value for key."""
    values = index.labels.get(key)
    return index.key_count(key) - (nodeindex.count(values.get("")) if values is not None else 0)
