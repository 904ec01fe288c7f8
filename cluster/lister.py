"""Bounded reads of whole resources: paged lists behind a rate limit (`gpu-admission scan`).

A scan lists every workload of a cluster; without bounds that is one unpaged list per kind (hundreds of MB
from the API server and etcd at once on a big cluster) in a burst. Here each request asks for at most
`page_size` objects, and requests are spaced by a token bucket of `qps` (burst 1), so the API load of a scan
is at most `qps` list requests per second of at most `page_size` objects each, whatever the cluster's size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cluster.kubeclient import KubeClient, KubeError


class RateLimiter:
    """At most `qps` acquisitions per second, spaced evenly (a token bucket of depth 1)."""

    def __init__(
        self, qps: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        if not qps > 0:
            raise ValueError("qps must be positive")
        self.interval = 1.0 / qps
        self._clock, self._sleep = clock, sleep
        self._next = 0.0
        self._lock = threading.Lock()
        self.waited = 0.0
        self.acquired = 0  # requests made

    def acquire(self) -> None:
        with self._lock:
            self.acquired += 1
            now = self._clock()
            wait = self._next - now
            self._next = max(now, self._next) + self.interval
        if wait > 0:
            self.waited += wait
            self._sleep(wait)


def pages(client: KubeClient, path: str, *, page_size: int, limiter: RateLimiter) -> Iterator[list[Any]]:
    """The items of `path`, one page at a time. An expired continue token (410) restarts the list from the
    start, once; the caller sees the objects of the first pages again (it must de-duplicate by uid)."""
    token: str | None = None
    restarted = False
    while True:
        limiter.acquire()
        try:
            page = client.list(path, limit=page_size, continue_=token)
        except KubeError as exc:
            if exc.gone and token is not None and not restarted:
                token, restarted = None, True
                continue
            raise
        items = page.get("items")
        yield items if isinstance(items, list) else []
        metadata = page.get("metadata")
        token = (metadata.get("continue") if isinstance(metadata, dict) else None) or None
        if not token:
            return
