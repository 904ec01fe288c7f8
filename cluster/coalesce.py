"""Coalesce a stream of keyed changes into batches applied at most once per interval, on one thread.

A 50,000-node cluster sends hundreds of Node updates a second (heartbeats, conditions, labels). Applying each
one as it comes would publish a new view per event and spend the CPU that also answers admission. Here the
latest change per key wins, and `apply(batch)` runs at most every `interval` seconds with whatever arrived,
so a storm costs at most one batch of distinct keys per interval: the cost is bounded by the number of
objects, not the event rate, and the view lags the API server by at most `interval` plus one apply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpu_admission.coalesce")


class Coalescer:
    def __init__(self, apply: Callable[[dict[str, Any]], None], *, interval: float = 0.05, name: str = "") -> None:
        if interval < 0:
            raise ValueError("interval must be >= 0")
        self._apply = apply
        self.interval = interval
        self.name = name or "coalescer"
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._busy = False
        self._thread: threading.Thread | None = None
        # Counters read by /metrics.
        self.received = 0  # changes put
        self.applied = 0  # changes applied (after coalescing)
        self.batches = 0
        self.apply_seconds = 0.0  # total time in apply
        self.max_apply_seconds = 0.0

    def put(self, key: str, value: Any) -> None:
        """Queue a change (value None: removed); a later put of the same key replaces it."""
        with self._lock:
            self._pending[key] = value
            self.received += 1
        self._wake.set()

    def start(self) -> Coalescer:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Until everything put so far has been applied (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _run(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait()
            # Pace: at most one batch per interval; what arrives meanwhile joins the batch.
            delay = last + self.interval - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            with self._lock:
                batch, self._pending = self._pending, {}
                self._wake.clear()
                self._busy = bool(batch)
            if not batch:
                continue
            last = time.monotonic()
            try:
                self._apply(batch)
            except Exception:  # a bug in one batch must not stop the view from following the cluster
                log.exception("%s: applying %d changes failed", self.name, len(batch))
            spent = time.monotonic() - last
            with self._idle:
                self._busy = False
                self.batches += 1
                self.applied += len(batch)
                self.apply_seconds += spent
                self.max_apply_seconds = max(self.max_apply_seconds, spent)
                self._idle.notify_all()
