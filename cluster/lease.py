"""Leader election on a `coordination.k8s.io/v1` Lease: one replica of several does a job only one may do.

The protocol is client-go's `leaderelection` (LeaseLock), on our own client:

- A replica reads the Lease. None: it creates one naming itself (409 AlreadyExists: another was faster).
- Another holder whose record last changed less than `lease_duration` ago *by this replica's monotonic clock*
  (when it was observed, not the `renewTime` written in it: the two nodes' clocks need not agree) keeps it.
- Otherwise (expired, released, or ours) it writes itself in with an update conditional on the
  resourceVersion it read: of two replicas racing, the API server accepts one and the other gets 409.
- The leader renews every `retry_period`. It counts as leader only until `renew_deadline` after the start of
  its last successful write (the start: a write may land late), so it steps down before anyone may take over
  (`renew_deadline` < `lease_duration`), even while a request hangs or the process was paused.
- `release()` (on SIGTERM) hands the Lease back at once (empty holder, 1 s duration): the next replica takes
  over within one `retry_period` instead of a whole `lease_duration`.

Limit (docs/deploy.md "Ledger leader"): "never two leaders" holds while the replicas' monotonic clocks run at
the same rate within (lease_duration - renew_deadline) / lease_duration (a third with the defaults); it is not
a promise against clocks that drift faster than that, or a process paused and resumed between its own check
and its action (the caller checks `leader` just before acting, which makes that window microseconds).

Every API error or timeout is logged and counted, never raised from the loop: the replica just is not leader.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cluster.kubeclient import KubeError

log = logging.getLogger("gpu-admission.lease")

LEASE_DURATION = 15.0  # seconds another replica waits after the holder's last renewal before taking over
RENEW_DEADLINE = 10.0  # seconds the holder stays leader after its last successful renewal began
RETRY_PERIOD = 2.0  # seconds between attempts (acquire or renew)


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD

    def __post_init__(self) -> None:
        if not (0 < self.retry_period < self.renew_deadline < self.lease_duration):
            raise ValueError("lease timings need 0 < retry period < renew deadline < lease duration")
        if self.lease_duration != int(self.lease_duration) or self.lease_duration > 3600:
            raise ValueError("lease duration must be whole seconds, at most 3600")
        if not (self.namespace and self.name and self.identity):
            raise ValueError("lease namespace, name and identity must not be empty")

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    @property
    def collection(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"


def micro_time(t: float) -> str:
    """A MicroTime as the API server writes it (RFC 3339, microseconds, UTC)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Record:
    """What a Lease says: holder ("" when released), its duration, renewal time and transitions."""

    holder: str
    duration: float
    renewed: float | None  # the holder's wall clock at its last renewal
    transitions: int
    version: str  # resourceVersion, for the conditional update

    @classmethod
    def of(cls, lease: Any) -> Record:
        spec = lease.get("spec") if isinstance(lease, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        meta = lease.get("metadata") if isinstance(lease, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        holder, duration = spec.get("holderIdentity"), spec.get("leaseDurationSeconds")
        transitions = spec.get("leaseTransitions")
        return cls(
            holder=holder if isinstance(holder, str) else "",
            duration=float(duration) if isinstance(duration, int) and duration > 0 else LEASE_DURATION,
            renewed=parse_micro_time(spec.get("renewTime")),
            transitions=transitions if isinstance(transitions, int) and transitions >= 0 else 0,
            version=str(meta.get("resourceVersion") or ""),
        )


class Elector:
    """One replica's side of the election. `step()` is one attempt; `start()` runs it every retry period.

    `on_change(leader, previous)` is called (from the elector's thread) when this replica becomes leader or
    stops being it; `previous` is the Record it took over from (None: it created the Lease), so a caller can
    tell when the previous holder last proved alive.
    """

    def __init__(
        self,
        client: Any,
        config: LeaseConfig,
        *,
        on_change: Callable[[bool, Record | None], None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.config = client, config
        self._on_change = on_change
        self._clock, self._mono = clock, monotonic
        self._lock = threading.Lock()
        self._valid_until = 0.0  # monotonic: leader until then (start of the last successful write + deadline)
        self._was_leader = False
        self._observed: tuple[str, str] | None = None  # (holder, resourceVersion) last read
        self._observed_at = 0.0  # monotonic time it was first seen
        self._acquired: float | None = None  # wall clock of our acquisition (kept in acquireTime)
        self.holder = ""  # the holder last seen
        self.transitions = 0  # times this replica became leader
        self.errors = 0
        self.last_error: str | None = None
        self._warned = 0.0  # monotonic time of the last warning logged
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state --------------------------------------------------------------------------------------------

    @property
    def leader(self) -> bool:
        """Leader now: within the renew deadline of our last successful write. Check just before acting."""
        return self._mono() < self._valid_until

    def status(self) -> dict[str, Any]:
        return {
            "lease": f"{self.config.namespace}/{self.config.name}",
            "identity": self.config.identity,
            "leader": self.leader,
            "holder": self.holder or None,
            "becameLeader": self.transitions,
            "errors": self.errors,
            "lastError": self.last_error,
        }

    # -- one attempt --------------------------------------------------------------------------------------

    def step(self) -> bool:
        """Acquire or renew once; whether this replica is leader afterwards. Never raises on API errors."""
        with self._lock:
            previous: Record | None = None
            try:
                previous = self._attempt()
            except KubeError as exc:
                self._error(exc)
            except Exception as exc:  # a bug or garbage must not end the election loop: count and go on
                log.exception("lease attempt failed")
                self._error(exc)
            leader = self.leader
            changed = leader != self._was_leader
            self._was_leader = leader
        if changed:
            self._changed(leader, previous)
        return leader

    def _attempt(self) -> Record | None:
        """One acquire-or-renew; returns the record taken over (on a change of holder), or None."""
        cfg = self.config
        started = self._mono()
        try:
            lease = self.client.get(cfg.path)
        except KubeError as exc:
            if not exc.not_found:
                raise
            return self._create(started)
        rec = Record.of(lease)
        self.holder = rec.holder
        seen = (rec.holder, rec.version)
        if seen != self._observed:
            self._observed, self._observed_at = seen, started
        ours = rec.holder == cfg.identity
        if not ours:
            self._valid_until = 0.0  # someone else's name is in it: never act as leader on a stale belief
        if not ours and rec.holder and started < self._observed_at + rec.duration:
            return None  # held by another, not expired by our observation
        now = self._clock()
        acquired = self._acquired if ours and self._acquired is not None else now
        spec = {
            "holderIdentity": cfg.identity,
            "leaseDurationSeconds": int(cfg.lease_duration),
            "acquireTime": micro_time(acquired),
            "renewTime": micro_time(now),
            "leaseTransitions": rec.transitions if ours else rec.transitions + 1,
        }
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": cfg.name, "namespace": cfg.namespace, "resourceVersion": rec.version},
            "spec": spec,
        }
        try:
            updated = self.client.update(cfg.path, body)
        except KubeError as exc:
            if exc.conflict:  # another replica wrote first: it holds the Lease now
                self._valid_until = 0.0
                log.info("lease update lost a race", extra={"lease": cfg.name})
                return None
            raise
        self._won(updated, started, acquired)
        return None if ours else rec

    def _create(self, started: float) -> Record | None:
        cfg, now = self.config, self._clock()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": cfg.name, "namespace": cfg.namespace},
            "spec": {
                "holderIdentity": cfg.identity,
                "leaseDurationSeconds": int(cfg.lease_duration),
                "acquireTime": micro_time(now),
                "renewTime": micro_time(now),
                "leaseTransitions": 0,
            },
        }
        try:
            created = self.client.create(cfg.collection, body)
        except KubeError as exc:
            if exc.conflict:  # AlreadyExists: another replica created it first
                return None
            raise
        self._won(created, started, now)
        return None

    def _won(self, lease: Any, started: float, acquired: float) -> None:
        rec = Record.of(lease)
        self._observed, self._observed_at = (rec.holder, rec.version), started
        self.holder, self._acquired = rec.holder, acquired
        self._valid_until = started + self.config.renew_deadline
        self.last_error = None

    def _error(self, exc: Exception) -> None:
        # Logged when the error changes and once a minute while it lasts: not every retry period (a missing
        # grant would write 1,800 lines an hour). /readyz and `errors` count them all.
        message, now = str(exc), self._mono()
        if message != self.last_error or now - self._warned >= 60:
            log.warning("lease attempt failed", extra={"lease": self.config.name, "error": message})
            self._warned = now
        self.errors += 1
        self.last_error = message

    def _changed(self, leader: bool, previous: Record | None) -> None:
        if leader:
            self.transitions += 1
        log.info("ledger leadership changed", extra={"leader": leader, "identity": self.config.identity})
        if self._on_change is not None:
            try:
                self._on_change(leader, previous)
            except Exception:
                log.exception("leadership callback failed")

    # -- loop ---------------------------------------------------------------------------------------------

    def start(self) -> threading.Thread:
        """Attempt now and then every retry period (in a daemon thread) until `stop()` or `release()`."""

        def loop() -> None:
            while True:
                self.step()
                wait = self.config.retry_period
                if self._stop.wait(wait):
                    return

        self._thread = threading.Thread(target=loop, name="lease-elector", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.config.retry_period + 35)

    def release(self) -> bool:
        """Stop the loop and, when leader, hand the Lease back so another replica takes over at once. Stops
        acting as leader before the write. Whether the Lease was released."""
        self.stop()
        with self._lock:
            was = self.leader
            self._valid_until = 0.0
            changed = self._was_leader
            self._was_leader = False
            released = False
            if was:
                released = self._give_back()
        if changed:
            self._changed(False, None)
        return released

    def _give_back(self) -> bool:
        cfg = self.config
        try:
            rec = Record.of(self.client.get(cfg.path))
            if rec.holder != cfg.identity:
                return False
            now = micro_time(self._clock())
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace, "resourceVersion": rec.version},
                "spec": {
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": rec.transitions,
                },
            }
            self.client.update(cfg.path, body)
        except KubeError as exc:
            self._error(exc)
            return False
        self.holder = ""
        return True
