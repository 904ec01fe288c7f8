"""What the topology levels are read from, counted per label value so a node coming or going is O(its keys).

`topology.build_levels` needs, over the nodes it places jobs on, for each candidate level key: how many
nodes carry it (any value, and a non-empty one), how many domains it has and the whole-card GPUs of the
largest, and whether a finer key's domains nest in a coarser one's. Counting those over 50,000 nodes on every
node add or remove cost 100-900 ms; here they are kept per value and updated by the node's *shape* (its
whole-card GPUs and its values of the candidate keys), grouped so a first list of 50,000 nodes in ~3,000
racks updates each distinct shape once.

Nodes fall in two populations: whole-card ones (where multi-node training runs), and the rest (counted with 0
GPUs); levels read the first, or the second when a cluster has no whole-card node (topology.py).

Immutable: `apply` copies only the tables the changed shapes touch (one per key they carry, one per pair of
keys they carry), so readers of an older version keep a consistent one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.nodeindex import EMPTY, Shards

# (whole-card?, whole-card GPUs (0 otherwise), value of each candidate key in order: None = label absent)
Shape = tuple[bool, int, tuple[str | None, ...]]


@dataclass(frozen=True)
class KeyCounts:
    """One candidate key over one population."""

    present: int = 0  # nodes with the key, whatever its value
    have: int = 0  # nodes with a non-empty value
    # value -> (nodes, whole-card GPUs); sharded: a rack key has thousands of values, an event touches one
    domains: Shards = field(default_factory=lambda: EMPTY)
    sizes: Mapping[int, int] = field(default_factory=dict)  # GPUs of a domain -> domains that size

    @property
    def largest(self) -> int:
        return max(self.sizes, default=0)


@dataclass(frozen=True)
class PairCounts:
    """A finer key and a coarser one over one population: the coarse values seen with each fine value."""

    coarse: Shards = field(default_factory=lambda: EMPTY)  # fine value -> {coarse value: nodes}
    conflicts: int = 0  # fine values seen with more than one coarse value: the levels do not nest


_NO_KEY = KeyCounts()
_NO_PAIR = PairCounts()


@dataclass(frozen=True)
class LevelCounts:
    """The counts for candidate `keys` (their order: a finer key before a coarser one it may nest in)."""

    keys: tuple[str, ...]
    nodes: Mapping[bool, int] = field(default_factory=dict)  # population -> nodes
    per_key: Mapping[tuple[bool, str], KeyCounts] = field(default_factory=dict)
    pairs: Mapping[tuple[bool, str, str], PairCounts] = field(default_factory=dict)

    def shape(self, labels: Mapping[str, str], whole_card: bool, whole_gpus: int) -> Shape:
        return whole_card, whole_gpus if whole_card else 0, tuple(map(labels.get, self.keys))

    def view(self) -> LevelView:
        """The population levels are read from: whole-card nodes, or every node when there is none."""
        return LevelView(self, bool(self.nodes.get(True)))

    def apply(self, removed: Iterable[Shape], added: Iterable[Shape]) -> LevelCounts:
        delta: Counter[Shape] = Counter(added)
        delta.subtract(removed)
        if not any(delta.values()):
            return self
        edit = _Edit(self)
        for shape, by in delta.items():
            if by:
                edit.count(shape, by)
        return edit.done()


@dataclass(frozen=True)
class LevelView:
    """One population of LevelCounts, as topology.build_levels reads it."""

    counts: LevelCounts
    whole: bool

    @property
    def total(self) -> int:
        return self.counts.nodes.get(self.whole, 0)

    def present(self) -> frozenset[str]:
        return frozenset(k for k in self.counts.keys if self.key(k).present)

    def key(self, key: str) -> KeyCounts:
        return self.counts.per_key.get((self.whole, key), _NO_KEY)

    def nests(self, fine: str, coarse: str) -> bool:
        """Every fine domain lies inside one coarse domain. Pairs are counted in key order only; a pair out
        of that order (never asked by topology.build_levels, see topology.candidate_keys) says no: a level
        dropped with a warning, never a wrong hard constraint."""
        if fine == coarse:
            return True
        keys = self.counts.keys
        if fine not in keys or coarse not in keys or keys.index(fine) > keys.index(coarse):
            return False
        return not self.counts.pairs.get((self.whole, fine, coarse), _NO_PAIR).conflicts


class _Pending:
    """Edits over a sharded table, written once at the end: only the shards they touch are copied."""

    def __init__(self, base: Shards) -> None:
        self.base = base
        self.edits: dict[str, Any] = {}

    def get(self, key: str, default: Any) -> Any:
        if key in self.edits:
            value = self.edits[key]
            return default if value is None else value
        return self.base.get(key, default)

    def put(self, key: str, value: Any) -> None:
        self.edits[key] = value  # None: removed

    def done(self) -> Shards:
        return self.base.updated(self.edits)


class _Edit:
    """Mutable copies of the tables one `apply` touches, each copied the first time."""

    def __init__(self, base: LevelCounts) -> None:
        self.base = base
        self.nodes = dict(base.nodes)
        self.keys: dict[tuple[bool, str], tuple[list[int], _Pending, dict[int, int]]] = {}
        self.pairs: dict[tuple[bool, str, str], tuple[list[int], _Pending]] = {}

    def count(self, shape: Shape, by: int) -> None:
        whole, gpus, values = shape
        self.nodes[whole] = self.nodes.get(whole, 0) + by
        keys = self.base.keys
        carried = [(keys[i], v) for i, v in enumerate(values) if v is not None]
        for key, value in carried:
            self._key(whole, key, value, gpus, by)
        labelled = [(k, v) for k, v in carried if v]
        for i, (fine, fv) in enumerate(labelled):
            for coarse, cv in labelled[i + 1 :]:
                self._pair(whole, fine, fv, coarse, cv, by)

    def _key(self, whole: bool, key: str, value: str, gpus: int, by: int) -> None:
        table = self.keys.get((whole, key))
        if table is None:
            old = self.base.per_key.get((whole, key), _NO_KEY)
            table = self.keys[whole, key] = ([old.present, old.have], _Pending(old.domains), dict(old.sizes))
        tallies, domains, sizes = table
        tallies[0] += by
        if not value:
            return
        tallies[1] += by
        nodes, total = domains.get(value, (0, 0))
        if nodes:
            _bump(sizes, total, -1)
        nodes, total = nodes + by, total + by * gpus
        if nodes:
            domains.put(value, (nodes, total))
            _bump(sizes, total, 1)
        else:
            domains.put(value, None)

    def _pair(self, whole: bool, fine: str, fv: str, coarse: str, cv: str, by: int) -> None:
        table = self.pairs.get((whole, fine, coarse))
        if table is None:
            old = self.base.pairs.get((whole, fine, coarse), _NO_PAIR)
            table = self.pairs[whole, fine, coarse] = ([old.conflicts], _Pending(old.coarse))
        conflicts, per_fine = table
        seen = dict(per_fine.get(fv, {}))  # the inner table is shared with older versions: copied
        before = len(seen)
        _bump(seen, cv, by)
        per_fine.put(fv, seen or None)
        conflicts[0] += (len(seen) > 1) - (before > 1)

    def done(self) -> LevelCounts:
        per_key = dict(self.base.per_key)
        for name, (tallies, domains, sizes) in self.keys.items():
            if tallies[0]:
                per_key[name] = KeyCounts(tallies[0], tallies[1], domains.done(), sizes)
            else:
                per_key.pop(name, None)
        pairs = dict(self.base.pairs)
        for pair, (conflicts, per_fine) in self.pairs.items():
            table = per_fine.done()
            if table:
                pairs[pair] = PairCounts(table, conflicts[0])
            else:
                pairs.pop(pair, None)
        nodes = {w: n for w, n in self.nodes.items() if n}
        return LevelCounts(self.base.keys, nodes, per_key, pairs)


def _bump(table: dict[Any, int], key: Any, by: int) -> None:
    value = table.get(key, 0) + by
    if value:
        table[key] = value
    else:
        table.pop(key, None)
