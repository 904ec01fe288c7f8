"""The pod view's records, stored by column: one slot per GPU pod, no object per pod.

500,000 GPU pods as one `PodEntry` object each, in two dicts (the Reflector's and the view's), took ~385
bytes a pod (docs/benchmarks.md §4). Here a pod is a slot: its key as the id of an interned head and a tail
of up to 8 characters packed into an int (`split_key`: the pods of one controller share the head, so no key
string per pod), found through an open-addressing index of slot numbers; its node, job, phase and GPU request
as ids of interned values (cluster/interned.py, counted so that values no pod uses any more are forgotten);
and its resourceVersion as an int (every API server writes decimal ones; any other text is kept aside for its
slot). A deleted pod's slot is reused by the next one.

An entry's `note` is not kept: it rides the change that carries the entry (the ledger reads the note of each
change as it happens, never a cached one), and a note per pod was ~78 of the 223 bytes a GPU pod cost with the
ledger on (docs/benchmarks.md §4). `get` rebuilds the pod's `PodEntry` (the same strings and request tuple that
went in, the key text rebuilt, no note), so readers see entries as before; `put`, `pop` and `get` cost O(1).
Not thread-safe: the pod view holds its lock around every call.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from cluster.interned import Interned

TERMINATED = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodEntry:
    node: str  # "" while unbound
    gpus: tuple[tuple[str, int], ...]  # (resource, units requested by the pod): GPU resources, non-zero only
    job: str | None  # job identity (namespace included), None for a pod of no job
    phase: str = ""
    key: str = ""  # namespace/name (the Reflector's key, the same string)
    version: str | None = None  # metadata.resourceVersion (the Reflector compares it on a relist)
    # What the view's `note` reader read besides (the ledger's fields), for the change this entry rides; None
    # without one, and always None once stored (PodTable keeps no note).
    note: Any = None

    @property
    def holding(self) -> bool:
        """Holds its GPUs on its node: bound and not terminated."""
        return bool(self.node) and self.phase not in TERMINATED


# PodEntry's slot setters: rebuilding an entry through them skips the frozen dataclass's __init__ (a third of
# the time; every pod change rebuilds the old entry, and the bind check reads one per bind).
_NODE, _GPUS, _JOB, _PHASE, _KEY, _VERSION, _NOTE = (
    PodEntry.__dict__[f].__set__ for f in ("node", "gpus", "job", "phase", "key", "version", "note")
)
_new = object.__new__


def _rebuilt(node: str, gpus: Any, job: str | None, phase: str, key: str, version: str | None) -> PodEntry:
    e: PodEntry = _new(PodEntry)
    _NODE(e, node)
    _GPUS(e, gpus)
    _JOB(e, job)
    _PHASE(e, phase)
    _KEY(e, key)
    _VERSION(e, version)
    _NOTE(e, None)
    return e


_EMPTY, _GONE = 0, -1  # index buckets: never used, and used once (a removed key: probing goes on past it)
_MIN_BUCKETS = 8
_NO_JOB = -1
_NO_VERSION, _ODD_VERSION = -1, -2
_MAX_INT_VERSION = 18  # digits: any 18-digit decimal fits an int64 column
_TAIL = 8  # characters of a key's tail packed into an int64 (ASCII: 7 bits each, the sign bit stays clear)
_WHOLE = -1  # the tail column's mark for a key kept whole as its "head"
_FREE = -1  # the head column's mark for a free slot


def split_key(key: str) -> tuple[str, int]:
    """A key as (head, packed tail): the tail is the longest end of it after a '-' of at most _TAIL ASCII
    characters, so the pods of one controller share their head ("ns/train-012345" + "worker-3", "ns/web-7d9f8b6c5"
    + "x2k4q"); a key with no such end is its own head (tail _WHOLE)."""
    cut = key.find("-", max(0, len(key) - _TAIL - 1))  # the first '-' of the last _TAIL + 1 characters
    tail = key[cut + 1 :]
    if cut < 0 or not tail.isascii() or "\0" in tail:
        return key, _WHOLE
    return key[:cut], int.from_bytes(tail.encode("ascii"), "big")  # no NUL byte: no leading zero to lose


def join_key(head: str, tail: int) -> str:
    if tail == _WHOLE:
        return head
    return head + "-" + tail.to_bytes((tail.bit_length() + 7) // 8, "big").decode("ascii")


class KeyIndex:
    """(head id, tail) -> slot: an open-addressing hash table (linear probing) of slot numbers in an int
    array, the pairs themselves read from the owner's columns. ~8 bytes a key at most 2/3 full, against a
    dict's ~42 plus the key string and an int object per slot."""

    __slots__ = ("_buckets", "_filled", "_heads", "_tails", "_used")

    def __init__(self, heads: array[int], tails: array[int]) -> None:
        self._heads, self._tails = heads, tails
        self._buckets = array("i", bytes(4 * _MIN_BUCKETS))  # slot + 1; _EMPTY or _GONE
        self._used = 0  # live keys
        self._filled = 0  # buckets not _EMPTY (live + _GONE)

    def find(self, head: int, tail: int) -> int:
        """The slot of the key, -1 when absent."""
        i = self._bucket(head, tail)
        return self._buckets[i] - 1 if i >= 0 else -1

    def _bucket(self, head: int, tail: int) -> int:
        buckets, heads, tails = self._buckets, self._heads, self._tails
        mask = len(buckets) - 1
        i = hash((head, tail)) & mask
        while True:
            s = buckets[i]
            if s == _EMPTY:
                return -1
            if s > 0 and heads[s - 1] == head and tails[s - 1] == tail:
                return i
            i = (i + 1) & mask

    def insert(self, slot: int) -> None:
        """Add the key of `slot` (its columns written, the key not present yet)."""
        if (self._filled + 1) * 3 > len(self._buckets) * 2:
            self._rebuild(self._used + 1)
        buckets = self._buckets
        mask = len(buckets) - 1
        i = hash((self._heads[slot], self._tails[slot])) & mask
        while buckets[i] > 0:
            i = (i + 1) & mask
        if buckets[i] == _EMPTY:
            self._filled += 1
        buckets[i] = slot + 1
        self._used += 1

    def remove(self, head: int, tail: int) -> int:
        """Take the key out; its slot, -1 when absent."""
        i = self._bucket(head, tail)
        if i < 0:
            return -1
        slot = self._buckets[i] - 1
        self._buckets[i] = _GONE
        self._used -= 1
        if self._used * 8 < len(self._buckets) and len(self._buckets) > _MIN_BUCKETS:
            self._rebuild(self._used)  # shrink: a cluster drained of pods gives its index back
        return slot

    def _rebuild(self, live: int) -> None:
        """Buckets for `live` keys at most half full, without the _GONE marks."""
        size = _MIN_BUCKETS
        while size < live * 2:
            size *= 2
        old = self._buckets
        self._buckets = buckets = array("i", bytes(4 * size))
        mask = size - 1
        heads, tails = self._heads, self._tails
        for s in old:
            if s > 0:
                i = hash((heads[s - 1], tails[s - 1])) & mask
                while buckets[i]:
                    i = (i + 1) & mask
                buckets[i] = s
        self._filled = self._used

    def __len__(self) -> int:
        return self._used


class PodTable:
    """key -> PodEntry, stored by column (see the module docstring)."""

    __slots__ = (
        "_free",
        "_gpus",
        "_head",
        "_index",
        "_job",
        "_node",
        "_odd",
        "_own",
        "_phase",
        "_tail",
        "_version",
        "heads",
        "jobs",
        "nodes",
        "phases",
        "requests",
    )

    def __init__(self) -> None:
        self._head = array("i")  # id in `heads`, _FREE for a free slot
        self._tail = array("q")  # split_key's packed tail
        self._index = KeyIndex(self._head, self._tail)
        self._free: list[int] = []
        self._node = array("i")
        self._job = array("i")  # _NO_JOB for a pod of no job
        self._gpus = array("i")
        self._phase = array("i")
        self._version = array("q")  # the int, _NO_VERSION, or _ODD_VERSION (its text in _odd)
        self._odd: dict[int, str] = {}  # slot -> a resourceVersion that is not a plain decimal
        self._own: dict[int, str] = {}  # slot -> the entry's own key, when not the table's key
        self.heads: Interned[str] = Interned()
        self.nodes: Interned[str] = Interned()
        self.jobs: Interned[str] = Interned()
        self.requests: Interned[tuple[tuple[str, int], ...]] = Interned()
        self.phases: Interned[str] = Interned()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: str) -> bool:
        return self._find(key) >= 0

    def get(self, key: str) -> PodEntry | None:
        slot = self._find(key)
        return self._entry(slot, key) if slot >= 0 else None

    def put(self, key: str, e: PodEntry) -> PodEntry | None:
        """Store `e` under `key`; what was there."""
        head, tail = split_key(key)
        hid = self.heads.find(head)
        slot = self._index.find(hid, tail) if hid >= 0 else -1
        old = None
        if slot < 0:
            slot = self._new_slot(head, tail)
        else:
            old = self._entry(slot, key)
            self._release(slot)
        self._node[slot] = self.nodes.acquire(e.node)
        self._job[slot] = self.jobs.acquire(e.job) if e.job is not None else _NO_JOB
        self._gpus[slot] = self.requests.acquire(e.gpus)
        self._phase[slot] = self.phases.acquire(e.phase)
        self._version[slot] = self._encode(slot, e.version)
        if e.key != key:
            self._own[slot] = e.key
        return old

    def pop(self, key: str) -> PodEntry | None:
        """Forget `key`; what was there."""
        head, tail = split_key(key)
        hid = self.heads.find(head)
        slot = self._index.remove(hid, tail) if hid >= 0 else -1
        if slot < 0:
            return None
        old = self._entry(slot, key)
        self._release(slot)
        self.heads.release(hid)
        self._head[slot] = _FREE
        self._free.append(slot)
        return old

    def keys(self) -> list[str]:
        return [self._key(slot) for slot in self._slots()]

    def entries(self) -> dict[str, PodEntry]:
        out = {}
        for slot in self._slots():
            key = self._key(slot)
            out[key] = self._entry(slot, key)
        return out

    def _slots(self) -> list[int]:
        return [slot for slot, h in enumerate(self._head) if h != _FREE]

    def _find(self, key: str) -> int:
        head, tail = split_key(key)
        hid = self.heads.find(head)
        return self._index.find(hid, tail) if hid >= 0 else -1  # no pod has this head: absent

    def _key(self, slot: int) -> str:
        return join_key(self.heads.value(self._head[slot]), self._tail[slot])

    def _new_slot(self, head: str, tail: int) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self._head)
            for column in (self._head, self._tail, self._node, self._job, self._gpus, self._phase, self._version):
                column.append(0)
        self._head[slot] = self.heads.acquire(head)
        self._tail[slot] = tail
        self._index.insert(slot)
        return slot

    def _release(self, slot: int) -> None:
        """Give back the references the slot's record holds (not its key's)."""
        self.nodes.release(self._node[slot])
        if self._job[slot] != _NO_JOB:
            self.jobs.release(self._job[slot])
        self.requests.release(self._gpus[slot])
        self.phases.release(self._phase[slot])
        self._odd.pop(slot, None)
        self._own.pop(slot, None)

    def _encode(self, slot: int, rv: str | None) -> int:
        if rv is None:
            return _NO_VERSION
        if rv.isascii() and rv.isdigit() and len(rv) <= _MAX_INT_VERSION and (rv[0] != "0" or rv == "0"):
            return int(rv)  # str(int(rv)) == rv: the text comes back as it was
        self._odd[slot] = rv
        return _ODD_VERSION

    def _entry(self, slot: int, key: str) -> PodEntry:
        """The slot's entry; `key` the table's key of it."""
        v = self._version[slot]
        job = self._job[slot]
        own = self._own.get(slot)
        return _rebuilt(
            self.nodes.value(self._node[slot]),
            self.requests.value(self._gpus[slot]),
            self.jobs.value(job) if job != _NO_JOB else None,
            self.phases.value(self._phase[slot]),
            own if own is not None else key,
            str(v) if v >= 0 else self._odd[slot] if v == _ODD_VERSION else None,
        )
