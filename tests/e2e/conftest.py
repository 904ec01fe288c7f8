"""Fixtures for the end-to-end tests: one real control plane per session, one namespace per test.

The control plane is built from Go modules by scripts/controlplane/build.sh on first use (many minutes on
a cold cache, about a second afterwards). When it cannot be built or started the fixture FAILS with the
reason instead of skipping: CI must never pass silently without having run these tests.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import DEFAULT_NODES_FILE, ControlPlane, ControlPlaneError, build_binaries
from tests.e2e.webhook import Webhook


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A started ControlPlane with the nodes of examples/cluster/nodes.yaml."""
    problem = ""
    cp: ControlPlane | None = None
    try:
        cp = ControlPlane(build_binaries())
        cp.start()
        cp.create_nodes(DEFAULT_NODES_FILE)
    except ControlPlaneError as exc:
        problem = str(exc)
        if cp is not None:
            cp.stop()
    if problem or cp is None:  # fail (outside the except block: no chained traceback), never skip
        pytest.fail(f"the e2e control plane is unavailable: {problem}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def webhook(control_plane: ControlPlane) -> Iterator[Webhook]:
    """gpu-admission serve registered with the API server from deploy/'s configurations, per test module
    (unregistered at the end, so other modules see a cluster without it)."""
    wh = Webhook(control_plane)
    try:
        yield wh
    finally:
        wh.close()


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace, torn down after the test so that its pods free their nodes' resources."""
    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug or 'e2e'}-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        _teardown_namespace(control_plane, name)


def _teardown_namespace(cp: ControlPlane, name: str, timeout: float = 30.0) -> None:
    # No kubelet: a bound pod never finishes a graceful deletion, and it keeps its node's GPUs in the
    # scheduler's books until it is gone. Mark the namespace terminating first (nothing new can be created in
    # it, so controllers cannot replace pods), then force-delete pods until none is left.
    try:
        cp.kubectl("delete", "namespace", name, "--wait=false", check=False)
        deadline = time.monotonic() + timeout
        while True:
            cp.kubectl(
                "delete", "pods", "--all", "-n", name, "--grace-period=0", "--force", "--wait=false", check=False
            )
            left = cp.kubectl("get", "pods", "-n", name, "-o", "name", check=False).stdout.split()
            if not left:
                return
            if time.monotonic() > deadline:
                print(f"warning: namespace {name} still has pods after {timeout:.0f}s: {left}", file=sys.stderr)
                return
            time.sleep(0.2)
    except ControlPlaneError as exc:  # the control plane itself is gone; the session fixture reports it
        print(f"warning: cannot tear down namespace {name}: {exc}", file=sys.stderr)
