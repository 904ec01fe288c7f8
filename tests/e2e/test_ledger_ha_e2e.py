"""Issue #18 with two replicas on one real control plane: the ledger counts each job once across both.

Two `gpu-admission serve` processes watch the same cluster and elect the ledger's leader with a real Lease
(cluster/lease.py). Only one is registered as the webhook (the API server calls one URL), so the other is the
replica that did *not* admit the jobs: exactly the case whose follow-ups used to have `uid: null`.

1. B (not registered) starts first and leads; A (registered, admits every job) follows as a standby.
2. Job one: B counts it (follow-up under the Job's own uid, the admission being A's), A does not; the sum of
   `gpu_admission_ledger_jobs_total` over both is 1.
3. B is killed (SIGKILL: no release): A takes over within the lease duration (15 s) plus one retry (2 s), and
   counts job two under its admission's uid. The sum over both stays one per job.
The measured take-over time is printed (docs/deploy.md "Ledger leader").
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from cluster.lease import LEASE_DURATION, RETRY_PERIOD
from tests.e2e import placement as pl
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP, Webhook, render
from tests.serverproc import ServerProcess, make_certs, written_records

pytestmark = pytest.mark.e2e

WINDOW = 20
LEASE = f"{NAMESPACE}/ledger-ha-e2e"
ARGS = ("--ledger-window", str(WINDOW), "--ledger-lease", LEASE)


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with pl.racks({"rack-a": 2, "rack-b": 2}) as cluster:
        yield cluster


def replica(cp: ControlPlane, wh_tls: Any) -> ServerProcess:
    """A second serve process like the webhook's, not registered: it only watches."""
    return ServerProcess(
        "--policy-configmap",
        f"{NAMESPACE}/{POLICY_CONFIGMAP}",
        *ARGS,
        tls_dir=wh_tls,
        nodes=None,
        kubeconfig=str(cp.kubeconfig),
    )


def leader(srv: ServerProcess) -> bool:
    with srv.client(timeout=5) as c:
        return bool(c.get("/readyz").json()["ledgerLeader"]["leader"])


def wait_leader(srv: ServerProcess, timeout: float) -> float:
    start = time.monotonic()
    while not leader(srv):
        assert time.monotonic() - start < timeout, f"no leader after {timeout:.0f} s: {srv.log_tail()}"
        time.sleep(0.1)
    return time.monotonic() - start


def jobs_total(srv: ServerProcess, ns: str) -> float:
    with srv.client(timeout=5) as c:
        text = c.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gpu_admission_ledger_jobs_total{") and f'namespace="{ns}"' in line
    )


def outcomes(srv: ServerProcess) -> dict[str, dict[str, Any]]:
    recs = written_records(srv.audit)
    return {r["group"]: r for r in recs if r.get("record") == "outcome"}


def run_job(cp: ControlPlane, ns: str, name: str) -> str:
    """A 2-pod job, bound; its group."""
    r = cp.kubectl("apply", "-n", ns, "-f", "-", input=pl.indexed_job(name, 2, 8), check=False)
    assert r.returncode == 0, r.stderr
    placed = pl.wait_placed(cp, ns, name, 2)
    assert placed["pending"] == 0, placed
    return f"{ns}/batch.kubernetes.io/job-name={name}"


def wait_standby(srv: ServerProcess, n: int, timeout: float = 30.0) -> None:
    """Until the replica holds `n` jobs as final while not leader (its tracker gauge, what="standby")."""
    deadline = time.monotonic() + timeout
    while True:
        with srv.client(timeout=5) as c:
            text = c.get("/metrics").text
        held = [float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(STANDBY_GAUGE)]
        if held and held[0] >= n:
            return
        assert time.monotonic() < deadline, f"the standby did not finalise {n} job(s): {held}"
        time.sleep(0.2)


STANDBY_GAUGE = 'gpu_admission_ledger_tracker{what="standby"}'


def wait_renewed_after(cp: ControlPlane, wall: float, timeout: float = 30.0) -> None:
    """Until the Lease's renewTime is later than the wall-clock time `wall`."""
    ns, _, name = LEASE.partition("/")
    after = datetime.fromtimestamp(wall, tz=UTC)
    deadline = time.monotonic() + timeout
    while True:
        renewed = cp.get_json("lease", name, "-n", ns)["spec"].get("renewTime") or ""
        if renewed and datetime.fromisoformat(renewed.replace("Z", "+00:00")) > after:
            return
        assert time.monotonic() < deadline, f"the leader did not renew after {after} (renewTime {renewed!r})"
        time.sleep(0.2)


def wait_outcome(srv: ServerProcess, group: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while group not in outcomes(srv):
        assert time.monotonic() < deadline, f"no follow-up for {group}"
        time.sleep(0.2)
    return outcomes(srv)[group]


def test_two_replicas_count_each_job_once_and_the_survivor_takes_over(cp: ControlPlane) -> None:
    # B first, so that it leads; then A, registered as the webhook. B needs the server's namespace (its Lease)
    # and the policy ConfigMap, which the webhook's set-up would apply.
    kept = [d for d in render(cp) if d["kind"] == "Namespace" or d["metadata"]["name"] == POLICY_CONFIGMAP]
    cp.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": kept})
    tls_dir = make_certs(cp.workdir / "ha-tls")
    b = replica(cp, tls_dir)
    try:
        wait_leader(b, timeout=10)
        wh = Webhook(cp, *ARGS)
        try:
            a = wh.server
            assert a is not None
            time.sleep(2 * RETRY_PERIOD)
            assert leader(b) and not leader(a)
            with a.client(timeout=5) as c:
                print("standby /readyz ledgerLeader:", json.dumps(c.get("/readyz").json()["ledgerLeader"]))
            ns = pl.new_namespace(cp, "ledger-ha")

            one = run_job(cp, ns, "one")
            rec = wait_outcome(b, one)
            job_uid = cp.get_json("job", "one", "-n", ns)["metadata"]["uid"]
            # B never saw the admission (A did): the follow-up is under the Job's uid, not null
            assert (rec["uid"], rec["admissionUid"], rec["jobUid"], rec["outcome"]) == (
                job_uid,
                None,
                job_uid,
                "one-domain",
            )
            assert any(r.get("group") == one and "verdict" in r for r in wh.audit_records())  # A's decisions
            time.sleep(1)
            assert one not in outcomes(a)
            assert (jobs_total(a, ns), jobs_total(b, ns)) == (0.0, 1.0)
            # A replica taking over re-reports what it finalised after the old leader's last renewal (the documented
            # window of a crash, docs/deploy.md): kill B only once A holds job one as final (standby) and B has
            # renewed after that. (Waiting only for a renewal after the job's own time raced: A finalises up to a
            # sweep and a watch delay after B.)
            wait_standby(a, 1)
            wait_renewed_after(cp, time.time())

            killed = time.monotonic()
            b.stop(signal.SIGKILL)
            wait_leader(a, timeout=LEASE_DURATION + RETRY_PERIOD + 10)
            took = time.monotonic() - killed
            print(f"take-over after SIGKILL of the leader: {took:.2f} s")
            assert took <= LEASE_DURATION + RETRY_PERIOD + 3, took

            two = run_job(cp, ns, "two")
            rec = wait_outcome(a, two)
            decided = {r["uid"] for r in wh.audit_records() if r.get("group") == two and "verdict" in r}
            assert rec["admissionUid"] in decided and rec["uid"] == rec["admissionUid"]
            assert rec["jobUid"] == cp.get_json("job", "two", "-n", ns)["metadata"]["uid"]
            assert one not in outcomes(a)  # job one was final before the take-over: not re-reported
            assert jobs_total(a, ns) == 1.0  # B's 1 (job one) + A's 1 (job two): each job once

            # A graceful stop hands the Lease over at once: a new B takes over within a few retry periods.
            b = replica(cp, tls_dir)
            time.sleep(2 * RETRY_PERIOD)
            assert not leader(b)
            stopped = time.monotonic()
            wh.stop_server()
            wait_leader(b, timeout=LEASE_DURATION)
            took = time.monotonic() - stopped
            print(f"take-over after SIGTERM of the leader: {took:.2f} s (includes its shutdown)")
            assert took < LEASE_DURATION - 5, took
        finally:
            wh.close()
    finally:
        b.stop()
