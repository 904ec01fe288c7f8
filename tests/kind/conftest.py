"""Fixtures for tests/kind: the webhook deployed from deploy/ in a kind cluster (scripts/kind-e2e.sh).

These tests need a Docker engine (kind runs its node in a container) and GPU_ADMISSION_KIND_KUBECONFIG, the
kubeconfig of the cluster that `make kind-e2e` made. Without either, every test here is SKIPPED with the
reason: this is the only skip in the project, and it is there because the machines that run `make test` and
CI have no Docker engine. With both present nothing is skipped: a cluster that does not answer, a webhook
that is not deployed or fake GPU nodes that are missing FAIL the tests.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e import crds
from tests.kind import nodes
from tests.kind.kube import ENV_KUBECONFIG, Kind, wait_until

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples"
MIN_MINOR = 30  # webhook matchConditions are GA from Kubernetes 1.30 (docs/deploy.md)

#: The PriorityClasses the examples name (a Pod naming a missing class is refused before any webhook runs).
PRIORITY_CLASSES = {"training-high": 100000, "training-normal": 50000, "batch-low": 1000}


def docker_problem() -> str | None:
    """None when a Docker engine answers `docker info`, else the first line of what docker said."""
    try:
        r = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        return "docker: command not found"
    except subprocess.TimeoutExpired:
        return "docker info did not answer within 30s"
    if r.returncode == 0:
        return None
    lines = [line.strip() for line in (r.stderr + "\n" + r.stdout).splitlines() if line.strip()]
    return lines[0] if lines else f"docker info exited {r.returncode}"


def skip_reason() -> str | None:
    problem = docker_problem()
    if problem is not None:
        return f"kind tests need a Docker engine: {problem}"
    if not os.environ.get(ENV_KUBECONFIG):
        return f"set {ENV_KUBECONFIG} (make kind-e2e does)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if not mine:
        return
    reason = skip_reason()
    for item in mine:
        item.add_marker(pytest.mark.kind)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def example_namespaces() -> list[str]:
    found = set()
    for f in EXAMPLES.glob("*/*.yaml"):
        for d in yaml.safe_load_all(f.read_text(encoding="utf-8")):
            if isinstance(d, dict) and d.get("kind") != "List" and (d.get("metadata") or {}).get("namespace"):
                found.add(str(d["metadata"]["namespace"]))
    return sorted(found)


@pytest.fixture(scope="session")
def kind() -> Iterator[Kind]:
    """The kind cluster, answering, at Kubernetes 1.30 or newer."""
    path = os.environ[ENV_KUBECONFIG]
    if not Path(path).is_file():
        pytest.fail(f"{ENV_KUBECONFIG}={path}: no such file (make kind-e2e writes it)", pytrace=False)
    k = Kind(path)
    try:
        r = k.kubectl("get", "--raw", "/readyz", check=False, timeout=30)
        if r.returncode != 0 or r.stdout.strip() != "ok":
            pytest.fail(f"the kind cluster does not answer: {(r.stderr or r.stdout).strip()}", pytrace=False)
        version = json.loads(k.kubectl("get", "--raw", "/version").stdout)
        minor = int(str(version.get("minor", "0")).rstrip("+") or 0)
        if minor < MIN_MINOR:
            pytest.fail(
                f"Kubernetes {version.get('gitVersion')} is too old: gpu-admission needs 1.{MIN_MINOR}+", pytrace=False
            )
        yield k
    finally:
        k.close()


@pytest.fixture(scope="session")
def cluster(kind: Kind) -> Kind:
    """The cluster ready for the examples: fake GPU nodes present, the workload CRDs served, the examples'
    namespaces (with their default ServiceAccounts) and PriorityClasses created, and the webhook answering
    with the GPU inventory of the fake nodes."""
    want = nodes.node_names()
    have = {n["metadata"]["name"] for n in kind.get_json("nodes")["items"]}
    missing = [n for n in want if n not in have]
    if missing:
        pytest.fail(
            f"fake GPU nodes missing: {missing} (scripts/kind-e2e.sh creates them: "
            f"python -m tests.kind.nodes create --kubeconfig $KUBECONFIG)",
            pytrace=False,
        )
    crds.install(kind)
    namespaces = example_namespaces()
    kind.kubectl(
        "apply",
        "-f",
        "-",
        input={
            "apiVersion": "v1",
            "kind": "List",
            "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces]
            + [
                {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": n}, "value": v}
                for n, v in PRIORITY_CLASSES.items()
            ],
        },
    )
    for ns in namespaces:  # a Pod is refused until its namespace's default ServiceAccount exists

        def has_sa(ns: str = ns) -> bool:
            return kind.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0

        wait_until(has_sa, timeout=60, what=f"ServiceAccount {ns}/default")
    wait_effective(kind)
    return kind


def wait_effective(kind: Kind, timeout: float = 120.0) -> None:
    """Dry-run the MIG example until it comes back with the MIG slice: then the API server calls the webhook
    through its Service with the injected caBundle, and the webhook has seen the fake nodes."""
    probe = EXAMPLES / "inference" / "mig-slice-pod.yaml"
    last = ""

    def mutated() -> bool:
        nonlocal last
        r = kind.kubectl("create", "--dry-run=server", "-o", "json", "-f", str(probe), check=False)
        last = (r.stderr or r.stdout).strip()[-500:]
        return r.returncode == 0 and "nvidia.com/mig-1g.10gb" in r.stdout

    try:
        wait_until(mutated, timeout=timeout, what="the webhook to mutate examples/inference/mig-slice-pod.yaml")
    except AssertionError as exc:
        pytest.fail(f"{exc}; last answer: {last}", pytrace=False)
