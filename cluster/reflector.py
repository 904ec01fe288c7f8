"""An in-memory cache of one Kubernetes resource kept current by list + watch in a background thread.

`Reflector(client, "/api/v1/nodes").start()` returns at once. A daemon thread lists the resource (paged),
then watches from the list's resourceVersion, applying each event to a dict keyed `namespace/name` (or
`name` for cluster-scoped objects). When the watch ends it re-watches from the last resourceVersion seen
(bookmarks included); when the API server answers 410 Gone it lists again, and the differences between the
old and new contents are reported as ordinary changes. Other errors back off exponentially with jitter.

Readers never block on the network: `snapshot()` copies the dict under a short lock, `synced` says whether
the first list has completed. Cached objects are shared, not copied: treat them as read-only.
`on_change(Change)` runs on the reflector's thread, for every change and a `SYNCED` after every list; an
exception in it is logged and otherwise ignored.

`transform(obj)` (optional) is applied to every listed and watched object before it is cached (None: the
object is not kept, as if deleted), so whole objects never accumulate: cluster/nodes.py cuts Nodes down.
`decoders` (optional) parse list pages and watch lines instead of orjson (cluster/nodes.py: NODE_DECODERS
skip what the transform never reads while parsing). A transform may return compact records instead of
objects (cluster/pods.py: one small record per GPU pod); `key_of` and `version_of` then read their key and
resourceVersion. `store` (optional) caches in place of the Reflector's own dict: every change is applied to
it (`Store.apply`, SYNCED included) before `on_change` hears of it, and a relist is applied to it change by
change (the dict is swapped whole), with `synced` set once the list's changes are in (cluster/pods.PodView:
the pod view is the pod cache, by column, with no second copy).

Used for Nodes, HorizontalPodAutoscalers, KEDA ScaledObjects and the policy ConfigMap.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cluster.kubeclient import JSON, Decode, KubeClient, KubeError, WatchHandle

log = logging.getLogger("gpu_admission.reflector")

ChangeType = Literal["ADDED", "MODIFIED", "DELETED", "SYNCED"]


@dataclass(frozen=True)
class Change:
    """One change to the cache: `old` is None for ADDED, `new` is None for DELETED.

    `SYNCED` (key "", no objects) follows every completed list, after that list's own changes, even when
    the list was empty and nothing changed: a consumer can act on "in sync, and there is nothing there".
    """

    type: ChangeType
    key: str
    old: JSON | None
    new: JSON | None


OnChange = Callable[[Change], None]


class Store(Protocol):
    """A cache a Reflector keeps current in place of its own dict (see the module docstring)."""

    def apply(self, change: Change) -> None: ...

    def get(self, key: str) -> Any: ...

    def __iter__(self) -> Iterator[str]: ...

    def entries(self) -> dict[str, Any]: ...

    def __len__(self) -> int: ...


def object_key(obj: JSON) -> str:
    """`namespace/name` for namespaced objects, `name` for cluster-scoped ones."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name") or "")
    namespace = metadata.get("namespace")
    return f"{namespace}/{name}" if namespace else name


def _resource_version(obj: JSON) -> str | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


class Reflector:
    """List + watch one resource path into a dict; see the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        name: str | None = None,
        on_change: OnChange | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        seed: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        decoders: tuple[Decode, Decode] | None = None,
        key_of: Callable[[Any], str] = object_key,
        version_of: Callable[[Any], str | None] = _resource_version,
        store: Store | None = None,
    ) -> None:
        if watch_timeout < 1:
            raise ValueError("watch_timeout must be at least 1 second")
        self._client = client
        self._path = path
        self.name = name or path
        self._on_change = on_change
        self._selectors: dict[str, str | None] = {
            "label_selector": label_selector,
            "field_selector": field_selector,
        }
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._random = random.Random(seed)
        self._transform = transform
        self._key_of = key_of
        self._version_of = version_of
        # Passed only when set: test doubles of the client need not know the keyword.
        self._list_decode: dict[str, Any] = {"decode": decoders[0]} if decoders else {}
        self._watch_decode: dict[str, Any] = {"decode": decoders[1]} if decoders else {}

        self._lock = threading.Lock()
        self._items: dict[str, JSON] = {}  # unused with a `store`
        self._store = store
        self._rv: str | None = None
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: WatchHandle | None = None
        self._last_error: str | None = None
        self.lists = 0
        self.watches = 0
        self.errors = 0

    # -- reader side (never touches the network) ----------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first list has been applied (and from then on)."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def snapshot(self) -> dict[str, JSON]:
        """A copy of the key -> object mapping (objects shared, read-only)."""
        if self._store is not None:
            return self._store.entries()
        with self._lock:
            return dict(self._items)

    def get(self, key: str) -> JSON | None:
        if self._store is not None:
            return self._store.get(key)  # type: ignore[no-any-return]
        with self._lock:
            return self._items.get(key)

    def __len__(self) -> int:
        if self._store is not None:
            return len(self._store)
        with self._lock:
            return len(self._items)

    @property
    def resource_version(self) -> str | None:
        with self._lock:
            return self._rv

    @property
    def last_error(self) -> str | None:
        """The last error (one line), or None once a list or watch succeeded after it."""
        return self._last_error

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> Reflector:
        if self._thread is not None:
            raise RuntimeError("reflector already started")
        self._thread = threading.Thread(target=self._run, name=f"reflector {self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Stop the thread (aborting a watch in progress); wait up to `timeout`. True if it has ended.

        The thread is a daemon, so it never holds up interpreter exit either way.
        """
        self._stop.set()
        handle = self._handle
        if handle is not None:
            handle.abort()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the loop ------------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self._backoff_initial
        need_list = True
        while not self._stop.is_set():
            if self._client.closed:
                log.warning("%s: the client was closed; the reflector stops", self.name)
                return
            try:
                if need_list:
                    self._list()
                    need_list = False
                    backoff = self._backoff_initial
                started = time.monotonic()
                events = self._watch()
                if events == 0 and time.monotonic() - started < 1.0 and not self._stop.is_set():
                    # A watch that closes at once without events: do not spin.
                    raise KubeError(0, "WatchClosed", "watch stream closed immediately")
                backoff = self._backoff_initial
            except KubeError as exc:
                if exc.gone:
                    log.info("%s: %s; listing again", self.name, exc)
                    need_list = True
                    continue
                self._failed(str(exc))
                backoff = self._sleep(backoff)
            except Exception as exc:  # a bug or an unexpected answer must not kill the cache
                log.exception("%s: unexpected error", self.name)
                self._failed(f"{type(exc).__name__}: {exc}")
                need_list = True
                backoff = self._sleep(backoff)

    def _failed(self, message: str) -> None:
        self.errors += 1
        self._last_error = " ".join(message.split())
        log.warning("%s: %s", self.name, self._last_error)

    def _sleep(self, backoff: float) -> float:
        delay = backoff * (0.5 + self._random.random())  # jitter: 0.5x to 1.5x
        self._stop.wait(delay)
        return min(backoff * 2, self._backoff_max)

    def _list(self) -> None:
        store = self._store
        # Into an empty store (the first list) each item goes as its page is read: nothing can be gone, so
        # nothing of the list is held (500,000 pods' entries, then a dict of them, at start-up otherwise).
        streamed = store is not None and len(store) == 0
        listed = self._client.list_all(
            self._path,
            page_size=self._page_size,
            label_selector=self._selectors["label_selector"],
            field_selector=self._selectors["field_selector"],
            transform=self._streamed if streamed else self._transform,
            **self._list_decode,
        )
        fresh: dict[str, Any] = {}
        for item in listed.get("items") or []:
            if isinstance(item, dict) or (item is not None and self._transform is not None):
                fresh[self._key_of(item)] = item
        rv = (listed.get("metadata") or {}).get("resourceVersion")
        del listed
        with self._lock:
            old = self._items
            if store is None:
                self._items = fresh
            self._rv = str(rv) if rv else None
        self.lists += 1
        self._last_error = None
        if store is None:
            self._synced.set()
            gone = [(key, obj) for key, obj in old.items() if key not in fresh]
            before: Callable[[str], Any] = old.get
        else:
            gone = [] if streamed else [(key, store.get(key)) for key in store if key not in fresh]
            before = store.get
        # Changes made one at a time as they are applied: no list of them all (500,000 pods on a first list).
        for change in self._diff(before, fresh, gone):
            self._emit(change)
        self._synced.set()
        self._emit(Change("SYNCED", "", None, None))

    def _streamed(self, obj: Any) -> None:
        """list_all's transform for a list streamed into the store: the item's change, nothing kept."""
        item = self._transform(obj) if self._transform is not None else obj
        if item is None or (self._transform is None and not isinstance(item, dict)):
            return
        key = self._key_of(item)
        for change in self._diff(self._store.get, {key: item}, []):  # type: ignore[union-attr]
            self._emit(change)

    def _diff(
        self, before: Callable[[str], Any], fresh: dict[str, Any], gone: list[tuple[str, Any]]
    ) -> Iterator[Change]:
        """The changes from what was cached (`before`: key -> object or None) to a list's `fresh` contents."""
        for key, obj in fresh.items():
            prev = before(key)
            if prev is None:
                yield Change("ADDED", key, None, obj)
            elif self._differs(prev, obj):
                yield Change("MODIFIED", key, prev, obj)
        for key, obj in gone:
            yield Change("DELETED", key, obj, None)

    def _watch(self) -> int:
        """Watch from the current resourceVersion until the stream ends; the number of events applied."""
        self.watches += 1
        # Spread re-watches like client-go: a server-side timeout between 1x and 2x the configured one.
        timeout = int(self._watch_timeout * (1 + self._random.random()))
        count = 0
        self._handle = handle = WatchHandle()
        if self._stop.is_set():
            return 0
        stream = self._client.watch(
            self._path,
            resource_version=self._rv,
            timeout_seconds=timeout,
            handle=handle,
            label_selector=self._selectors["label_selector"],
            field_selector=self._selectors["field_selector"],
            **self._watch_decode,
        )
        try:
            for event in stream:
                if self._stop.is_set():
                    break
                self._apply(event)
                count += 1
                self._last_error = None
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        return count

    def _apply(self, event: JSON) -> None:
        kind = event.get("type")
        obj: Any = event.get("object")
        if not isinstance(obj, dict):
            return
        rv = _resource_version(obj)
        if kind == "BOOKMARK":
            if rv:
                with self._lock:
                    self._rv = rv
            return
        key = object_key(obj)
        skipped = False  # the transform refused the new version: drop the cached one, if any
        if self._transform is not None and kind in ("ADDED", "MODIFIED"):
            slim = self._transform(obj)
            skipped = slim is None
            obj = obj if slim is None else slim
            kind = "DELETED" if skipped else kind
        change: Change | None = None
        store = self._store
        with self._lock:
            before = self._items.get(key) if store is None else store.get(key)
            if kind in ("ADDED", "MODIFIED"):
                if store is None:
                    self._items[key] = obj
                change = Change("ADDED" if before is None else "MODIFIED", key, before, obj)
            elif kind == "DELETED":
                if store is None:
                    self._items.pop(key, None)
                if before is not None or not skipped:
                    change = Change("DELETED", key, before if before is not None else obj, None)
            if rv:
                self._rv = rv
        if change is not None:
            self._emit(change)

    def _differs(self, a: Any, b: Any) -> bool:
        rv_a, rv_b = self._version_of(a), self._version_of(b)
        if rv_a and rv_b:
            return rv_a != rv_b
        return bool(a != b)

    def _emit(self, change: Change) -> None:
        """To the store (when there is one), then to on_change; an exception in either is logged, no more."""
        store = self._store.apply if self._store is not None else None
        for what, call in (("store", store), ("on_change", self._on_change)):
            if call is None:
                continue
            try:
                call(change)
            except Exception:
                log.exception("%s: %s failed for %s %s", self.name, what, change.type, change.key)
