"""The ledger's leader election (cluster/lease.py) against the real kube-apiserver + etcd: no fake API server.

Short timings (lease 3 s, renew deadline 2 s, retry 0.25 s) so that take-overs happen within a test.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.kubeclient import KubeClient
from cluster.lease import Elector, LeaseConfig, Record
from tests.e2e.cluster import ControlPlane
from tests.serverproc import free_port

pytestmark = pytest.mark.e2e

FAST = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.25}


@pytest.fixture
def client(control_plane: ControlPlane) -> Iterator[KubeClient]:
    with KubeClient.from_config(control_plane.kubeconfig, timeout=5.0) as c:
        yield c


def _config(namespace: str, name: str, who: str, **timings: float) -> LeaseConfig:
    return LeaseConfig(namespace, name, who, **{**FAST, **timings})


def _lease(client: KubeClient, namespace: str, name: str) -> Record:
    return Record.of(client.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"))


def _watch_both(a: Elector, b: Elector, until: threading.Event, seen: list[str]) -> threading.Thread:
    """Poll both electors' `leader` every millisecond; note any moment both claim it."""

    def poll() -> None:
        while not until.is_set():
            if a.leader and b.leader:
                seen.append(f"both leaders at {time.monotonic():.3f}")
            time.sleep(0.001)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    return t


def test_two_electors_one_wins_and_renews(client: KubeClient, namespace: str) -> None:
    a = Elector(client, _config(namespace, "ledger", "a"))
    b = Elector(client, _config(namespace, "ledger", "b"))
    assert a.step() is True  # creates the Lease
    assert b.step() is False
    assert b.holder == "a" and not b.leader
    first = _lease(client, namespace, "ledger")
    assert (first.holder, first.duration, first.transitions) == ("a", 3.0, 0)
    time.sleep(0.05)
    assert a.step() is True  # renews: a newer renewTime, same holder, no transition
    again = _lease(client, namespace, "ledger")
    assert again.holder == "a" and again.transitions == 0
    assert again.renewed is not None and first.renewed is not None and again.renewed > first.renewed
    assert again.version != first.version
    for _ in range(5):  # b keeps trying within the lease duration: never takes it while a renews
        assert b.step() is False
        assert a.step() is True


def test_leader_stops_renewing_other_takes_over_within_lease_duration(client: KubeClient, namespace: str) -> None:
    changes: list[tuple[bool, Record | None]] = []
    a = Elector(client, _config(namespace, "ledger", "a"))
    b = Elector(
        client, _config(namespace, "ledger", "b"), on_change=lambda leader, prev: changes.append((leader, prev))
    )
    assert a.step() is True
    stopped = time.monotonic()  # a's last successful renewal began before this
    seen: list[str] = []
    done = threading.Event()
    watcher = _watch_both(a, b, done, seen)
    b.start()
    try:
        deadline = time.monotonic() + 10
        while not b.leader and time.monotonic() < deadline:
            time.sleep(0.01)
        took = time.monotonic() - stopped
    finally:
        b.stop()
        done.set()
        watcher.join()
    assert b.leader, "b never took over"
    # b first sees a's record at its first attempt and waits a whole lease duration from then; at most one
    # retry period more until its next attempt.
    assert 3.0 <= took <= 3.0 + 0.25 + 1.0, took
    assert not a.leader  # a's renew deadline (2 s) passed long before
    assert seen == []
    lease = _lease(client, namespace, "ledger")
    assert lease.holder == "b" and lease.transitions == 1
    assert changes and changes[0][0] is True and changes[0][1] is not None and changes[0][1].holder == "a"
    assert a.step() is False and a.holder == "b"  # a comes back: b holds it


def test_release_hands_over_within_one_retry_period(client: KubeClient, namespace: str) -> None:
    a = Elector(client, _config(namespace, "ledger", "a"))
    b = Elector(client, _config(namespace, "ledger", "b"))
    a.start()
    deadline = time.monotonic() + 5
    while not a.leader and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.leader
    b.start()
    try:
        time.sleep(0.6)
        assert not b.leader
        released_at = time.monotonic()
        assert a.release() is True
        assert not a.leader
        assert _lease(client, namespace, "ledger").holder == ""
        while not b.leader and time.monotonic() < released_at + 5:
            time.sleep(0.01)
        took = time.monotonic() - released_at
    finally:
        b.stop()
    assert b.leader and took <= 0.25 + 0.5, took
    assert b.release() is True
    assert a.release() is False  # not leader: nothing to give back, no error
    assert a.errors == 0 and b.errors == 0


class _RaceAfterGet:
    """The real client, except that right after one GET of the Lease another elector runs a whole attempt:
    the update that follows carries a stale resourceVersion."""

    def __init__(self, client: KubeClient, rival: Elector) -> None:
        self.client, self.rival, self.armed = client, rival, True

    def get(self, path: str, **params: Any) -> Any:
        try:
            return self.client.get(path, **params)
        finally:  # also after a 404: the rival creates the Lease between our read and our create
            if self.armed:
                self.armed = False
                assert self.rival.step() is True

    def update(self, path: str, body: Any, **params: Any) -> Any:
        return self.client.update(path, body, **params)

    def create(self, path: str, body: Any, **params: Any) -> Any:
        return self.client.create(path, body, **params)


def test_conflicting_update_is_lost_cleanly(client: KubeClient, namespace: str) -> None:
    # A released Lease (no holder): both b and c may take it, and both read the same resourceVersion.
    a = Elector(client, _config(namespace, "ledger", "a"))
    assert a.step() is True and a.release() is True
    c = Elector(client, _config(namespace, "ledger", "c"))
    b = Elector(_RaceAfterGet(client, c), _config(namespace, "ledger", "b"))
    assert b.step() is False  # its update got 409 Conflict: c wrote in between
    assert not b.leader and b.errors == 0 and c.leader
    assert _lease(client, namespace, "ledger").holder == "c"
    assert b.step() is False and b.holder == "c"


def test_create_race_is_lost_cleanly(client: KubeClient, namespace: str) -> None:
    # No Lease yet: b reads 404, c creates the Lease in between, b's create gets 409 AlreadyExists.
    c = Elector(client, _config(namespace, "ledger", "c"))
    b = Elector(_RaceAfterGet(client, c), _config(namespace, "ledger", "b"))
    assert b.step() is False
    assert not b.leader and b.errors == 0 and c.leader
    assert _lease(client, namespace, "ledger").holder == "c"


def test_api_errors_never_crash_or_make_two_leaders(
    control_plane: ControlPlane, client: KubeClient, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    # An API server that does not answer: connection refused on a closed port.
    dead_config = dataclasses.replace(client.config, server=f"https://127.0.0.1:{free_port()}")
    with KubeClient(dead_config, timeout=1.0) as dead:
        lost = Elector(dead, _config(namespace, "ledger", "lost"))
        assert lost.step() is False
        assert lost.errors == 1 and lost.last_error and "no response" in lost.last_error
        assert lost.status()["leader"] is False

        # A leader cut off from the API server keeps leading only until its renew deadline, and the other
        # takes over only after the lease duration: never both.
        a = Elector(client, _config(namespace, "ledger", "a"))
        b = Elector(client, _config(namespace, "ledger", "b"))
        assert a.step() is True
        a.client = dead
        seen: list[str] = []
        done = threading.Event()
        watcher = _watch_both(a, b, done, seen)
        a.start()
        b.start()
        try:
            deadline = time.monotonic() + 10
            while not b.leader and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            a.stop()
            b.stop()
            done.set()
            watcher.join()
        assert b.leader and not a.leader
        assert a.errors >= 2 and seen == []

    # A Lease in a namespace that does not exist: 404 on create, an error, not leader; the loop goes on. The
    # same error again is counted but not logged again (until a minute passed).
    gone = Elector(client, _config(f"missing-{uuid.uuid4().hex[:6]}", "ledger", "x"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpu-admission.lease"):
        assert gone.step() is False and gone.step() is False
    assert gone.errors == 2 and gone.last_error and "HTTP 404" in gone.last_error
    assert len([r for r in caplog.records if r.getMessage() == "lease attempt failed"]) == 1


def test_lease_written_by_someone_else_is_read_safely(client: KubeClient, namespace: str) -> None:
    # A Lease with fields missing or odd (written by another tool): read without error; its holder keeps it
    # for the default duration from when we first saw it.
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    client.create(path, {"metadata": {"name": "ledger"}, "spec": {"holderIdentity": "someone-else"}})
    b = Elector(client, _config(namespace, "ledger", "b"))
    assert b.step() is False and b.holder == "someone-else" and b.errors == 0


def test_lease_config_refuses_bad_timings() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseConfig("ns", "n", "me", lease_duration=10, renew_deadline=10, retry_period=2)
    with pytest.raises(ValueError, match="whole seconds"):
        LeaseConfig("ns", "n", "me", lease_duration=10.5)
    with pytest.raises(ValueError, match="must not be empty"):
        LeaseConfig("ns", "", "me")
