"""Short-lived reservations of the GPUs the webhook promised to pinned jobs (docs/policy.md "Placement").

Between the admission of a job's template (or first pod) and the moment its pods are bound, the pod view
does not yet count the GPUs the job will take. Two jobs admitted back to back would both see the same free
rack; a reservation makes the second see it taken. Each pod of the job seen bound by the pod view
(`bound`, called from its watch thread) takes its share off the reservation (the view counts it from then
on); the reservation ends when all are seen, or after the policy's `placement.reservationSeconds`.

It ends early, for the GPUs it still holds, when its gang will not bind soon (`pending`, told by the pod view
why each unbound pod of a job waits; `Graces`): a pod seen Unschedulable ends it at once, unless GPUs are all the
scheduler found short (it may count a pod whose bind the bind check refuses a moment later); such pods, and
pods nobody has tried to schedule (gated, or no scheduler has set a PodScheduled condition), end it once no pod
of the job has bound for `waiting` seconds; a job none of whose pods is seen within `no_pods` seconds ends it
then. The pods of a pinned job that holds no reservation reserve again when they come (engine `later_pods_reservation`),
except while the job's last reservation ended because it stalled less than `placement.reservationSeconds`
ago (a new pin always reserves). Ended reservations are counted per reason (`ended`, the metric
gpu_admission_placement_reservations_ended_total).

In memory, per server process: replicas do not share reservations (docs/policy.md says what that costs).
State is per reserved job, never per pod: at most MAX_RESERVATIONS jobs, and as many recently stalled ones.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from cluster.pods import GATED, GPU_BUSY, SCHEDULING, UNSCHEDULABLE, UNSCHEDULED
from policies.engine import Placement
from policies.placement import Reservation

# A bound on memory: a flood of distinct pinned jobs beyond this drops the oldest reservations first.
MAX_RESERVATIONS = 10_000

# Why a reservation ended (the metric's reason label): its pods bound, its time ran out, a newer pin of the
# job replaced it, the oldest dropped past MAX_RESERVATIONS, or its gang will not bind soon (the last four).
BOUND = "bound"
EXPIRED = "expired"
REPLACED = "replaced"
DROPPED = "dropped"
NO_PODS = "no-pods"  # no pod of the job seen within Graces.no_pods
STALLED = (UNSCHEDULABLE, GPU_BUSY, GATED, UNSCHEDULED, NO_PODS)  # (UNSCHEDULED: no scheduler tried its pods)


@dataclass(frozen=True)
class Graces:
    """Seconds a reservation outlives signs that its gang will not bind soon (policy `placement.*`)."""

    no_pods: float = 15.0  # placement.noPodsGraceSeconds: from the reservation until a first pod of the job is seen
    waiting: float = 30.0  # placement.waitingGraceSeconds: pods gated / untried, since the last bind of the job


class _Held:
    """One job's reservation and what the pod view said of its pods since it was made (mutable, under lock)."""

    __slots__ = ("any_pod", "graces", "made", "reservation", "seen", "since", "why")

    def __init__(self, reservation: Reservation, made: float, graces: Graces) -> None:
        self.reservation = reservation
        self.made = made
        self.graces = graces
        self.seen = 0  # pods of the job seen bound since the reservation was made
        self.any_pod = False  # any pod of the job seen since (bound or not)
        self.since: float | None = None  # pods seen waiting untried, since then without a bind of the job
        self.why = ""  # ... GATED or UNSCHEDULED (the last seen)

    def ended(self, now: float) -> str | None:
        """Why the reservation is over at `now`, None while it holds."""
        if self.reservation.expires <= now:
            return EXPIRED
        if not self.any_pod and now - self.made >= self.graces.no_pods:
            return NO_PODS
        if self.since is not None and now - self.since >= self.graces.waiting:
            return self.why
        return None


class Reservations:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_job: dict[str, _Held] = {}
        self._stalled: dict[str, float] = {}  # job -> until when a pin of it reserves nothing (it stalled)
        self.recorded = 0
        self.ended: Counter[str] = Counter()

    @property
    def expired(self) -> int:
        return self.ended[EXPIRED]

    def record(self, pin: Placement, seconds: float, graces: Graces = Graces()) -> None:
        """Reserve the pinned gang (a later pin of the same job replaces the earlier one). A renewal (the pods
        of a pinned job that holds no reservation) reserves nothing while the job's last reservation ended
        because it stalled less than `seconds` ago: a gang that will not bind does not come back to hold."""
        now = self._clock()
        r = Reservation(pin.job, pin.key, pin.domain, pin.sizes, now + seconds)
        with self._lock:
            until = self._stalled.pop(pin.job, None)
            if until is not None and until > now and pin.renewed:
                self._stalled[pin.job] = until
                return
            if pin.job in self._by_job:
                self._end(pin.job, REPLACED)
            self._by_job[pin.job] = _Held(r, now, graces)
            while len(self._by_job) > MAX_RESERVATIONS:
                self._end(next(iter(self._by_job)), DROPPED)
            self.recorded += 1

    def bound(self, job: str) -> None:
        """One more pod of `job` is bound (the pod view counts its GPUs now)."""
        with self._lock:
            held = self._by_job.get(job)
            if held is None:
                return
            held.seen += 1
            held.any_pod = True
            if held.since is not None:
                held.since = self._clock()  # progress: the grace for the pods still waiting starts again
            if held.seen >= len(held.reservation.sizes):
                self._end(job, BOUND)

    def pending(self, job: str, why: str) -> None:
        """A pod of `job` is seen unbound, waiting for `why` (cluster.pods.waiting)."""
        with self._lock:
            held = self._by_job.get(job)
            if held is None:
                return
            held.any_pod = True
            if why == UNSCHEDULABLE:
                self._end(job, UNSCHEDULABLE)
            elif why == SCHEDULING:
                held.since = None  # a scheduler is on it
            elif why in (GATED, UNSCHEDULED, GPU_BUSY):  # GPU_BUSY: often a bind we are refusing; see cluster.pods
                held.why = why
                if held.since is None:
                    held.since = self._clock()

    def active(self) -> tuple[Reservation, ...]:
        """Reservations still holding GPUs: not ended, for the pods of their job not yet seen bound."""
        now = self._clock()
        with self._lock:
            out = []
            for job, held in list(self._by_job.items()):
                why = held.ended(now)
                if why is not None:
                    self._end(job, why)
                    continue
                r, seen = held.reservation, held.seen
                out.append(r if not seen else Reservation(r.job, r.key, r.domain, r.sizes[seen:], r.expires))
            return tuple(out)

    def _end(self, job: str, why: str) -> None:
        held = self._by_job.pop(job)
        self.ended[why] += 1
        if why in STALLED:
            self._stalled.pop(job, None)
            self._stalled[job] = self._clock() + (held.reservation.expires - held.made)
            while len(self._stalled) > MAX_RESERVATIONS:
                del self._stalled[next(iter(self._stalled))]

    def __len__(self) -> int:
        return len(self._by_job)
