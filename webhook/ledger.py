"""The server's post-launch ledger (issue #18): what became of each job it admitted, kept from the pod watch.

Fed by the pod view's changes (`State.watch_pods`: one Pod list + watch for both): with the ledger on, the
view's transform also reads a small note into the entry of each GPU pod event (`policies.ledger.Note`: job or
workload, class, creation and PodScheduled times), so no pod object is kept for the ledger. The view caches
no note (a change's note is all the tracker reads; it keeps its own facts of the pods it tracks). Rows
are made by the pure `policies/ledger.py`. A job is *final* once every pod is bound, or `window` seconds after its first
pod was created (then partly bound or never bound), or when evicted to make room; at that moment it is
counted in the metrics and, when an audit log is configured, a follow-up record with its outcome is written
under the uid of its admission (docs/audit.md).

With several replicas (docs/deploy.md "Ledger leader"), every replica tracks every job, but only the one the
Lease elects (`cluster/lease.py`) counts jobs in its metrics and writes their follow-ups; the others keep
theirs for STANDBY_KEEP seconds, and a replica that becomes leader emits those finalised after the previous
leader last renewed its Lease, so a take-over neither loses nor re-reports jobs (`promote`). A denial is the
exception: only the replica that decided it knows of it, so that replica counts it, leader or not.

Bounded state (each limit below; docs/deploy.md "Limits"): at most MAX_GROUPS jobs and inference workloads
and MAX_PODS pods are kept; past either, the oldest job is finalised early (counted as evicted). Final jobs
are remembered by id only, in a bounded set, so late events of their pods do not start them again. Metric
labels are bounded: namespaces beyond MAX_NAMESPACE_LABELS are reported as `_other`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster import pods as pods_mod
from cluster.pods import PodEntry
from cluster.reflector import Change
from policies import ledger as L
from policies.resources import GPU
from policies.subject import pod_facts
from webhook.audit import format_time

log = logging.getLogger("gpu-admission.ledger")

MAX_GROUPS = 10_000
MAX_PODS = 100_000
MAX_DONE = 20_000
MAX_NAMESPACE_LABELS = 50
OTHER = "_other"
# Seconds a fully bound job waits for more pods before it is final: a controller creates a gang's pods one by
# one, and the scheduler may bind the first before the last exists.
SETTLE = 5.0
DEFAULT_WINDOW = 600.0  # seconds: a job not fully bound this long after its first pod is final (and failed)
STANDBY_KEEP = 60.0  # seconds a non-leader keeps its final rows for a take-over (> lease duration + retry period)
PENDING_BOUNDS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
RATIO_BOUNDS = (1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)


def entry(obj: Any) -> PodEntry | None:
    """A pod's entry as the server's pod view caches it with the ledger on (its transform): the view's fields
    and the ledger's note. For feeding a tracker without a view (tests)."""
    return pods_mod.entry(obj, pod_facts, L.pod_note)


def _fact(key: str, new: Any) -> L.PodFact | None:
    """The ledger's fact of a changed pod: its view entry with the ledger's note; None when unreadable."""
    if not isinstance(new, PodEntry) or not isinstance(new.note, L.Note):
        return None
    return L.fact_of(key, dict(new.gpus), new.node, new.note)


@dataclass
class _Group:
    first_seen: float
    last_added: float = 0.0
    pods: dict[str, L.PodFact] = field(default_factory=dict)
    deleted: int = 0
    free: Mapping[str, int] = field(default_factory=dict)  # free GPUs at the first pod (L.free_profile)
    inference: bool = False


class NamespaceLabels:
    """The first MAX_NAMESPACE_LABELS namespaces get their own label value; the rest share `_other`."""

    def __init__(self, limit: int = MAX_NAMESPACE_LABELS) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def __call__(self, namespace: str) -> str:
        if namespace in self._known:
            return namespace
        if len(self._known) < self.limit:
            self._known.add(namespace)
            return namespace
        return OTHER


class Tracker:
    """Jobs and inference workloads, from pod changes (`apply`) and admissions (`admitted`)."""

    def __init__(
        self,
        topology: Callable[[], L.Topology],
        free: Callable[[], Mapping[str, int]],
        *,
        free_version: Callable[[], Any] = lambda: None,
        metrics: Any = None,
        on_final: Callable[[L.JobRow], None] | None = None,
        window: float = DEFAULT_WINDOW,
        settle: float = SETTLE,
        clock: Callable[[], float] = time.time,
        max_groups: int = MAX_GROUPS,
        max_pods: int = MAX_PODS,
        max_done: int = MAX_DONE,
        model: L.Comm | None = None,
    ) -> None:
        self._topology, self._free, self._clock = topology, free, clock
        self._free_version = free_version  # changes whenever `free()` may: the profile is kept per version
        self._last_profile: tuple[Any, Mapping[str, int]] | None = None
        self._on_final = on_final
        self.window, self.settle, self.max_groups, self.max_pods = window, settle, max_groups, max_pods
        self.max_done = max_done
        self.model = model or L.Comm()
        self._lock = threading.Lock()
        self._groups: OrderedDict[str, _Group] = OrderedDict()  # oldest first
        self._where: dict[str, str] = {}  # pod key -> group
        self._pods = 0
        self._admissions: OrderedDict[str, L.Admission] = OrderedDict()
        self._inbox: deque[tuple[str, L.Admission]] = deque(maxlen=max_groups)  # from the request path
        self._done: OrderedDict[str, None] = OrderedDict()
        self._last_sweep = 0.0
        self._evicted: list[L.JobRow] = []  # finalised early to make room, emitted after the lock
        self.counts = {"skipped": 0, "evicted": 0, "final": 0, "unowned": 0, "deleted": 0, "late": 0, "standby": 0}
        self.leading: Callable[[], bool] = lambda: True  # no election: one replica, always the leader
        self._standby: deque[tuple[float, L.JobRow]] = deque(maxlen=max_groups)  # final while not leader
        self.namespace_label = NamespaceLabels()
        self.metrics = metrics
        if metrics is not None:
            _describe(metrics, self)

    def attach(
        self,
        metrics: Any = None,
        on_final: Callable[[L.JobRow], None] | None = None,
        leading: Callable[[], bool] | None = None,
    ) -> None:
        """Metrics, the follow-up writer and the leadership test (`Elector.leader`), made after the pod watch
        started (serve's start-up order)."""
        if leading is not None:
            self.leading = leading
        if metrics is not None:
            self.metrics = metrics
            _describe(metrics, self)
        if on_final is not None:
            self._on_final = on_final

    # -- input --------------------------------------------------------------------------------------------

    def apply(self, change: Change) -> None:
        if change.type == "SYNCED":
            return
        fact = _fact(change.key, change.new) if change.new is not None else None
        with self._lock:
            if change.new is not None and fact is None:
                self.counts["skipped"] += 1
            finals = self._take_admissions()
            if fact is None:
                self._forget(change.key, deleted=change.new is None)
            else:
                self._put(change.key, fact)
                finals += self._check(fact.group)
            finals += self._sweep()
            finals += self._evicted
            self._evicted = []
        self._emit(finals)

    def admitted(self, group: str, admission: L.Admission) -> None:
        """The webhook decided on an object of `group`. Called on the request path: never waits for the lock
        (a sweep or a scrape may hold it), the decision is queued and taken in by the next change or sweep."""
        self._inbox.append((group, admission))

    def _take_admissions(self) -> list[L.JobRow]:
        finals: list[L.JobRow] = []
        while self._inbox:
            group, admission = self._inbox.popleft()
            self._admissions[group] = L.merge_admission(self._admissions.get(group), admission)
            self._admissions.move_to_end(group)
            while len(self._admissions) > self.max_groups:
                self._admissions.popitem(last=False)
            if admission.verdict == "deny" and group not in self._groups and admission.workload != "inference":
                topo = self._topology()
                finals.append(L.job_row(group, (), topo, now=self._clock(), admission=admission, model=self.model))
        return finals

    def sweep(self) -> None:
        """Finalise jobs settled or past their window (also done on every change, at most once a second)."""
        with self._lock:
            self._last_sweep = 0.0
            finals = self._take_admissions() + self._sweep()
        self._emit(finals)

    def start(self, stop: threading.Event, interval: float = 1.0) -> threading.Thread:
        """Sweep every `interval` seconds until `stop` is set: a quiet cluster still gets its jobs final."""

        def loop() -> None:
            while not stop.wait(interval):
                try:
                    self.sweep()
                except Exception:  # never a silent end of the sweeper: log and keep sweeping
                    log.exception("ledger sweep failed")

        thread = threading.Thread(target=loop, name="ledger-sweep", daemon=True)
        thread.start()
        return thread

    # -- output -------------------------------------------------------------------------------------------

    def rows(self) -> tuple[list[L.JobRow], list[L.InferenceRow]]:
        """Rows of the jobs and inference workloads still tracked (not yet final)."""
        with self._lock:
            groups = list(self._groups.items())
            topo, now = self._topology(), self._clock()
            jobs = [self._row(g, st, topo, now) for g, st in groups if not st.inference]
            inference = [L.inference_row(g, list(st.pods.values()), topo) for g, st in groups if st.inference]
        return jobs, inference

    @property
    def sizes(self) -> dict[str, int]:
        return {
            "groups": len(self._groups),
            "pods": self._pods,
            "done": len(self._done),
            "admissions": len(self._admissions),
        }

    # -- internals (lock held) ----------------------------------------------------------------------------

    def _put(self, key: str, fact: L.PodFact) -> None:
        if fact.group in self._done:
            self.counts["late"] += 1
            return
        old_group = self._where.get(key)
        if old_group is not None and old_group != fact.group:
            self._forget(key, deleted=False)
        st = self._groups.get(fact.group)
        if st is None and fact.created is not None and fact.created < self._clock() - self.window:
            # Created longer than a window ago and not tracked: a job already judged (its id since dropped
            # from the bounded done set) or one that started before this server (its first list): not ours.
            self.counts["late"] += 1
            return
        if st is None:
            st = self._new_group(fact)
        if key not in st.pods:
            st.last_added = self._clock()
            self._pods += 1
            if fact.unowned:
                self.counts["unowned"] += 1
        old = st.pods.get(key)
        if old is not None and old.node and not fact.node:
            return  # a bound pod never comes unbound: a stale event
        st.pods[key] = fact
        self._where[key] = fact.group
        self._bound_memory()

    def _new_group(self, fact: L.PodFact) -> _Group:
        # The window runs from the first pod's creation (when known), not from when this replica saw it: a
        # replica started later ends a job's window when the one that was leader did, so a take-over does not
        # count the job again.
        now = self._clock()
        start = min(now, fact.created) if fact.created is not None else now
        st = _Group(first_seen=start, inference=fact.workload == "inference")
        if not st.inference:
            # The free GPUs now, when the job's first pod appears (≈ its admission), cut down to what any gang's
            # best placement can use; the best is computed for the job's real pods once they are all known.
            st.free = self._profile()
        self._groups[fact.group] = st
        return st

    def _profile(self) -> Mapping[str, int]:
        key = self._free_version()
        if self._last_profile is None or self._last_profile[0] != key:
            self._last_profile = (key, L.free_profile(self._free(), self._topology()))
        return self._last_profile[1]

    def _forget(self, key: str, deleted: bool) -> None:
        group = self._where.pop(key, None)
        if group is None:
            return
        st = self._groups.get(group)
        if st is None:
            return
        fact = st.pods.get(key)
        if fact is None:
            return
        if fact.node and deleted and not st.inference:
            return  # it was bound (and ended or was deleted since): the job's ledger keeps where it ran
        del st.pods[key]
        self._pods -= 1
        if deleted and not st.inference:
            st.deleted += 1
            self.counts["deleted"] += 1
        if not st.pods and (st.inference or not st.deleted):
            del self._groups[group]

    def _bound_memory(self) -> None:
        while len(self._groups) > self.max_groups or self._pods > self.max_pods:
            group, st = next(iter(self._groups.items()))
            self.counts["evicted"] += 1
            row = self._final(group, st)
            if not st.inference:  # an inference workload has no outcome: it is only forgotten
                self._evicted.append(row)

    def _check(self, group: str) -> list[L.JobRow]:
        st = self._groups.get(group)
        if st is None or not self._settled(st, self._clock()):
            return []
        return [self._final(group, st)]  # settled: every pod bound, so the outcome is a bound one

    def _settled(self, st: _Group, now: float) -> bool:
        """Every pod seen is bound, none was deleted unbound, and no pod came for `settle` seconds."""
        if st.inference or st.deleted or now - st.last_added < self.settle:
            return False
        return all(p.node for p in st.pods.values())

    def _sweep(self) -> list[L.JobRow]:
        now = self._clock()
        if now - self._last_sweep < 1.0:
            return []
        self._last_sweep = now
        return [
            self._final(group, st)
            for group, st in list(self._groups.items())
            if not st.inference and (st.first_seen + self.window <= now or self._settled(st, now))
        ]

    def _row(self, group: str, st: _Group, topo: L.Topology, now: float) -> L.JobRow:
        return L.job_row(
            group,
            list(st.pods.values()),
            topo,
            now=now,
            admission=self._admissions.get(group),
            best=L.best_placement([p.gpus for p in st.pods.values()], st.free, topo, self.model)
            if st.pods and not st.inference
            else None,
            deleted=st.deleted,
            model=self.model,
        )

    def _final(self, group: str, st: _Group) -> L.JobRow:
        row = self._row(group, st, self._topology(), self._clock())
        for key in st.pods:
            self._where.pop(key, None)
        self._pods -= len(st.pods)
        del self._groups[group]
        if not st.inference:
            self._done[group] = None
            while len(self._done) > self.max_done:
                self._done.popitem(last=False)
        return row

    def promote(self, since: float | None) -> None:
        """This replica became leader: emit the rows it finalised as a standby after `since` (the wall-clock
        time the previous leader last renewed or released its Lease; None: there was none), drop older ones
        (the previous leader emitted them)."""
        with self._lock:
            kept = [row for t, row in self._standby if since is None or t > since]
            self._standby.clear()
        self._emit(kept)

    def _emit(self, rows: list[L.JobRow]) -> None:
        for row in rows:
            if row.outcome != "denied" and not self.leading():  # a denial: only this replica saw it
                self._keep_standby(row)
                continue
            self.counts["final"] += 1
            if self.metrics is not None:
                self._count(row)
            if self._on_final is not None:
                self._on_final(row)

    def _keep_standby(self, row: L.JobRow) -> None:
        now = self._clock()
        with self._lock:
            self.counts["standby"] += 1
            while self._standby and self._standby[0][0] < now - STANDBY_KEEP:
                self._standby.popleft()
            self._standby.append((now, row))

    def _count(self, row: L.JobRow) -> None:
        m = self.metrics
        labels = (("namespace", self.namespace_label(row.namespace)), ("workload", row.workload))
        m.inc("gpu_admission_ledger_jobs_total", (*labels, ("outcome", row.outcome)))
        if L.succeeded(row, self.window):
            m.inc("gpu_admission_ledger_jobs_bound_in_window_total", labels)
        if row.fully_bound and row.pending_s is not None:
            m.observe_in("gpu_admission_ledger_pending_seconds", row.pending_s, labels)
        if row.comm_ratio is not None:
            m.observe_in("gpu_admission_ledger_comm_ratio", row.comm_ratio, labels)

    def partial(self) -> dict[tuple[tuple[str, str], ...], tuple[int, int]]:
        """Per label set: (jobs partly bound now, GPUs they hold). O(tracked pods), for a scrape. Empty on a
        replica that is not the leader (the leader reports them: a sum over replicas counts each once)."""
        out: dict[tuple[tuple[str, str], ...], tuple[int, int]] = {}
        if not self.leading():
            return out
        with self._lock:
            for st in self._groups.values():
                pods = st.pods.values()
                held = [p.gpus for p in pods if p.node]
                if st.inference or not held or len(held) == len(st.pods) + st.deleted:
                    continue
                first = next(iter(pods))
                key = (("namespace", self.namespace_label(first.namespace)), ("workload", first.workload))
                jobs, gpus = out.get(key, (0, 0))
                out[key] = (jobs + 1, gpus + sum(held))
        return out


def for_state(state: Any, window: float = DEFAULT_WINDOW) -> Tracker:
    """A tracker reading the server's inventory (topology) and pod view (free GPUs)."""

    def topology() -> L.Topology:
        return L.topology_of(state.snapshot().inventory)

    def free() -> Mapping[str, int]:
        view = state.pods
        used = view.snapshot().used_of(GPU) if view is not None else {}
        return L.free_of(topology(), used)

    def version() -> Any:
        view = state.pods
        return (id(state.snapshot().inventory), view.snapshot().version if view is not None else None)

    return Tracker(topology, free, free_version=version, window=window)


def follow_up(row: L.JobRow) -> dict[str, Any]:
    """The audit record of a job's outcome, under the uid of its admission when this replica decided it, else
    under the uid of the job's object (docs/audit.md)."""
    return {
        "time": format_time(time.time()),
        "uid": row.uid or row.job_uid,
        "admissionUid": row.uid,
        "jobUid": row.job_uid,
        "record": "outcome",
        "namespace": row.namespace,
        "group": row.group,
        "workload": row.workload,
        "outcome": row.outcome,
        "rules": list(row.rules),
        "pods": row.pods,
        "bound": row.bound,
        "deleted": row.deleted,
        "gpus": row.gpus,
        "pendingSeconds": row.pending_s,
        "spans": {k: n for k, n in row.spans},
        "nodes": len(row.nodes),
        "placement": row.placement,
        "best": row.best,
        "actualMs": row.actual_ms,
        "bestMs": row.best_ms,
        "commRatio": row.comm_ratio,
        "unowned": row.unowned,
    }


def _describe(m: Any, t: Tracker) -> None:
    m.describe(
        "gpu_admission_ledger_jobs_total",
        "counter",
        "Jobs whose placement is final, by namespace (first 50, then _other), workload class and outcome",
    )
    m.describe(
        "gpu_admission_ledger_jobs_bound_in_window_total",
        "counter",
        "Jobs fully bound within the ledger window of their first pod (success rate = this / jobs not denied)",
    )
    m.histogram(
        "gpu_admission_ledger_pending_seconds",
        "Seconds from a job's first pod created to its last pod bound (PodScheduled), fully bound jobs",
        PENDING_BOUNDS,
    )
    m.histogram(
        "gpu_admission_ledger_comm_ratio",
        "All-reduce time of a job's actual placement over the best the free GPUs allowed at its first pod",
        RATIO_BOUNDS,
    )
    m.gauge(
        "gpu_admission_ledger_partial_gangs",
        "Jobs partly bound now, by namespace and workload class",
        lambda: [(k, float(v[0])) for k, v in sorted(t.partial().items())],
    )
    m.gauge(
        "gpu_admission_ledger_partial_gang_gpus",
        "GPUs held by jobs partly bound now, by namespace and workload class",
        lambda: [(k, float(v[1])) for k, v in sorted(t.partial().items())],
    )
    m.gauge(
        "gpu_admission_ledger_leader",
        "1 on the replica whose ledger counts jobs (elected by the Lease, or the only one), 0 on the others",
        lambda: [((), 1.0 if t.leading() else 0.0)],
    )
    m.gauge(
        "gpu_admission_ledger_tracker",
        "The ledger tracker's state: tracked groups, pods, final ids and admissions kept; pods skipped (unreadable), "
        "unowned, deleted before bound; jobs final, evicted early, late events, final while not leader (standby)",
        lambda: [((("what", k),), float(v)) for k, v in sorted({**t.sizes, **t.counts}.items())],
    )
