"""The checklist as Kyverno and Gatekeeper policies (tests/bench/peerpolicies/), judged by the real peers on a
real API server: a handful of golden inputs, each peer's verdict and mutation (issue #19).

Each peer runs on a control plane of its own (its CRDs, namespace and webhooks stay out of the other e2e
modules). The expected verdict per peer is written below; where it is not gpu-admission's (the golden case's
`expect.allowed`) the reason is written beside it, and docs/benchmarks.md ("Expressiveness") carries the
same table. Skipped, with the reason printed, when a peer is not built (scripts/peers/build.sh).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bench import peerinstall as peers
from tests.e2e import crds
from tests.e2e.cluster import DEFAULT_NODES_FILE, ControlPlane, build_binaries

pytestmark = pytest.mark.e2e

CASES_DIR = Path(__file__).resolve().parent.parent / "cases"
PRIORITY_CLASSES = ("training-normal", "training-low")
RACK = "topology.kubernetes.io/rack"


@dataclass(frozen=True)
class Want:
    """A peer's expected answer to one golden input: denied by rule `deny` (its id opens the message), or
    allowed with the listed affinity kinds added; `why` when that differs from gpu-admission's verdict."""

    deny: str = ""
    adds: tuple[str, ...] = ()
    why: str = ""


BOTH_DENY_RACK = Want(deny="training-same-rack")
# case -> peer -> expected answer
CASES: dict[str, dict[str, Want]] = {
    "rules/training-same-rack-denied-bare-pod-no-identity": {"gatekeeper": BOTH_DENY_RACK, "kyverno": BOTH_DENY_RACK},
    "rules/training-same-rack-bare-pod-own-job-label": {
        "gatekeeper": Want(adds=("nodeAffinity", "podAffinity")),
        "kyverno": Want(adds=("nodeAffinity", "podAffinity")),
    },
    "rules/training-elastic-shrink-pet-nnodes": {
        "gatekeeper": Want(deny="training-elastic-shrink"),
        "kyverno": Want(deny="training-elastic-shrink"),
    },
    "rules/training-elastic-shrink-pet-nnodes-fixed": {"gatekeeper": Want(), "kyverno": Want()},
    "rules/online-no-timeslice-shared-resource": {
        "gatekeeper": Want(deny="online-no-timeslice"),
        "kyverno": Want(deny="online-no-timeslice"),
    },
    "rules/gpu-admission-annotations-typo": {
        "gatekeeper": Want(deny="gpu-admission-annotations"),
        "kyverno": Want(deny="gpu-admission-annotations"),
    },
    "rules/gpu-admission-annotations-valid": {"gatekeeper": Want(), "kyverno": Want()},
    "elasticity/hpa-below-policy-warm-pool": {
        "gatekeeper": Want(deny="inference-warm-pool"),
        "kyverno": Want(deny="inference-warm-pool"),
    },
    "mutations/training-pool-pinned-to-timesliced": {
        "gatekeeper": Want(
            adds=("nodeAffinity",),
            why="an Assign pathTest only sees below its location: the nodeSelector pin is not seen, and the "
            "whole-card affinity added contradicts it (the pod can never schedule)",
        ),
        "kyverno": Want(),
    },
    "rules/gpu-request-fits-too-many-gpus": {
        "gatekeeper": Want(why="the largest node's GPU count is inventory, not policy: not expressed"),
        "kyverno": Want(why="the largest node's GPU count is inventory, not policy: not expressed"),
    },
}


def load(case: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CASES_DIR / f"{case}.yaml").read_text())
    return data


@pytest.fixture(scope="module", params=sorted(peers.PEERS))
def peer(request: pytest.FixtureRequest) -> Iterator[peers.Peer]:
    cls = peers.PEERS[request.param]
    reason = cls.missing()
    if reason:
        print(f"SKIP {reason}")
        pytest.skip(reason)
    cp = ControlPlane(build_binaries()).start()
    p: peers.Peer | None = None
    try:
        cp.create_nodes(DEFAULT_NODES_FILE)
        crds.install(cp)
        items = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": n},
                  "value": 1000} for n in PRIORITY_CLASSES]  # fmt: skip
        cp.kubectl("apply", "-f", "-", input=peers.as_list(items))
        p = cls(cp).start()
        p.activate()
        p.wait_effective()
        yield p
    finally:
        if p is not None:
            p.stop()
        cp.stop()


def _namespace(cp: ControlPlane, name: str) -> None:
    cp.kubectl("create", "namespace", name, check=False)


def _affinity_added(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, ...]:
    spec_before = before.get("spec", {})
    spec_after = after.get("spec", {})
    was = spec_before.get("affinity", {}) or {}
    now = spec_after.get("affinity", {}) or {}
    return tuple(sorted(k for k in now if k not in was))


def _dry_run(p: peers.Peer, obj: dict[str, Any], timeout: float = 30.0, want_denied: bool = False) -> tuple[str, Any]:
    """(denial, created object); retried while a referential peer's cache may still lag (want_denied)."""
    deadline = time.monotonic() + timeout
    while True:
        r = p.cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=obj, check=False)
        denial = "" if r.returncode == 0 else (r.stderr or r.stdout)
        if denial or not want_denied or time.monotonic() > deadline:
            return denial, (json.loads(r.stdout) if r.returncode == 0 else None)
        time.sleep(1.0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_peer_policy_verdict(peer: peers.Peer, case: str) -> None:
    want = CASES[case][peer.name]
    data = load(case)
    obj = copy.deepcopy(data["input"])
    ns = obj["metadata"].get("namespace", "default")
    _namespace(peer.cp, ns)
    for related in data.get("related", []):
        peer.cp.kubectl("apply", "-f", "-", input=related)
    ours_allowed = bool(data["expect"]["allowed"])
    denial, created = _dry_run(peer, obj, want_denied=bool(want.deny))
    if want.deny:
        assert denial, f"{peer.name} allowed {case}; expected a {want.deny} denial"
        assert f"{want.deny}:" in denial, denial
        assert peer.webhook_marker in denial, denial
    else:
        assert not denial, f"{peer.name} denied {case}: {denial}"
        assert _affinity_added(obj, created) == tuple(sorted(want.adds)), created.get("spec", {}).get("affinity")
        if "podAffinity" in want.adds:
            (term,) = created["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert term["topologyKey"] == RACK
            job = obj["metadata"]["labels"]["gpu-admission.io/job"]
            assert job in json.dumps(term["labelSelector"]), term  # the API server resolved matchLabelKeys
    if (not want.deny) != ours_allowed:
        assert want.why, f"{case}: {peer.name} differs from gpu-admission's verdict without a reason written"
