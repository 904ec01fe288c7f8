"""Smoke e2e on the oldest Kubernetes the product supports (v1.33.13 with etcd v3.5.35; `make test` runs this
module with K8S_VERSION / ETCD_VERSION set to it, docs/controlplane.md "Versions"). It also runs in the main
e2e run, on the default release.

Small on purpose (CI budget): the deploy manifests the real API server must accept (matchConditions compile
against that release's Pod schema), the webhook's main effect through the real scheduler, a denial, and the
DRA watch staying off where resource.k8s.io/v1 is not served (1.33) and on where it is."""

from __future__ import annotations

import os

import pytest

from tests.e2e.cluster import ControlPlane, pinned_versions
from tests.e2e.test_webhook import (  # re-collected here: the same tests, on this module's control plane
    test_denial_shows_rule_id_and_message,
    test_deploy_manifests_are_accepted_by_the_real_api_server,
    test_training_job_lands_in_one_rack_and_without_the_webhook_it_does_not,
)
from tests.e2e.webhook import Webhook

pytestmark = pytest.mark.e2e

__all__ = [
    "test_denial_shows_rule_id_and_message",
    "test_deploy_manifests_are_accepted_by_the_real_api_server",
    "test_training_job_lands_in_one_rack_and_without_the_webhook_it_does_not",
]


def test_the_server_is_the_pinned_release(control_plane: ControlPlane) -> None:
    want = pinned_versions()["kubernetes"]
    assert control_plane.server_version()["gitVersion"] == want, os.environ.get("K8S_VERSION")


def test_dra_is_watched_exactly_where_it_is_served(control_plane: ControlPlane, webhook: Webhook) -> None:
    """resource.k8s.io/v1 exists from 1.34: before, the webhook judges device-plugin resources only and says so
    in /readyz; after, it reads the cluster's DeviceClasses and ResourceSlices."""
    minor = int(control_plane.server_version()["minor"].rstrip("+"))
    assert webhook.server is not None
    with webhook.server.client() as c:
        dra = c.get("/readyz").json()["dra"]
    assert dra["served"] is (minor >= 34), dra
    if minor < 34:
        assert dra["note"] == "resource.k8s.io/v1 not served", dra


def test_native_mutations_exactly_where_served(control_plane: ControlPlane) -> None:
    """MutatingAdmissionPolicy (admissionregistration.k8s.io/v1) is served from 1.36: `policy native` writes
    them for a policy that fills the mutations in, and `--no-mutations` the ValidatingAdmissionPolicies alone,
    which every supported release accepts (docs/policy.md, "Native policies")."""
    from policies import native
    from tests import test_golden as golden

    cp = control_plane
    minor = int(cp.server_version()["minor"].rstrip("+"))
    served = cp.kubectl("api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name").stdout.split()
    assert ("mutatingadmissionpolicies.admissionregistration.k8s.io" in served) is (minor >= 36), served
    policy = golden.policy_for({"gpuNodes": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}})
    for mutations in (False, True) if minor >= 36 else (False,):
        objects = native.generate(policy, mutations=mutations)
        assert any(o["kind"] == "MutatingAdmissionPolicy" for o in objects) is mutations
        p = cp.kubectl(
            "apply", "--dry-run=server", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": objects}
        )
        created = [line for line in p.stdout.splitlines() if line.endswith("created (server dry run)")]
        assert len(created) == len(objects), p.stdout + p.stderr
