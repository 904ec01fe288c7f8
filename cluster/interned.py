"""Values shared by many records, each stored once and named by a small int (the pod table's nodes, jobs,
phases and GPU requests: cluster/podtable.py).

Ids are counted references: `acquire` takes one, `release` gives one back, and an id nobody references is
forgotten and reused, so the table holds the values in use now, not every value ever seen (jobs come and go
all day; nodes are replaced by autoscalers under new names).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=Hashable)
V = TypeVar("V")


def shared(cache: dict[Any, Any], key: Hashable, value: V, limit: int) -> V:
    """The object first cached under `key` (what sys.intern does for strings), or `value`, cached while the
    cache holds fewer than `limit` (it is never cleared: for the few dozen shapes a cluster has)."""
    hit = cache.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    if len(cache) < limit:
        cache[key] = value
    return value


class Interned(Generic[T]):
    """value <-> id, with a count of references per id."""

    __slots__ = ("_free", "_ids", "_refs", "_values")

    def __init__(self) -> None:
        self._ids: dict[T, int] = {}
        self._values: list[T | None] = []
        self._refs: list[int] = []
        self._free: list[int] = []

    def acquire(self, value: T) -> int:
        """The id of `value`, one more reference to it."""
        i = self._ids.get(value)
        if i is None:
            i = self._free.pop() if self._free else len(self._values)
            if i == len(self._values):
                self._values.append(value)
                self._refs.append(0)
            else:
                self._values[i] = value
            self._ids[value] = i
        self._refs[i] += 1
        return i

    def release(self, i: int) -> None:
        """One reference less to id `i`; the value is forgotten with its last one."""
        self._refs[i] -= 1
        if self._refs[i] == 0:
            del self._ids[self._values[i]]  # type: ignore[arg-type]
            self._values[i] = None
            self._free.append(i)

    def find(self, value: T) -> int:
        """The id of `value`, -1 when no record references it (no reference taken)."""
        return self._ids.get(value, -1)

    def value(self, i: int) -> T:
        return self._values[i]  # type: ignore[return-value]

    def __len__(self) -> int:
        """Distinct values referenced now."""
        return len(self._ids)
