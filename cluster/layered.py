"""A dict written in place by its owner and read through immutable views that cost O(recent changes), not
O(entries): the pod view's counts per node and per job (cluster/pods.py) at 50,000 nodes and 500,000 pods.

A view is a frozen base (a copy of the dict at the last compaction, shared by every view since) plus the
changes after it (copied per view). A compaction copies the whole dict once `COMPACT_AT` changes have piled
up, so a view costs at most `COMPACT_AT` copied entries and each change an amortized O(entries / COMPACT_AT).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

COMPACT_AT = 1024  # changes kept beside the base before the next view rebuilds it
_GONE = object()  # a key removed since the base


class View(Mapping[K, V], Generic[K, V]):
    """One immutable state of a `Layered` dict."""

    __slots__ = ("_base", "_delta", "_len")

    def __init__(self, base: dict[K, V], delta: dict[K, object], length: int) -> None:
        self._base = base
        self._delta = delta
        self._len = length

    def __getitem__(self, key: K) -> V:
        v = self._delta.get(key, self)  # `self`: not in the delta (no value is the view itself)
        if v is self:
            return self._base[key]
        if v is _GONE:
            raise KeyError(key)
        return v  # type: ignore[return-value]

    def get(self, key: K, default: object = None) -> V | object:  # type: ignore[override]
        v = self._delta.get(key, self)
        if v is self:
            return self._base.get(key, default)
        return default if v is _GONE else v

    def __contains__(self, key: object) -> bool:
        v = self._delta.get(key, self)  # type: ignore[arg-type]
        return key in self._base if v is self else v is not _GONE

    def __iter__(self) -> Iterator[K]:
        delta = self._delta
        yield from (k for k in self._base if k not in delta)
        yield from (k for k, v in delta.items() if v is not _GONE)

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"View({dict(self)!r})"


class Layered(Generic[K, V]):
    """The owner's side: `get`, `set`, `pop` on the current state (in place), `view()` for readers."""

    def __init__(self) -> None:
        self._now: dict[K, V] = {}
        self._base: dict[K, V] = {}
        self._delta: dict[K, object] = {}

    def get(self, key: K, default: V | None = None) -> V | None:
        return self._now.get(key, default)

    def set(self, key: K, value: V) -> None:
        self._now[key] = value
        self._changed(key, value)

    def pop(self, key: K) -> None:
        if self._now.pop(key, _GONE) is not _GONE:
            self._changed(key, _GONE)

    def _changed(self, key: K, value: object) -> None:
        # Compacted here, not only when a view is taken: with no reader (no GPU review for a while) the changes
        # would pile up without bound, one entry per key ever removed.
        self._delta[key] = value
        if len(self._delta) > COMPACT_AT:
            self._base, self._delta = dict(self._now), {}

    def __len__(self) -> int:
        return len(self._now)

    def view(self) -> View[K, V]:
        return View(self._base, dict(self._delta), len(self._now))
