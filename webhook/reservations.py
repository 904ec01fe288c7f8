"""Short-lived reservations of the GPUs the webhook promised to pinned jobs (docs/policy.md "Placement").

Between the admission of a job's template (or first pod) and the moment its pods are bound, the pod view
does not yet count the GPUs the job will take. Two jobs admitted back to back would both see the same free
rack; a reservation makes the second see it taken. Each pod of the job seen bound by the pod view
(`bound`, called from its watch thread) takes its share off the reservation (the view counts it from then
on); the reservation ends when all are seen, or after the policy's `placement.reservationSeconds`.

In memory, per server process: replicas do not share reservations (docs/policy.md says what that costs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from policies.engine import Placement
from policies.placement import Reservation

# A bound on memory: a flood of distinct pinned jobs beyond this drops the oldest reservations first.
MAX_RESERVATIONS = 10_000


class Reservations:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_job: dict[str, Reservation] = {}
        self._seen: dict[str, int] = {}  # job -> its pods seen bound since the reservation was made
        self.recorded = 0
        self.expired = 0

    def record(self, pin: Placement, seconds: float) -> None:
        """Reserve the pinned gang (a later pin of the same job replaces the earlier one)."""
        r = Reservation(pin.job, pin.key, pin.domain, pin.sizes, self._clock() + seconds)
        with self._lock:
            self._by_job.pop(pin.job, None)
            self._by_job[pin.job] = r
            self._seen[pin.job] = 0
            while len(self._by_job) > MAX_RESERVATIONS:
                self._drop(next(iter(self._by_job)))
            self.recorded += 1

    def bound(self, job: str) -> None:
        """One more pod of `job` is bound (the pod view counts its GPUs now)."""
        with self._lock:
            r = self._by_job.get(job)
            if r is not None:
                self._seen[job] += 1
                if self._seen[job] >= len(r.sizes):
                    self._drop(job)

    def active(self) -> tuple[Reservation, ...]:
        """Reservations still holding GPUs: not expired, for the pods of their job not yet seen bound."""
        now = self._clock()
        with self._lock:
            out = []
            for job, r in list(self._by_job.items()):
                if r.expires <= now:
                    self._drop(job)
                    self.expired += 1
                    continue
                seen = self._seen.get(job, 0)
                out.append(r if not seen else Reservation(r.job, r.key, r.domain, r.sizes[seen:], r.expires))
            return tuple(out)

    def _drop(self, job: str) -> None:
        del self._by_job[job]
        self._seen.pop(job, None)

    def __len__(self) -> int:
        return len(self._by_job)
