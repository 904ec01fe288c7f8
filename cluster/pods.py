"""The pod view: GPUs held per node and where each job's pods are bound, kept from a Pod list + watch.

Only what placement needs is kept per pod (`PodEntry`: node, GPU requests per resource, phase, job), and
every change costs O(1): the pod's old entry is taken out of the per-node and per-job counts and its new one
put in. Pods that ended (Succeeded, Failed) or were deleted free their GPUs; an unbound pod holds none yet.

Memory: a cluster of 50,000 nodes runs hundreds of thousands of pods. `PodView.transform` is the pod
Reflector's transform: a pod without GPUs is not kept at all, and a GPU pod becomes its `PodEntry`, which
the view stores by column (cluster/podtable.py: ~70 bytes a pod, no object per pod) instead of its object
(~3 KB cut down, 5-10 KB whole). The view is the pod Reflector's store (`State.watch_pods`), so the entries
are kept once, not in the Reflector's dict as well; `get` and the changes the view hears rebuild entries.
A job's counts per node are one flat tuple (`NodeCounts`).

Another reader of the same watch (the post-launch ledger, webhook/ledger.py) gets its few fields without a
watch or pod objects of its own: the view's optional `note` reader adds a small hashable value to the entry
each pod event makes (`PodEntry.note`), and the listener reads it from the change. The note is not cached:
the ledger never reads an old one (it keeps what it needs of the pods it tracks), so the view keeps none.

GPUs a pod gets through ResourceClaims (DRA) are not in the pod: they are the devices allocated in the claim's
status. `apply_claim` counts them from a ResourceClaim list + watch, per claim on the node its allocation is
on (a claim shared by several pods holds its devices once); a pod with claims is kept even when it asks no
device-plugin GPU, so its job's bound pods are known.

A job whose pods wait unbound is told why, per pod event (`on_pending(job, why)`, `waiting`): the server's
placement reservations end early for a gang that will not bind soon (webhook/reservations.py). Nothing is kept
per pod for it: the reason is read from the object in `transform`, on the watch thread.

Readers get an immutable `PodSnapshot`, built at most once per change of the view (on the first read after
it), so a review never walks the pods. What a pod's GPUs and job are is the caller's to say (`read`): this
layer knows no GPU resource names or job labels (those are policies/'s). A pod `read` cannot make sense
of is skipped and counted, never raised.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cluster.interned import shared
from cluster.layered import Layered
from cluster.podtable import TERMINATED, PodTable
from cluster.podtable import PodEntry as PodEntry  # its home before the table; callers import it from here
from cluster.reflector import Change, object_key

# Why an unbound GPU pod of a job is not bound yet (`waiting`; PodView tells `on_pending` on each event).
GATED = "gated"  # spec.schedulingGates (or the PodScheduled reason SchedulingGated): a controller holds it back
UNSCHEDULABLE = "unschedulable"  # PodScheduled=False, reason Unschedulable, no node nominated: no node takes it
# ... and all the scheduler found short on the nodes is GPUs (`Insufficient nvidia.com/…` and nothing else
# insufficient): it may be counting another pod it has assumed on the node, whose bind the webhook's bind check
# is about to refuse, so the pod can still bind where it was pinned a moment later.
GPU_BUSY = "gpu-busy"
UNSCHEDULED = "unscheduled"  # no PodScheduled condition (or NotReadyForScheduling): no scheduler has tried it yet
SCHEDULING = "scheduling"  # any other PodScheduled state, or a node nominated (preemption under way)


def waiting(obj: Mapping[str, Any]) -> str:
    """Why a pod the caller knows is unbound and not terminated waits (GATED, UNSCHEDULABLE, GPU_BUSY, UNSCHEDULED or
    SCHEDULING). Never raises: odd fields read as absent."""
    spec = obj.get("spec")
    if isinstance(spec, dict) and spec.get("schedulingGates"):
        return GATED
    status = obj.get("status")
    status = status if isinstance(status, dict) else {}
    if status.get("nominatedNodeName"):
        return SCHEDULING  # the scheduler preempted for it: it binds once the victims are gone
    conditions = status.get("conditions")
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, dict) and c.get("type") == "PodScheduled":
            reason = c.get("reason")
            if c.get("status") == "False" and reason == "Unschedulable":
                return GPU_BUSY if _short_of_gpus_only(c.get("message")) else UNSCHEDULABLE
            return _CONDITION_REASONS.get(reason, SCHEDULING) if isinstance(reason, str) else SCHEDULING
    return UNSCHEDULED


_INSUFFICIENT = re.compile(r"Insufficient ([^\s,.;]+(?:\.[^\s,.;]+)*)")
MAX_MESSAGE = 4096  # characters of a condition message read (kube-scheduler's summary line is a few hundred)


def _short_of_gpus_only(message: Any) -> bool:
    """Whether kube-scheduler's Unschedulable message ("0/6 nodes are available: 2 Insufficient nvidia.com/gpu,
    4 node(s) didn't match Pod's node affinity/selector. preemption: …") names GPUs as the only insufficient
    resource (the part before the preemption summary)."""
    if not isinstance(message, str):
        return False
    head = message[:MAX_MESSAGE].split("preemption:", 1)[0]
    short = _INSUFFICIENT.findall(head)
    return bool(short) and all(name.startswith("nvidia.com/") for name in short)


# PodScheduled reasons that say no scheduler has tried the pod yet (the API server sets SchedulingGated; a
# scheduler's PreEnqueue rejection, KEP-5501, NotReadyForScheduling: e.g. a gang waiting for its members).
_CONDITION_REASONS = {"SchedulingGated": GATED, "NotReadyForScheduling": UNSCHEDULED}


# (pod object) -> (GPU units per resource, job id or None); raises ValueError/TypeError on garbage.
Reader = Callable[[Mapping[str, Any]], tuple[Mapping[str, int], str | None]]
# (GPU pod object) -> a small hashable value another reader of the pod watch needs (webhook/ledger.py); raises
# ValueError/TypeError on garbage (the entry then has no note: the view itself still counts the pod).
Noter = Callable[[Mapping[str, Any]], Hashable]
# (ResourceClaim object) -> (node its devices are on, "" when not allocated to one node; GPU units per
# resource); raises ValueError/TypeError on garbage.
ClaimReader = Callable[[Mapping[str, Any]], tuple[str, Mapping[str, int]]]


@dataclass(frozen=True)
class PodSnapshot:
    version: int
    synced: bool
    used: Mapping[str, Mapping[str, int]]  # node -> resource -> units held
    jobs: Mapping[str, Mapping[str, int]]  # job -> node -> pods of the job bound there (holding)
    pods: int  # GPU pods known (and pods with ResourceClaims)
    skipped: int  # pod objects `read` could not make sense of, since start
    claims: int = 0  # ResourceClaims holding GPUs on a node
    by_resource: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # resource -> node -> units held
    source: int = 0  # which view (a number unique in the process)
    # The nodes whose GPUs changed after a version of the view, None when that is no longer known.
    changed_since: Callable[[int], frozenset[str] | None] | None = field(default=None, compare=False)

    def used_of(self, resource: str) -> Mapping[str, int]:
        """node -> units of one resource held."""
        return self.by_resource.get(resource, _EMPTY)


_EMPTY: Mapping[str, int] = MappingProxyType({})
_SOURCES = itertools.count(1)
# Node changes remembered for incremental readers (Capacity.changed_since); older ones mean "rebuild".
CHANGE_LOG = 4096


def entry(obj: Any, read: Reader, note: Noter | None = None) -> PodEntry | None:
    """The entry of one pod object; None when it asks for no GPU. Raises ValueError on garbage (TypeError and
    AttributeError from `read` too)."""
    if not isinstance(obj, dict):
        raise ValueError("pod is not an object")
    spec = obj.get("spec")
    status = obj.get("status") or {}
    if not isinstance(spec, dict) or not isinstance(status, dict):
        raise ValueError("pod spec or status is not an object")
    units, job = read(obj)
    gpus = _shared(tuple(sorted((r, int(n)) for r, n in units.items() if n)))
    if not gpus and not spec.get("resourceClaims"):
        return None  # a pod with claims is kept: its GPUs are counted from the claims, its job from it
    node = spec.get("nodeName") or ""
    phase = status.get("phase") or ""
    if not isinstance(node, str) or not isinstance(phase, str):
        raise ValueError("pod nodeName or phase is not a string")
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return PodEntry(
        sys.intern(node),
        gpus,
        sys.intern(job) if isinstance(job, str) else job,
        sys.intern(phase),
        object_key(obj) if isinstance(meta, dict) else "",
        str(rv) if rv else None,
        _noted(obj, note) if note is not None else None,
    )


def _noted(obj: Any, note: Noter) -> Hashable:
    try:
        return note(obj)
    except (ValueError, TypeError, AttributeError):
        return None


_GPUS: dict[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]] = {}
MAX_SHARED_GPUS = 4096  # distinct GPU requests kept shared (a cluster has a few dozen: 1, 2, 4, 8 of a few kinds)


def _shared(gpus: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """One tuple object per distinct request, up to MAX_SHARED_GPUS."""
    return shared(_GPUS, gpus, gpus, MAX_SHARED_GPUS)


def claim_entry(obj: Any, read: ClaimReader) -> PodEntry | None:
    """What an allocated ResourceClaim holds, as an entry of no job (None: no GPU on a node). Raises
    ValueError on garbage (TypeError and AttributeError from `read` too)."""
    if not isinstance(obj, dict):
        raise ValueError("claim is not an object")
    node, units = read(obj)
    gpus = _shared(tuple(sorted((r, int(n)) for r, n in units.items() if n)))
    if not node or not gpus:
        return None
    return PodEntry(sys.intern(node), gpus, None, "", object_key(obj))


class PodView:
    """Counts kept from pod changes (`apply`, e.g. a Reflector's on_change) and ResourceClaim changes
    (`apply_claim`, with `read_claim`); `snapshot()` to read."""

    def __init__(
        self,
        read: Reader,
        on_bound: Callable[[str], None] | None = None,
        note: Noter | None = None,
        read_claim: ClaimReader | None = None,
        on_pending: Callable[[str, str], None] | None = None,
    ) -> None:
        self._read = read
        self._note = note  # read into the entry of each pod event, for the listeners of the view's changes (not cached)
        self._read_claim = read_claim
        self._claims = PodTable()
        # Told the job of every pod that starts holding its GPUs (bound), on the applying thread, unlocked.
        self._on_bound = on_bound
        # Told (job, `waiting`'s reason) for every event of an unbound, not terminated GPU pod of a job, from
        # `transform` (the object is at hand only there), on the applying thread, unlocked. Nothing is kept.
        self._on_pending = on_pending
        self._lock = threading.Lock()
        self._entries = PodTable()  # by column: no object per pod (cluster/podtable.py)
        # Values are replaced, never edited; a snapshot reads them through views costing O(recent changes).
        self._used: Layered[str, Mapping[str, int]] = Layered()
        self._by_resource: dict[str, Layered[str, int]] = {}
        self._jobs: Layered[str, NodeCounts] = Layered()
        self._log: deque[tuple[int, str]] = deque(maxlen=CHANGE_LOG)
        self.source = next(_SOURCES)
        self._version = 0
        self._synced = False
        self.skipped = 0
        self._snap: PodSnapshot | None = None

    # -- updates ------------------------------------------------------------------------------------------

    def transform(self, obj: Any) -> PodEntry | None:
        """The pod Reflector's transform: a GPU pod's entry is all its cache keeps; None for a pod without
        GPUs (never cached) and for garbage (counted; the Reflector then forgets the key, like a deletion).
        An unbound GPU pod of a job is told to `on_pending` with why it waits (`waiting`)."""
        try:
            e = entry(obj, self._read, self._note)
        except (ValueError, TypeError, AttributeError):
            with self._lock:
                self.skipped += 1
                self._version += 1
            return None
        tell = self._on_pending
        if tell is not None and e is not None and e.job is not None and not e.node and e.phase not in TERMINATED:
            tell(e.job, waiting(obj))
        return e

    def apply(self, change: Change) -> None:
        """One change of a pod object, or of its entry (a Reflector with `transform`)."""
        if change.type == "SYNCED":
            with self._lock:
                self._synced = True
                self._version += 1
            return
        new: PodEntry | None = None
        if isinstance(change.new, PodEntry):
            new = change.new
        elif change.new is not None:
            new = self.transform(change.new)  # garbage: forget what we knew of this key, like a deletion
        old = self._replace(self._entries, change.key, new)
        started = new is not None and new.job and new.holding and (old is None or not old.holding)
        if self._on_bound is not None and started and new is not None and new.job:
            self._on_bound(new.job)

    def apply_claim(self, change: Change) -> None:
        """One change of a ResourceClaim: the devices of its allocation are held on its node (garbage and
        claims without a GPU on a node hold nothing)."""
        if change.type == "SYNCED" or self._read_claim is None:
            return
        new: PodEntry | None = None
        if change.new is not None:
            try:
                new = claim_entry(change.new, self._read_claim)
            except (ValueError, TypeError, AttributeError):
                with self._lock:
                    self.skipped += 1
                    self._version += 1
        self._replace(self._claims, change.key, new)

    def _replace(self, table: PodTable, key: str, new: PodEntry | None) -> PodEntry | None:
        """Swap the entry of `key` in `table` (pods or claims) and its counts; the old entry."""
        with self._lock:
            old = table.put(key, new) if new is not None else table.pop(key)
            if old is not None:
                self._count(old, -1)
            if new is not None:
                self._count(new, +1)
            if old is not None or new is not None:
                self._version += 1
        return old

    def load(self, objects: Mapping[str, Any]) -> None:
        """A whole set of pods at once (a file): key -> pod object. Marks the view synced."""
        for key, obj in objects.items():
            self.apply(Change("ADDED", key, None, obj))
        self.apply(Change("SYNCED", "", None, None))

    def _count(self, e: PodEntry, sign: int) -> None:
        """Take a holding pod's GPUs in (+1) or out (-1); the caller bumps the version after."""
        if not e.holding:
            return
        per = dict(self._used.get(e.node) or {})
        for resource, n in e.gpus:
            _add(per, resource, sign * n)
            held = self._by_resource.setdefault(resource, Layered())
            _set(held, e.node, (held.get(e.node) or 0) + sign * n)
        _set(self._used, e.node, MappingProxyType(per) if per else None)
        self._log.append((self._version + 1, e.node))
        if e.job is not None:
            nodes = (self._jobs.get(e.job) or _NO_COUNTS).added(e.node, sign)
            _set(self._jobs, e.job, nodes if nodes else None)

    def changed_since(self, version: int) -> frozenset[str] | None:
        """Nodes whose GPUs changed after `version` (up to now), None when the log no longer reaches back."""
        nodes = set()
        with self._lock:
            if len(self._log) == CHANGE_LOG and self._log[0][0] > version:
                return None  # full: entries after `version` may have been dropped
            for v, node in reversed(self._log):  # newest first: only the entries after `version` are read
                if v <= version:
                    break
                nodes.add(node)
        return frozenset(nodes)

    # -- reads --------------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced

    def get(self, key: str) -> PodEntry | None:
        """The entry of pod `key` (namespace/name): None for a pod with no GPU, or not seen (yet). O(1)."""
        with self._lock:
            return self._entries.get(key)

    # -- as the pod Reflector's store (State.watch_pods): the view is the pod cache, no second copy ---------

    def __iter__(self) -> Iterator[str]:
        """The keys of the pods kept now (a copy: the view may change meanwhile)."""
        with self._lock:
            return iter(self._entries.keys())

    def entries(self) -> dict[str, PodEntry]:
        """key -> entry of every pod kept (rebuilt from the columns: for tests and tools, not per event)."""
        with self._lock:
            return self._entries.entries()

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot(self) -> PodSnapshot:
        snap = self._snap
        if snap is not None and snap.version == self._version:
            return snap
        with self._lock:
            snap = PodSnapshot(
                version=self._version,
                synced=self._synced,
                used=self._used.view(),
                jobs=self._jobs.view(),
                pods=len(self._entries),
                skipped=self.skipped,
                claims=len(self._claims),
                by_resource=MappingProxyType({r: u.view() for r, u in self._by_resource.items()}),
                source=self.source,
                changed_since=self.changed_since,
            )
        self._snap = snap
        return snap


class NodeCounts(Mapping[str, int]):
    """node -> pods of one job bound there, immutable: one flat tuple (node, count, node, count, ...), about
    half the bytes of a dict behind a read-only proxy (one per job: 62,500 of them at 500,000 pods). A change
    copies the tuple: O(nodes of the job), as copying a dict was."""

    __slots__ = ("_flat",)

    def __init__(self, flat: tuple[Any, ...] = ()) -> None:
        self._flat = flat

    def __getitem__(self, node: str) -> int:
        flat = self._flat
        for i in range(0, len(flat), 2):
            if flat[i] == node:
                return flat[i + 1]  # type: ignore[no-any-return]
        raise KeyError(node)

    def __iter__(self) -> Iterator[str]:
        return iter(self._flat[0::2])

    def __len__(self) -> int:
        return len(self._flat) // 2

    def values(self) -> tuple[int, ...]:  # type: ignore[override]  # O(n), not Mapping's lookup per key
        return self._flat[1::2]

    def items(self) -> Iterator[tuple[str, int]]:  # type: ignore[override]
        return zip(self._flat[0::2], self._flat[1::2], strict=True)

    def added(self, node: str, n: int) -> NodeCounts:
        """These counts with `n` more (or fewer) on `node`; a count that reaches 0 goes."""
        flat = self._flat
        for i in range(0, len(flat), 2):
            if flat[i] == node:
                left = flat[i + 1] + n
                return NodeCounts(flat[:i] + flat[i + 2 :] if not left else (*flat[: i + 1], left, *flat[i + 2 :]))
        return NodeCounts((*flat, node, n)) if n else self

    def __repr__(self) -> str:
        return f"NodeCounts({dict(self.items())!r})"


_NO_COUNTS = NodeCounts()


def _set(layer: Layered[str, Any], key: str, value: Any) -> None:
    """value, or no entry for a falsy one (0, None: nothing held)."""
    if value:
        layer.set(key, value)
    else:
        layer.pop(key)


def _add(counts: dict[str, int], key: str, n: int) -> None:
    left = counts.get(key, 0) + n
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)
