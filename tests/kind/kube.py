"""kubectl against the kind cluster that scripts/kind-e2e.sh made (GPU_ADMISSION_KIND_KUBECONFIG).

The kind tests talk to the cluster through kubectl only, exactly as a user would. `Kind.kubectl` has the same
signature as `tests.e2e.cluster.ControlPlane.kubectl`, so helpers written for one (tests.e2e.crds) work with
the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

ENV_KUBECONFIG = "GPU_ADMISSION_KIND_KUBECONFIG"
ENV_IMAGE = "GPU_ADMISSION_KIND_IMAGE"
DEFAULT_IMAGE = "gpu-admission:e2e"

T = TypeVar("T")


class KubectlError(AssertionError):
    def __init__(self, args: tuple[str, ...], result: subprocess.CompletedProcess[str]) -> None:
        self.result = result
        super().__init__(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")


class Kind:
    def __init__(self, kubeconfig: str | os.PathLike[str], kubectl: str | None = None) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.kubectl_path = kubectl or os.environ.get("KUBECTL", "kubectl")
        # A discovery cache of our own: a shared one may predate the CRDs the tests install.
        self._cache = tempfile.TemporaryDirectory(prefix="gpu-admission-kind-kubectl-")

    def close(self) -> None:
        self._cache.cleanup()

    def kubectl(
        self,
        *args: str,
        input: str | Mapping[str, Any] | list[Any] | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the kind cluster; ``input`` is text or a JSON-able object for ``-f -``."""
        stdin = input if isinstance(input, str) or input is None else json.dumps(input)
        cmd = [self.kubectl_path, f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self._cache.name}", *args]
        try:
            result = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"kubectl {' '.join(args)} timed out after {timeout:.0f}s") from exc
        if check and result.returncode != 0:
            raise KubectlError(args, result)
        return result

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


def wait_until(predicate: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def objects(stdout: str) -> list[dict[str, Any]]:
    """The objects kubectl printed with ``-o json``: one object, a List, or several objects in a row."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    text = stdout.strip()
    pos = 0
    while pos < len(text):
        obj, end = decoder.raw_decode(text, pos)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if isinstance(obj, dict) and obj.get("kind") == "List":
            out.extend(i for i in obj.get("items", []) if isinstance(i, dict))
        elif isinstance(obj, dict):
            out.append(obj)
    return out


def probe_pod(namespace: str, name: str) -> dict[str, Any]:
    """A GPU pod every namespace it is checked in would deny twice (typo key, two time-sliced units). Its
    securityContext passes Pod Security "restricted", which our own namespace enforces."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"gpu-admission.io/workload": "inference"},
            "annotations": {"gpu-admission.io/gpu-memry": "10Gi"},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu.shared": "2"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ]
        },
    }
