"""Node labels shared between nodes: one dict per distinct label set but the hostname, plus each node's hostname.

The nodes of a rack (of a node pool, of an NVLink domain) carry the same 15-200 labels but
`kubernetes.io/hostname`: at 50,000 nodes a plain dict per node is ~22 MB (464 bytes for 16 labels) where one
dict per rack and a 48-byte `NodeLabels` per node do. `NodeLabels` is a read-only Mapping that answers exactly
what the node's plain dict would: the same items in the same order, `==` either way, `in`, `get`, `len`,
views with set operations (tests/test_labelsets.py checks that against a dict).

`LabelSets` (owned by a NodeTransform: one per watch, never a module global) finds the shared dict of a label
set. It holds its sets weakly: a set that no live node uses any more (the node deleted or relabelled, and
every inventory snapshot holding it replaced) is freed with its last NodeLabels and drops out of the cache.
It holds at most `limit` live sets; past that a node whose set is not cached keeps its plain dict (counted in
`unshared`): a cluster that gives every node a label of its own (an instance id) would otherwise pay a cache
entry per node (~0.5 KB) for nothing. At the default bound that waste is at most ~4 MB.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from itertools import chain, islice
from typing import Any

HOSTNAME = "kubernetes.io/hostname"  # policies.topology.HOSTNAME (cluster/ cannot import it)
MAX_LABEL_SETS = 8192  # live shared sets: 50,000 nodes in 16-node racks have ~3,200


class LabelSet(dict[str, str]):
    """The labels shared by some nodes, without the hostname, which comes at position `host_at`. Read-only
    like every cached object; weakly referenced by the cache."""

    __slots__ = ("__weakref__", "host_at")
    host_at: int


class NodeLabels(Mapping[str, str]):
    """A node's labels: a shared LabelSet and the node's hostname, read like the dict they replace."""

    __slots__ = ("_base", "_host")

    def __init__(self, base: LabelSet, host: str) -> None:
        self._base, self._host = base, host

    @property
    def base(self) -> LabelSet:
        """The shared set: every node whose labels differ from these only by hostname has this very one."""
        return self._base

    def __getitem__(self, key: str) -> str:
        return self._host if key == HOSTNAME else self._base[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._host if key == HOSTNAME else self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key == HOSTNAME or key in self._base

    def __len__(self) -> int:
        return len(self._base) + 1

    def __iter__(self) -> Iterator[str]:
        it = iter(self._base)
        return chain(islice(it, self._base.host_at), (HOSTNAME,), it)

    def _items(self) -> Iterator[tuple[str, str]]:
        it = iter(self._base.items())
        return chain(islice(it, self._base.host_at), ((HOSTNAME, self._host),), it)

    def keys(self) -> KeysView[str]:
        return KeysView(self)

    def items(self) -> ItemsView[str, str]:
        return _Items(self)

    def values(self) -> ValuesView[str]:
        return _Values(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NodeLabels):
            return self._host == other._host and (self._base is other._base or self._base == other._base)
        if isinstance(other, Mapping):
            return dict(self._items()) == (other if isinstance(other, dict) else dict(other.items()))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a dict is not hashable either

    def __repr__(self) -> str:
        return repr(dict(self._items()))


class _Items(ItemsView[str, str]):
    """Iterated in C (the index reads every node's items at each build), not through __getitem__ per key."""

    __slots__ = ()
    _mapping: NodeLabels

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return self._mapping._items()


class _Values(ValuesView[str]):
    __slots__ = ()
    _mapping: NodeLabels

    def __iter__(self) -> Iterator[str]:
        return (v for _, v in self._mapping._items())


class LabelSets:
    """Label dict -> the same labels as a NodeLabels over a shared LabelSet (or the dict itself: no hostname,
    or the cache full). Thread-safe."""

    def __init__(self, limit: int = MAX_LABEL_SETS) -> None:
        self.limit = limit
        self.unshared = 0  # nodes past the bound, left a plain dict
        # key -> weak reference to its set: a plain dict read in C (a WeakValueDictionary's get is Python)
        self._sets: dict[tuple[str | None, ...], weakref.ref[LabelSet]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Shared sets some live node uses."""
        return len(self._sets)

    def share(self, labels: dict[str, str]) -> Mapping[str, str]:
        """`labels` (a dict of the caller's own, all strings) as a NodeLabels; without a hostname label, or
        with the cache full and its set not in it, `labels` itself."""
        host = labels.get(HOSTNAME)
        if host is None:
            return labels
        loose: dict[str, str | None] = labels  # type: ignore[assignment]
        loose[HOSTNAME] = None  # the key keeps the hostname's position, not its value
        key = (*loose, *loose.values())  # keys then values: a third of the time of interleaving them
        loose[HOSTNAME] = host
        ref = self._sets.get(key)
        base = ref() if ref is not None else None
        if base is None:
            with self._lock:
                base = self._add(key, labels)
            if base is None:
                return labels
        return NodeLabels(base, host)

    def _add(self, key: tuple[str | None, ...], labels: dict[str, str]) -> LabelSet | None:
        ref = self._sets.get(key)  # another thread may have added it meanwhile
        base = ref() if ref is not None else None
        if base is not None:
            return base
        if len(self._sets) >= self.limit:
            self.unshared += 1
            return None
        base = LabelSet(labels)
        base.host_at = [*labels].index(HOSTNAME)
        del base[HOSTNAME]
        self._sets[key] = weakref.ref(base, functools.partial(self._drop, key))
        return base

    def _drop(self, key: tuple[str | None, ...], dead: weakref.ref[LabelSet]) -> None:
        """A set's last node went (called by the weak reference, in whichever thread dropped it)."""
        if self._sets.get(key) is dead:  # not a newer set under the same key
            self._sets.pop(key, None)
