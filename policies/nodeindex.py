"""Node sets as bitmasks, so what a review asks of the inventory costs the same at 16 nodes as at 50,000.

Every node gets a slot (a small int, reused after a delete). A set of nodes is a Python int with bit `slot`
set per member: AND / OR / NOT of 50,000 nodes are a few microseconds of word operations, never a loop over
nodes. Sets of fewer than SMALL nodes (one hostname, one rack) are kept as tuples of slots instead: a bitmask
of one high slot would weigh ~slot/8 bytes, and 50,000 of them would not fit the memory budget.

`NodeIndex` is immutable. `apply(changes)` returns a new one that shares every untouched part with the old
(copy-on-write per touched label key, per touched aggregate), so one node event costs what that node touches,
not what the cluster holds. Readers keep using the snapshot they took.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.selectors import parse_int64

Posting = int | tuple[int, ...]  # bitmask, or sorted slots when small
SMALL = 64  # postings under this many nodes are tuples (a hostname, a rack)
NAME_KEY = "\x00name"  # node names live in the label index under a key no label can have


class IndexedNode(Protocol):
    """What the index reads of a node (policies.inventory.GpuNode)."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


def bits(slots: Iterable[int]) -> int:
    """The bitmask of these slots, built in one bytearray (OR-ing 1 << slot per slot copies the big int)."""
    slots = list(slots)
    if len(slots) <= 1:  # one node event: a shift, not a buffer of the whole slot range
        return 1 << slots[0] if slots else 0
    buf = bytearray(max(slots) // 8 + 1)
    for s in slots:
        buf[s >> 3] |= 1 << (s & 7)
    return int.from_bytes(buf, "little")


def slots_of(mask: int) -> list[int]:
    """The slots set in a bitmask, in order; skips zero bytes, so sparse masks are cheap."""
    out: list[int] = []
    if mask <= 0:
        return out
    for i, byte in enumerate(mask.to_bytes((mask.bit_length() + 7) // 8, "little")):
        if byte:
            base = i << 3
            out.extend(base + b for b in range(8) if byte >> b & 1)
    return out


def as_mask(p: Posting | None) -> int:
    if p is None:
        return 0
    return p if isinstance(p, int) else bits(p)


def count(p: Posting | None) -> int:
    if p is None:
        return 0
    return p.bit_count() if isinstance(p, int) else len(p)


def _update(p: Posting | None, add: Collection[int], remove: Collection[int]) -> Posting | None:
    """Posting p with slots added and removed; None when empty. Switches form around SMALL (with slack, so a
    set hovering at the boundary does not convert back and forth)."""
    if p is None and not remove:  # a new value: the common case of a first list
        return tuple(sorted(add)) if len(add) < SMALL else bits(add)
    if isinstance(p, int):
        mask = p | bits(add) if add else p
        if not remove:  # grown (an int posting holds at least SMALL // 2 nodes): stays a bitmask
            return mask
        mask &= ~bits(remove)
        n = mask.bit_count()
        if n >= SMALL // 2:
            return mask
        return tuple(slots_of(mask)) or None
    members = set(p or ())
    members.update(add)
    members.difference_update(remove)
    if len(members) >= SMALL:
        return bits(members)
    return tuple(sorted(members)) or None


SHARDS = 64
CHUNK = 256  # node slots per chunk of the slot table
MASK_MEMO = 256  # named-set bitmasks memoized per index version (NodeIndex.set)


@dataclass(frozen=True, eq=False)
class Shards(Mapping[Any, Any]):
    """An immutable mapping split by key hash into SHARDS dicts: `updated` copies only the shards it
    touches, so one change to a map of 50,000 names costs ~1/64 of a copy (label values, names -> slots)."""

    shards: tuple[dict[Any, Any], ...] = tuple({} for _ in range(SHARDS))
    # Counted at construction (or carried by `updated`): `len()` and truth are asked per review (is the
    # inventory empty?), and summing 64 shards there cost ~10 µs of the 100 µs budget; in `updated` it was a
    # third of a node event's index update.
    size: int = field(default=-1, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.size < 0:
            object.__setattr__(self, "size", sum(len(shard) for shard in self.shards))

    def __getitem__(self, key: Any) -> Any:
        return self.shards[hash(key) % SHARDS][key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self.shards[hash(key) % SHARDS].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.shards[hash(key) % SHARDS]

    def __iter__(self) -> Iterator[Any]:
        for shard in self.shards:
            yield from shard

    def __len__(self) -> int:
        return self.size

    def updated(self, changes: Mapping[Any, Any]) -> Shards:
        """A copy with `changes` applied: key -> value, or key -> None to remove it."""
        if not changes:
            return self
        shards = list(self.shards)
        copied: set[int] = set()
        size = self.size
        for key, value in changes.items():
            i = hash(key) % SHARDS
            if i not in copied:
                shards[i] = dict(shards[i])
                copied.add(i)
            shard = shards[i]
            size -= key in shard
            if value is None:
                shard.pop(key, None)
            else:
                shard[key] = value
                size += 1
        return Shards(tuple(shards), size)


EMPTY = Shards()


@dataclass(frozen=True, eq=False)
class NodeIndex:
    """Slots, label postings and named node sets (kinds, offers, products: see policies.inventory)."""

    chunks: tuple[tuple[Any, ...], ...] = ()  # the node in each slot (None: free), CHUNK slots per chunk
    size: int = 0  # slots ever used (free ones included)
    slots: Shards = field(default_factory=Shards)  # entry key -> slot
    free: tuple[int, ...] = ()
    labels: Mapping[str, Shards] = field(default_factory=dict)  # key -> value -> nodes
    has: Mapping[str, Posting] = field(default_factory=dict)  # key -> nodes carrying it
    sets: Mapping[Any, Posting] = field(default_factory=dict)  # named sets
    every: int = 0
    # Small postings are tuples; a review asks for the same few named sets several times (offers, whole
    # card, shared), so their bitmask is built once per index version. Bounded: a hostile label set cannot
    # grow it past MASK_MEMO entries.
    _masks: dict[Any, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.slots)

    def node(self, slot: int) -> Any:
        return self.chunks[slot // CHUNK][slot % CHUNK]

    def all_nodes(self) -> Iterator[tuple[int, Any]]:
        """(slot, node) of every node, in slot order."""
        for c, chunk in enumerate(self.chunks):
            for i, n in enumerate(chunk):
                if n is not None:
                    yield c * CHUNK + i, n

    def node_list(self, mask: int) -> list[Any]:
        chunks = self.chunks
        return [chunks[s // CHUNK][s % CHUNK] for s in slots_of(mask)]

    def label(self, key: str, value: str) -> int:
        values = self.labels.get(key)
        return as_mask(values.get(value)) if values is not None else 0

    def set(self, name: Any) -> int:
        p = self.sets.get(name)
        if p is None or isinstance(p, int):
            return p or 0
        mask = self._masks.get(name)
        if mask is None:
            mask = bits(p)
            if len(self._masks) < MASK_MEMO:
                self._masks[name] = mask
        return mask

    def key_count(self, key: str) -> int:
        return count(self.has.get(key))

    def values(self, key: str) -> Iterator[tuple[str, Posting]]:
        values = self.labels.get(key)
        return iter(values.items() if values is not None else ())

    def apply(self, changes: Mapping[str, Any | None], sets_of: SetsOf) -> NodeIndex:
        """A new index with `changes` applied (entry key -> node, or None to remove it). `sets_of(node)` names
        the sets a node belongs to; it must give the same answer for the same node every time (a removed
        node leaves the sets it was added to)."""
        return _Batch(self, sets_of).run(changes)


SetsOf = Callable[[Any], Iterable[Any]]
Edits = dict[Any, tuple[set[int], set[int]]]
Loaded = dict[Any, tuple[Collection[int], Collection[int]]]


class _Batch:
    """One batch of changes, collected as slot additions / removals per posting; each touched posting is
    then written once. Copies only what the batch touches: slot-table chunks, shards of label value maps,
    small tables of named sets; everything else is shared with the old index."""

    def __init__(self, base: NodeIndex, sets_of: SetsOf) -> None:
        self.base = base
        self.sets_of = sets_of
        self.chunks = list(base.chunks)
        self.touched: dict[int, list[Any]] = {}
        self.size = base.size
        self.slot_changes: dict[str, int | None] = {}
        self.free = list(base.free)
        self.label_edits: Edits = {}
        self.has_edits: Edits = {}
        self.set_edits: Edits = {}
        self.every_edits: Edits = {}

    def _get(self, slot: int) -> Any:
        c, i = divmod(slot, CHUNK)
        chunk = self.touched.get(c)
        return chunk[i] if chunk is not None else self.chunks[c][i]

    def _put(self, slot: int, node: Any) -> None:
        c, i = divmod(slot, CHUNK)
        chunk = self.touched.get(c)
        if chunk is None:
            if c == len(self.chunks):
                self.chunks.append((None,) * CHUNK)
            chunk = self.touched[c] = list(self.chunks[c])
        chunk[i] = node

    def _slot(self, key: str) -> int | None:
        if key in self.slot_changes:
            return self.slot_changes[key]
        slot: int | None = self.base.slots.get(key)
        return slot

    def _index(self, slot: int, node: Any, add: bool) -> None:
        for k, v in node.labels.items():
            _edit(self.label_edits, (k, v), slot, add)
            _edit(self.has_edits, k, slot, add)
        _edit(self.label_edits, (NAME_KEY, node.name), slot, add)
        for name in self.sets_of(node):
            _edit(self.set_edits, name, slot, add)

    def _reindex(self, slot: int, old: Any, new: Any) -> None:
        """A node replaced in its slot: its labels and sets diffed (a status update changes none of them, a
        relabel one or two), not all of them removed and added again."""
        if old.labels is not new.labels:
            before, after = old.labels.items(), new.labels.items()
            for k, v in before - after:
                _edit(self.label_edits, (k, v), slot, add=False)
                if k not in new.labels:
                    _edit(self.has_edits, k, slot, add=False)
            for k, v in after - before:
                _edit(self.label_edits, (k, v), slot, add=True)
                if k not in old.labels:
                    _edit(self.has_edits, k, slot, add=True)
        if old.name != new.name:
            _edit(self.label_edits, (NAME_KEY, old.name), slot, add=False)
            _edit(self.label_edits, (NAME_KEY, new.name), slot, add=True)
        gone, came = list(self.sets_of(old)), list(self.sets_of(new))
        if gone != came:
            for name in gone:
                _edit(self.set_edits, name, slot, add=False)
            for name in came:
                _edit(self.set_edits, name, slot, add=True)

    def run(self, changes: Mapping[str, Any | None]) -> NodeIndex:
        if not self.base.size:
            return self._load(changes)
        for key, node in changes.items():
            slot = self._slot(key)
            if slot is not None and node is not None:  # replaced: only what differs is re-indexed
                self._reindex(slot, self._get(slot), node)
                self._put(slot, node)
                continue
            if slot is not None:
                self._index(slot, self._get(slot), add=False)
                if node is None:
                    self.slot_changes[key] = None
                    self._put(slot, None)
                    self.free.append(slot)
                    _edit(self.every_edits, 0, slot, add=False)
                    continue
            elif node is None:
                continue
            else:
                if self.free:
                    slot = self.free.pop()
                else:
                    slot, self.size = self.size, self.size + 1
                self.slot_changes[key] = slot
                _edit(self.every_edits, 0, slot, add=True)
            self._put(slot, node)
            self._index(slot, node, add=True)
        return self._freeze()

    def _load(self, changes: Mapping[str, Any | None]) -> NodeIndex:
        """Into an empty index (the first list, a rebuild): only additions, so no edit can cancel another
        and slots are appended to plain lists (half the work of _index)."""
        labels: dict[tuple[str, str], list[int]] = {}
        has: dict[str, list[int]] = {}
        sets: dict[Any, list[int]] = {}
        nodes = [n for n in changes.values() if n is not None]
        for slot, node in enumerate(nodes):
            for kv in node.labels.items():
                got = labels.get(kv)
                if got is None:
                    labels[kv] = [slot]
                else:
                    got.append(slot)
                got = has.get(kv[0])
                if got is None:
                    has[kv[0]] = [slot]
                else:
                    got.append(slot)
            labels.setdefault((NAME_KEY, node.name), []).append(slot)
            for name in self.sets_of(node):
                sets.setdefault(name, []).append(slot)
        none: tuple[int, ...] = ()
        self.label_edits = {kv: (slots, none) for kv, slots in labels.items()}  # type: ignore[misc]
        self.has_edits = {k: (slots, none) for k, slots in has.items()}  # type: ignore[misc]
        self.set_edits = {k: (slots, none) for k, slots in sets.items()}  # type: ignore[misc]
        self.every_edits = {0: (range(len(nodes)), none)}  # type: ignore[dict-item]
        keys = [k for k, n in changes.items() if n is not None]
        self.slot_changes = dict(zip(keys, range(len(keys)), strict=True))
        self.size = len(nodes)
        for slot, node in enumerate(nodes):
            self._put(slot, node)
        return self._freeze()

    def _freeze(self) -> NodeIndex:
        base = self.base
        by_key: dict[str, Edits] = {}
        for (k, v), edit in self.label_edits.items():
            if edit[0] or edit[1]:
                by_key.setdefault(k, {})[v] = edit
        labels = dict(base.labels) if by_key else base.labels
        for k, edits in by_key.items():
            old = labels.get(k, EMPTY)
            values = old.updated({v: _update(old.get(v), a, r) or None for v, (a, r) in edits.items()})
            if len(values):
                labels[k] = values  # type: ignore[index]
            else:
                labels.pop(k, None)  # type: ignore[attr-defined]
        for c, chunk in self.touched.items():
            self.chunks[c] = tuple(chunk)
        adds, removes = self.every_edits.get(0, (set(), set()))
        return NodeIndex(
            chunks=tuple(self.chunks),
            size=self.size,
            slots=base.slots.updated(self.slot_changes),
            free=tuple(self.free),
            labels=labels,
            has=_apply_edits(base.has, self.has_edits),
            sets=_apply_edits(base.sets, self.set_edits),
            every=(base.every | bits(adds)) & ~bits(removes),
        )


def _edit(table: Edits, key: Any, slot: int, add: bool) -> None:
    """Record a slot entering (add) or leaving a posting. Edits of one slot alternate, so a remove after an
    add (or the reverse) cancels out: a node updated without label changes touches no posting."""
    pair = table.get(key)
    if pair is None:
        pair = table[key] = (set(), set())
    mine, other = (pair[0], pair[1]) if add else (pair[1], pair[0])
    if slot in other:
        other.discard(slot)
    else:
        mine.add(slot)


def _apply_edits(table: Mapping[Any, Posting], edits: Edits | Loaded) -> Mapping[Any, Posting]:
    """A copy of table with the edits applied (table itself when no edit changes anything)."""
    if not any(a or r for a, r in edits.values()):
        return table
    out = dict(table)
    for key, (adds, removes) in edits.items():
        p = _update(out.get(key), adds, removes)
        if p is None:
            out.pop(key, None)
        else:
            out[key] = p
    return out


# --- queries: a pod's node selection as a node set (the same answers as policies.selectors, over postings) ---


def selection_mask(index: NodeIndex, selection: tuple[str, tuple[tuple[Any, Any], ...], list[Any] | None]) -> int:
    """The nodes a NodeSelection (nodeName, nodeSelector items, required terms) allows; mirrors
    selectors.selection_filter node by node (tests/test_nodeindex.py checks them against each other)."""
    pinned, selector, terms = selection
    mask = index.every
    if pinned:
        mask &= index.label(NAME_KEY, pinned) | index.label(NAME_KEY, "")  # a nameless node is not excluded
    for k, v in selector:
        if not mask:
            return 0
        if v is None:  # labels.get(k) != None: only nodes without the key pass
            mask &= index.every & ~as_mask(index.has.get(k)) if isinstance(k, str) else index.every
        elif isinstance(k, str) and isinstance(v, str):
            mask &= index.label(k, v)
        else:
            return 0  # label values are strings: nothing else is ever equal
    if terms is not None and mask:
        any_term = 0
        for term in terms:
            any_term |= _term_mask(index, term)
        mask &= any_term
    return mask


def _term_mask(index: NodeIndex, term: Any) -> int:
    if not isinstance(term, dict):
        return 0
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(exprs, list) or not isinstance(fields, list) or not (exprs or fields):
        return 0  # an empty term matches nothing (Kubernetes semantics)
    mask = index.every
    for e in exprs:
        if not mask or not isinstance(e, dict):
            return 0
        mask &= _expr_mask(index, e, e.get("key"))
    for f in fields:
        if not mask or not isinstance(f, dict):
            return 0
        # matchFields name nodes by metadata.name, read (as selectors.term_matches does) from the hostname
        # label, "" where a node has none.
        mask &= (
            _expr_mask(index, f, "kubernetes.io/hostname", absent="")
            if f.get("key") == "metadata.name"
            else (_expr_mask(index, f, None))
        )
    return mask


def expression_mask(index: NodeIndex, expr: Mapping[str, Any]) -> int:
    """The nodes one matchExpression (of a nodeSelectorTerm) admits: selectors.expression_matches per node."""
    return _expr_mask(index, expr, expr.get("key"))


def _expr_mask(index: NodeIndex, expr: Mapping[str, Any], key: Any, absent: str | None = None) -> int:
    """One matchExpression. `key` None: a key no node has. `absent`: the value a node without the key is
    read as (matchFields' metadata.name is always present); None: such a node lacks it."""
    op = expr.get("operator")
    values = expr.get("values") or []
    if not isinstance(expr.get("key"), str) or not isinstance(values, list):
        return 0
    every = index.every
    have = as_mask(index.has.get(key)) if isinstance(key, str) else 0
    lacking = every & ~have
    present = every if absent is not None else have
    if op in ("In", "NotIn"):
        hit = 0
        for v in values:
            if isinstance(v, str) and isinstance(key, str):
                hit |= index.label(key, v)
        if absent is not None and absent in values:
            hit |= lacking
        return hit if op == "In" else every & ~hit
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return every & ~present
    if op in ("Gt", "Lt") and len(values) == 1 and isinstance(values[0], str) and isinstance(key, str):
        want = parse_int64(values[0])
        if want is None:
            return 0
        hit = 0
        for v, p in index.values(key):
            have_int = parse_int64(v)
            if have_int is not None and (have_int > want if op == "Gt" else have_int < want):
                hit |= as_mask(p)
        return hit
    return 0
