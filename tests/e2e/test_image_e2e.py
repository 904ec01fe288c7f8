"""The container image, built for real (scripts/image/build.sh: buildah from a Debian base made by
mmdebstrap, cached) and run with `buildah run --isolation chroot`: it runs as the non-root user the
Deployment expects, `--version` and `serve` start from it, and the e2e smoke passes against the server in
the image, registered with the real API server from deploy/'s webhook configurations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import ControlPlane
from tests.e2e.image import NONROOT, Image, ImageError, ImageServer, build_image
from tests.e2e.webhook import Webhook, probe_mutation

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def image() -> Image:
    try:
        return build_image()
    except ImageError as exc:  # fail, never skip: CI must not pass without the image
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def container(image: Image) -> Iterator[str]:
    name = image.container()
    try:
        yield name
    finally:
        image.remove(name)


def test_runs_as_the_nonroot_user(image: Image, container: str) -> None:
    config = json.loads(image.buildah("inspect", "--type", "image", image.ref).stdout)["OCIv1"]["config"]
    assert config["User"] == f"{NONROOT}:{NONROOT}"
    assert config["Entrypoint"] == ["gpu-admission"]
    assert image.run(container, "id", "-u").strip() == str(NONROOT)
    # Nothing but /tmp is writable for that user (the Deployment also mounts the root filesystem read-only).
    assert image.run(container, "sh", "-c", "test -w /opt/venv || echo read-only").strip() == "read-only"


def test_version_and_no_build_tooling(image: Image, container: str) -> None:
    version = (ROOT / "pyproject.toml").read_text().split('version = "', 1)[1].split('"', 1)[0]
    assert image.run(container, "gpu-admission", "--version") == f"gpu-admission {version}\n"
    probe = "import importlib.util as u; print([m for m in ('pip', 'setuptools') if u.find_spec(m)])"
    assert image.run(container, "python", "-c", probe).strip() == "[]"


class ImageWebhook(Webhook):
    """tests.e2e.webhook.Webhook with the server running inside the image instead of on the host."""

    def __init__(self, cp: ControlPlane, image: Image) -> None:
        self.image = image
        self.image_server: ImageServer | None = None
        self.ready_seconds = 0.0
        super().__init__(cp)

    def start_server(self, *extra: str) -> None:
        self.image_server = ImageServer(
            self.image, self.tls, self.port,
            "--policy-configmap", "gpu-admission/gpu-admission-policy", "--audit-stdout",
            kubeconfig=Path(self.cp.kubeconfig),
        )  # fmt: skip
        self.ready_seconds = self.image_server.wait_ready(timeout=90)

    def stop_server(self) -> None:
        if self.image_server is not None:
            self.image_server.stop()
            self.image_server = None


def test_e2e_smoke_against_the_server_in_the_image(control_plane: ControlPlane, image: Image, namespace: str) -> None:
    cp = control_plane
    hook = ImageWebhook(cp, image)  # registers deploy/'s webhooks with a URL to it; waits until they take effect
    try:
        print(f"server in the image ready after {hook.ready_seconds:.2f} s")
        mutated = json.loads(probe_mutation(cp).stdout)
        assert "podAffinity" in mutated["spec"]["affinity"]  # a training pod got its same-rack constraint
        too_big = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "too-big", "namespace": namespace},
            "spec": {
                "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "16"}}}]
            },
        }
        denied = cp.kubectl("create", "-f", "-", input=too_big, check=False)
        assert denied.returncode != 0
        assert 'admission webhook "pods.admit.gpu-admission.io" denied the request: gpu-request-fits' in denied.stderr
        assert hook.image_server is not None
        assert "gpu-request-fits" in hook.image_server.log_tail(400)  # the audit record, on the server's stdout
    finally:
        hook.close()
