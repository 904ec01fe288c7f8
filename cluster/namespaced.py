"""A per-namespace index of one namespaced resource, fed by a reflector's changes: what a review reads for
its own namespace without scanning the others (GPUPolicyExceptions).

`read(obj)` turns each object into the value kept (it raises ValueError for an object it cannot use: that
object is left out, counted and named in `skipped`). Readers get an immutable snapshot; a change copies only
its own namespace's tuple, so publishing costs O(objects in that namespace), never O(all).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from cluster.reflector import Change

log = logging.getLogger("gpu_admission.namespaced")

T = TypeVar("T")


@dataclass(frozen=True)
class IndexSnapshot(Generic[T]):
    by_namespace: Mapping[str, tuple[T, ...]]
    skipped: Mapping[str, str]  # namespace/name -> why it was left out
    synced: bool
    version: int

    def get(self, namespace: str) -> tuple[T, ...]:
        return self.by_namespace.get(namespace, ())

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_namespace.values())


class NamespacedIndex(Generic[T]):
    def __init__(self, read: Callable[[Any], T]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, T]] = {}
        self._snap: IndexSnapshot[T] = IndexSnapshot(MappingProxyType({}), MappingProxyType({}), False, 0)

    def snapshot(self) -> IndexSnapshot[T]:
        return self._snap

    def apply(self, change: Change) -> None:
        """A reflector's on_change: keep, replace or drop one object, republish its namespace."""
        with self._lock:
            s = self._snap
            if change.type == "SYNCED":
                self._snap = IndexSnapshot(s.by_namespace, s.skipped, True, s.version + 1)
                return
            ns, _, name = change.key.rpartition("/")
            entries = self._items.setdefault(ns, {})
            skipped = dict(s.skipped)
            skipped.pop(change.key, None)
            entries.pop(name, None)
            if change.new is not None:
                try:
                    entries[name] = self._read(change.new)
                except ValueError as exc:
                    skipped[change.key] = str(exc)[:300]
                    log.warning("object left out", extra={"object": change.key, "error": str(exc)[:300]})
            by_ns = dict(s.by_namespace)
            if entries:
                by_ns[ns] = tuple(entries[k] for k in sorted(entries))
            else:
                by_ns.pop(ns, None)
                self._items.pop(ns, None)
            self._snap = IndexSnapshot(MappingProxyType(by_ns), MappingProxyType(skipped), s.synced, s.version + 1)
