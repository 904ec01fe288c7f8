"""Run a real `gpu-admission serve` process on loopback over TLS, for contract tests and benchmarks."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
NODES = ROOT / "examples" / "cluster" / "nodes.yaml"
# serve imports and builds its inventory in ~1 s on a free core, but took 16-26 s at load 26-32 on the
# shared 2 cores (session 4), 23-30 s at load 26 and 43-62 s (certificates included) at nice 19 and load 21
# (session 10): 60 s was within reach. A liveness bound, not a speed assertion: a server that exits is seen at
# once (proc.poll), so only one that hangs waits it out.
READY_TIMEOUT = 300.0


def _die_with_parent() -> None:
    """In the child before exec: a test run that dies must not leave servers behind (Linux prctl)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child_setup(nofile: int | None) -> Any:
    def setup() -> None:
        _die_with_parent()
        if nofile is not None:  # a container's open-file limit, soft = hard, so the server cannot raise it
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return setup


def written_records(path: Path) -> list[dict[str, Any]]:
    """The audit records the server has finished writing. The log is read while the server appends to it, and a
    write can be seen half done (the kernel copies it page by page): a last line with no newline yet is not a
    record yet. Found on a busy machine: `JSONDecodeError: Unterminated string` on such a line."""
    data = path.read_bytes() if path.exists() else b""
    done = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in done.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_certs(directory: Path) -> Path:
    """A CA and serving certificate from our own `certs init`, with an IP SAN for loopback."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "certs",
            "init",
            "--service",
            "gpu-admission",
            "--namespace",
            "gpu-admission",
            "--out",
            str(directory),
            "--ip",
            "127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return directory


class ServerProcess:
    def __init__(
        self,
        *extra: str,
        tls_dir: Path | None = None,
        nodes: Path | None = NODES,
        kubeconfig: str | None = None,
        env: Any = None,
        port: int | None = None,
        nofile: int | None = None,
        ready_timeout: float = READY_TIMEOUT,
        cwd: Path | None = None,
    ):
        """`cwd`: the directory `python -m webhook` runs in, which comes first on its sys.path (another source
        tree's, with that tree on PYTHONPATH too, runs that tree's server)."""
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-srv-"))
        self.tls = tls_dir or make_certs(self.tmp / "tls")
        self.port = port or free_port()
        self.audit = self.tmp / "audit.log"
        args = [
            sys.executable,
            "-m",
            "webhook",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--tls-cert",
            str(self.tls / "tls.crt"),
            "--tls-key",
            str(self.tls / "tls.key"),
            "--audit-file",
            str(self.audit),
        ]
        args += ["--kubeconfig", kubeconfig] if kubeconfig else ["--no-kube"]
        if nodes is not None:
            args += ["--nodes", str(nodes)]
        self.stderr = open(self.tmp / "stderr.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*args, *extra],
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            env=env or os.environ.copy(),
            preexec_fn=_child_setup(nofile),
            cwd=cwd,
        )
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca = str(self.tls / "ca-bundle.crt")
        self.wait_ready(ready_timeout)

    def client(self, **kw: Any) -> httpx.Client:
        verify = ssl.create_default_context(cafile=self.ca)
        return httpx.Client(base_url=self.url, verify=verify, timeout=kw.pop("timeout", 30.0), **kw)

    def wait_ready(self, timeout: float = READY_TIMEOUT, path: str = "/healthz") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with self.client(timeout=max(0.1, min(5.0, deadline - time.monotonic()))) as c:
                    if c.get(path).status_code == 200:
                        return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"serve not healthy after {timeout}s: {self.log_tail()}")

    def memory_mib(self) -> tuple[float, float]:
        """(resident now, peak resident) of the server process, in MiB."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def log_tail(self, n: int = 20) -> str:
        self.stderr.flush()
        lines = (self.tmp / "stderr.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        return int(self.proc.returncode)


def review(obj: Any, uid: str = "uid-1", operation: str = "CREATE", dry_run: bool = False) -> dict[str, Any]:
    meta = obj.get("metadata", {}) if isinstance(obj, dict) else {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": obj.get("kind", "") if isinstance(obj, dict) else ""},
            "operation": operation,
            "namespace": meta.get("namespace", "default"),
            "name": meta.get("name", ""),
            "userInfo": {"username": "alice", "groups": ["system:authenticated", "ml-team"]},
            "object": obj if operation != "DELETE" else None,
            "oldObject": obj if operation in ("DELETE", "UPDATE") else None,
            "dryRun": dry_run,
        },
    }
