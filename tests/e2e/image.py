"""The container image for tests: built by scripts/image/build.sh (buildah, cached), run with `buildah run
--isolation chroot` (host network, so the server listens on loopback like the host process does).

    python -m tests.e2e.image      # build (or reuse) the image and print its size and start-to-ready times

No pytest dependency, so the measurement above is a plain script.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "image" / "build.sh"
NONROOT = 65532  # the Dockerfile's USER and the Deployment's runAsUser


class ImageError(RuntimeError):
    """The image could not be built or run; the message says why."""


@dataclass(frozen=True)
class Image:
    ref: str
    size_bytes: int
    buildah_args: tuple[str, ...]  # the image store's flags

    def buildah(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["buildah", *self.buildah_args, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise ImageError(f"buildah {' '.join(args[:2])} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc

    def container(self) -> str:
        """A new working container of the image (remove it with `remove`)."""
        return self.buildah("from", "--pull-never", self.ref).stdout.strip().splitlines()[-1]

    def remove(self, container: str) -> None:
        self.buildah("rm", container, check=False)

    @staticmethod
    def _run_args(container: str, argv: tuple[str, ...], mounts: dict[Path, str] | None) -> list[str]:
        volumes = [f"-v={src}:{dst}:ro" for src, dst in (mounts or {}).items()]
        return ["run", "--isolation", "chroot", *volumes, container, "--", *argv]

    def run_cmd(self, container: str, *argv: str, mounts: dict[Path, str] | None = None) -> list[str]:
        """The argv that runs `argv` in the container, as the image's user, with read-only bind mounts."""
        return ["buildah", *self.buildah_args, *self._run_args(container, argv, mounts)]

    def run(self, container: str, *argv: str) -> str:
        """Run `argv` in the container to completion; its stdout (ImageError if it fails)."""
        return self.buildah(*self._run_args(container, argv, None), timeout=120).stdout


def build_image(timeout: float = 3600) -> Image:
    """scripts/image/build.sh: instant when cached; installs buildah/mmdebstrap and builds otherwise."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise ImageError(f"building the image failed ({BUILD_SCRIPT}, exit {proc.returncode}):\n{tail}")
    ref = proc.stdout.strip().splitlines()[-1]
    cache = Path(os.environ.get("GPU_ADMISSION_CACHE") or Path.home() / ".cache" / "gpu-admission")
    stamp = cache / "images" / f"gpu-admission-{ref.rpartition(':')[2]}.env"
    values = dict(shlex.split(line)[0].split("=", 1) for line in stamp.read_text().splitlines() if "=" in line)
    return Image(ref=ref, size_bytes=int(values["SIZE_BYTES"]), buildah_args=tuple(values["BUILDAH_ARGS"].split()))


def readable_copy(source: Path, into: Path) -> Path:
    """A copy of a file or directory owned by the image's user (keys are 0600 and owned by root here)."""
    target = into / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)
    for path in [target, *target.rglob("*")] if target.is_dir() else [target]:
        os.chown(path, NONROOT, NONROOT)
    return target


class ImageServer:
    """`gpu-admission serve` inside the image on 127.0.0.1:`port`, TLS files (and a kubeconfig) mounted."""

    def __init__(self, image: Image, tls_dir: Path, port: int, *serve_args: str, kubeconfig: Path | None = None):
        self.image = image
        self.port = port
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu-admission-image-"))
        os.chmod(self.scratch, 0o755)
        mounts = {readable_copy(tls_dir, self.scratch): "/tls"}
        args = ["--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key"]
        if kubeconfig is not None:
            mounts[readable_copy(kubeconfig, self.scratch)] = "/kube/config"
            args += ["--kubeconfig", "/kube/config"]
        else:
            args += ["--no-kube"]
        self.container = image.container()
        self.log = open(self.scratch / "serve.log", "wb")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            image.run_cmd(
                self.container,
                "gpu-admission", "serve", "--host", "127.0.0.1", "--port", str(port), *args, *serve_args,
                mounts=mounts,
            ),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.ca = tls_dir / "ca-bundle.crt"

    def wait_ready(self, timeout: float = 60.0, path: str = "/readyz") -> float:
        """Seconds from the `buildah run` to the first 200 on `path`."""
        context = ssl.create_default_context(cafile=str(self.ca))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ImageError(f"serve in the image exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.port}{path}", context=context, timeout=1) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise ImageError(f"serve in the image not ready after {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        self.log.flush()
        return "\n".join((self.scratch / "serve.log").read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        self.image.remove(self.container)
        shutil.rmtree(self.scratch, ignore_errors=True)


def _host_ready_seconds(tls_dir: Path, port: int) -> float:
    from tests.serverproc import ServerProcess

    started = time.monotonic()
    server = ServerProcess(tls_dir=tls_dir, nodes=None, port=port)
    server.wait_ready(timeout=60, path="/readyz")
    seconds = time.monotonic() - started
    server.stop()
    return seconds


def main(argv: list[str] | None = None) -> int:
    from tests.serverproc import free_port, make_certs

    runs = int((argv or sys.argv[1:] or ["5"])[0])
    started = time.monotonic()
    image = build_image()
    print(f"image {image.ref}: {image.size_bytes} bytes ({image.size_bytes / 2**20:.1f} MiB), "
          f"build or cache check {time.monotonic() - started:.1f} s")  # fmt: skip
    tls = make_certs(Path(tempfile.mkdtemp(prefix="gpu-admission-measure-")) / "tls")
    in_image, on_host = [], []
    for _ in range(runs):  # interleaved, so both see the same machine load
        server = ImageServer(image, tls, free_port())
        try:
            in_image.append(server.wait_ready())
        finally:
            server.stop()
        on_host.append(_host_ready_seconds(tls, free_port()))
    print(f"start to ready (/readyz 200), {runs} runs each, medians: in the image {statistics.median(in_image):.2f} s "
          f"(buildah run included; min {min(in_image):.2f}), host process {statistics.median(on_host):.2f} s "
          f"(min {min(on_host):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
