"""The server's background scan (`serve --scan-interval`): `scan` every interval and after every policy change,
with what the server already holds (policy, inventory, namespace labels, exceptions), exported as metrics.

Off by default: each run lists every workload kind of the cluster (bounded: --scan-page-size objects per
request, --scan-qps requests per second), and reading Jobs, CronJobs, ReplicaSets, DaemonSets and the CRD
kinds needs RBAC the base manifests do not grant (deploy/overlays/scan adds it and turns the scan on).
Runs one at a time on their own thread; a policy change during a run schedules one more run, never a queue.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from webhook import scan as scan_mod
from webhook.metrics import Metrics
from webhook.state import State

log = logging.getLogger("gpu-admission.scan")

MIN_INTERVAL = 60.0  # seconds; a scan lists the whole cluster, so never more often than this


class Scanner:
    def __init__(self, client: Any, state: State, interval: float, limits: scan_mod.Limits) -> None:
        if interval < MIN_INTERVAL:
            raise ValueError(f"--scan-interval must be at least {MIN_INTERVAL:.0f} seconds (or 0: off)")
        self.client, self.state, self.interval, self.limits = client, state, interval, limits
        self.last: scan_mod.ScanResult | None = None
        self.last_finished = 0.0
        self.runs = 0
        self.failures = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        state.on_policy_change.append(lambda _policy: self._wake.set())

    def start(self) -> Scanner:
        self._thread = threading.Thread(target=self._loop, name="scan", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._ready():
                self.run_once()
            self._wake.wait(self.interval)
            self._wake.clear()

    def _ready(self) -> bool:
        """The inventory and namespaces are read (a scan with an empty inventory would report nonsense)."""
        ok, _ = self.state.ready()
        return ok

    def run_once(self) -> scan_mod.ScanResult | None:
        snap = self.state.snapshot()
        basis = scan_mod.Basis(
            policy=snap.policy,
            policy_source=self.state.status.policy_source,
            inventory=snap.inventory,
            namespace_labels=snap.namespaces,
            exceptions=self.state.exceptions_in,
        )
        try:
            result = scan_mod.run(self.client, basis=basis, limits=self.limits)
        except Exception as exc:  # never let the thread die: the next interval tries again
            self.failures += 1
            log.error("scan failed", extra={"error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            return None
        self.last, self.last_finished, self.runs = result, time.time(), self.runs + 1
        counts = result.counts()
        log.info(
            "scan finished",
            extra={"objects": len(result.results), "fail": counts["fail"], "warn": counts["warn"],
                   "unreadable": len(result.unreadable), "requests": result.requests,
                   "seconds": round(result.seconds, 3), "policy_hash": result.policy_hash},
        )  # fmt: skip
        for bad in result.unreadable[:20]:
            log.warning("scan skipped an object", extra={"object": bad.describe()})
        for err in result.list_errors:
            log.warning("scan could not list", extra={"error": err})
        return result

    def register(self, m: Metrics) -> None:
        m.gauge(
            "gpu_admission_scan_findings",
            "Objects of the last background scan with a finding, by rule and result (fail, warn, skip, error)",
            lambda: [((("rule", r), ("result", res)), float(n)) for (r, res), n in sorted(self._per_rule().items())],
        )
        m.gauge(
            "gpu_admission_scan_objects",
            "Objects judged by the last background scan, by verdict; unreadable ones (skipped) separately",
            self._objects,
        )
        m.gauge(
            "gpu_admission_scan_last_finished_timestamp_seconds",
            "When the last background scan finished (Unix time; 0: none yet)",
            lambda: [((), self.last_finished)],
        )
        m.gauge(
            "gpu_admission_scan_runs_total",
            "Background scans finished and failed",
            lambda: [((("outcome", "finished"),), float(self.runs)), ((("outcome", "failed"),), float(self.failures))],
            kind="counter",
        )

    def _per_rule(self) -> dict[tuple[str, str], int]:
        return self.last.per_rule() if self.last is not None else {}

    def _objects(self) -> list[tuple[tuple[tuple[str, str], ...], float]]:
        if self.last is None:
            return []
        out: list[tuple[tuple[tuple[str, str], ...], float]] = [
            ((("verdict", v),), float(n)) for v, n in self.last.counts().items()
        ]
        out.append(((("verdict", "unreadable"),), float(len(self.last.unreadable))))
        return out

    def details(self) -> dict[str, Any]:
        r = self.last
        base: dict[str, Any] = {"interval": self.interval, "runs": self.runs, "failures": self.failures}
        if r is not None:
            base.update(lastFinished=self.last_finished, objects=len(r.results), verdicts=r.counts(),
                        unreadable=[u.describe() for u in r.unreadable[:20]], listErrors=r.list_errors,
                        requests=r.requests, seconds=round(r.seconds, 3), policyHash=r.policy_hash)  # fmt: skip
        return base
