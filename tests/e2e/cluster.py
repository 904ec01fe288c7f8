"""A real Kubernetes control plane on loopback for end-to-end tests and benchmarks.

Runs etcd, kube-apiserver, kube-scheduler and kube-controller-manager built from Go modules by
``scripts/controlplane/build.sh`` (no kubelet, no container runtime): pods are admitted, mutated, validated
and bound to fake GPU nodes exactly as on a real cluster, and then stay ``Pending`` forever.

This module deliberately has no pytest dependency so that benchmarks and ad-hoc scripts can reuse it::

    from tests.e2e.cluster import ControlPlane, build_binaries

    with ControlPlane(build_binaries()) as cp:
        cp.create_nodes("examples/cluster/nodes.yaml")
        print(cp.kubectl("get", "nodes").stdout)

Every process runs in its own process group and is killed by ``stop()``, at interpreter exit (atexit) and,
on Linux, by the kernel if the Python process dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import copy
import ctypes
import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "controlplane" / "build.sh"
DEFAULT_NODES_FILE = REPO_ROOT / "examples" / "cluster" / "nodes.yaml"

#: Controllers run by kube-controller-manager. Deliberately NOT the node-lifecycle controller (it would mark
#: the kubelet-less fake nodes NotReady, taint them and evict their pods) nor anything needing a kubelet,
#: cloud provider or node IPAM.
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "cronjob-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    # Fills the built-in view/edit/admin roles from ClusterRoles labelled aggregate-to-*: without it a
    # test of who may do what through those roles would prove nothing (deploy/base/exceptions-rbac.yaml).
    "clusterrole-aggregation-controller",
)

#: What Kubernetes 1.37 needs switched on for the product's DRA and Workload-aware tests (verified against
#: k8s.io/kubernetes@v1.37.2 pkg/features/kube_features.go): DRA is GA and locked on since 1.35 and its
#: extended-resource mapping (DRAExtendedResource) GA in 1.37, so they need nothing; the Workload / PodGroup API
#: (scheduling.k8s.io/v1beta1) is beta but off by default (GenericWorkload), and beta APIs must also be enabled
#: through --runtime-config; PodGroup topology constraints are alpha (TopologyAwareWorkloadScheduling).
#: WorkloadWithJob (alpha: the Job controller gangs every Indexed Job with parallelism == completions > 1) stays
#: off: it changes how every placement test's Job is scheduled.
WORKLOAD_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
WORKLOAD_API = "scheduling.k8s.io/v1beta1=true"
#: Controllers of newer releases: resourceclaim-controller makes a pod's ResourceClaims from its templates
#: (DRA, on by default since 1.34); podgroup-protection-controller keeps a PodGroup while pods use it.
CONTROLLERS_SINCE: dict[int, tuple[str, ...]] = {
    34: ("resourceclaim-controller",),
    37: ("podgroup-protection-controller",),
}

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
ADMIN_USER = "admin"
ADMIN_GROUP = "system:masters"

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A control-plane component failed to build, start or answer; the message says which and why."""


class KubectlError(ControlPlaneError):
    """kubectl exited non-zero (only raised when ``check=True``)."""

    def __init__(self, args: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        self.cmd = list(args)
        self.result = result
        self.returncode = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr
        detail = (result.stderr or result.stdout or "").strip()
        super().__init__(f"kubectl {' '.join(args)} exited {result.returncode}: {detail}")


# ---------------------------------------------------------------------------------------------------------
# Building / locating binaries


#: The newest release the proxy serves, with the etcd it is built against: what the DRA and Workload-API tests
#: need (resource.k8s.io/v1 with DeviceClass extended resources, scheduling.k8s.io/v1beta1), whatever the
#: default of build.sh is.
LATEST = ("v1.37.2", "v3.7.3")


def build_binaries(*, force: bool = False, timeout: float = 3600.0, release: tuple[str, str] | None = None) -> Path:
    """Run scripts/controlplane/build.sh (instant when cached) and return the bin dir it prints; `release`
    (Kubernetes, etcd) instead of build.sh's default, e.g. LATEST.

    ``GPU_ADMISSION_CONTROLPLANE_BIN`` overrides the build with an existing directory of binaries (not for a
    `release`: those tests need that release).
    Raises ControlPlaneError with the tail of the build output when the build fails.
    """
    override = os.environ.get("GPU_ADMISSION_CONTROLPLANE_BIN") if release is None else None
    if override:
        bin_dir = Path(override)
        missing = [
            b
            for b in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
            if not (bin_dir / b).is_file()
        ]
        if missing:
            raise ControlPlaneError(f"GPU_ADMISSION_CONTROLPLANE_BIN={override} lacks {', '.join(missing)}")
        return bin_dir
    if not BUILD_SCRIPT.is_file():
        raise ControlPlaneError(f"build script not found: {BUILD_SCRIPT}")
    cmd = ["bash", str(BUILD_SCRIPT), *(["--force"] if force else [])]
    env = {**os.environ, "K8S_VERSION": release[0], "ETCD_VERSION": release[1]} if release else None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ControlPlaneError(f"{BUILD_SCRIPT} did not finish within {timeout:.0f}s") from exc
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-30:])
        raise ControlPlaneError(f"building the control plane failed ({BUILD_SCRIPT}, exit {proc.returncode}):\n{tail}")
    lines = proc.stdout.strip().splitlines()
    if not lines or not Path(lines[-1]).is_dir():
        raise ControlPlaneError(f"{BUILD_SCRIPT} printed no bin dir; stdout was {proc.stdout!r}")
    return Path(lines[-1])


def pinned_versions() -> dict[str, str]:
    """The versions build.sh pins (honouring the same K8S_VERSION / ETCD_VERSION overrides), e.g.
    ``{"kubernetes": "v1.33.13", "etcd": "v3.5.35"}``."""
    text = BUILD_SCRIPT.read_text()
    out: dict[str, str] = {}
    for key, var in (("kubernetes", "K8S_VERSION"), ("etcd", "ETCD_VERSION")):
        m = re.search(rf'^{var}="\$\{{{var}:-(v[0-9.]+)\}}"', text, re.MULTILINE)
        if not m:
            raise ControlPlaneError(f"cannot find the pinned {var} in {BUILD_SCRIPT}")
        out[key] = os.environ.get(var) or m.group(1)
    return out


def binary_minor(path: Path) -> int:
    """The minor version a kube-apiserver binary reports (`--version` prints "Kubernetes v1.37.2")."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ControlPlaneError(f"{path} --version: {exc}") from None
    m = re.search(r"v1\.(\d+)\.", out)
    if not m:
        raise ControlPlaneError(f"{path} --version printed no version: {out.strip()!r}")
    return int(m.group(1))


#: kubectl's supported version skew: one minor older or newer than the API server.
KUBECTL_SKEW = 1


def kubectl_minor(path: str) -> int | None:
    """The minor version of a kubectl client (`version --client -o json`), None when it does not say."""
    try:
        out = subprocess.run(
            [path, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
        minor = json.loads(out)["clientVersion"]["minor"]
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return None
    digits = re.match(r"\d+", str(minor))
    return int(digits.group()) if digits else None


def find_kubectl(server_minor: int | None = None, bin_dir: Path | None = None) -> str:
    """The kubectl to use: ``$GPU_ADMISSION_KUBECTL``; else the one build.sh builds beside the server binaries
    (same release); else a versioned client (``kubectl.1.<minor>``, the Google Cloud SDK ships them beside its
    ``kubectl``) or the plain ``kubectl`` within kubectl's supported skew of one minor. Anything further apart
    is refused rather than used (docs/controlplane.md)."""
    env = os.environ.get("GPU_ADMISSION_KUBECTL")
    if env:
        return env
    if bin_dir is not None and os.access(bin_dir / "kubectl", os.X_OK):
        return str(bin_dir / "kubectl")
    if server_minor is None:
        server_minor = int(pinned_versions()["kubernetes"].split(".")[1])
    plain = shutil.which("kubectl")
    dirs = [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    if plain:
        dirs += [Path(plain).parent, Path(plain).resolve().parent]
    for minor in (server_minor, server_minor - KUBECTL_SKEW, server_minor + KUBECTL_SKEW):
        for d in dirs:
            c = d / f"kubectl.1.{minor}"
            if os.access(c, os.X_OK):
                return str(c)
    if plain:
        got = kubectl_minor(plain)
        if got is not None and abs(got - server_minor) <= KUBECTL_SKEW:
            return plain
    raise ControlPlaneError(
        f"no kubectl within one minor of the v1.{server_minor} server (run {BUILD_SCRIPT.relative_to(REPO_ROOT)}, "
        "which builds the release's kubectl, or set GPU_ADMISSION_KUBECTL to one)"
    )


# ---------------------------------------------------------------------------------------------------------
# Small helpers


def free_ports(n: int) -> list[int]:
    """n distinct free loopback TCP ports (all held open together while choosing, so they differ)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_until(predicate: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy; raise ControlPlaneError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except ControlPlaneError as exc:  # e.g. kubectl failing transiently
            last_exc = exc
        if time.monotonic() >= deadline:
            hint = f" (last error: {last_exc})" if last_exc else ""
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}{hint}")
        time.sleep(interval)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data.splitlines()[-lines:])


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------------------
# PKI


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


_NO_KEY_USAGE = dict(
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


def _make_ca(
    common_name: str, not_before: dt.datetime, not_after: dt.datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, **_NO_KEY_USAGE), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_leaf(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: Sequence[x509.GeneralName] = (),
) -> tuple[bytes, bytes]:
    """(certificate PEM, PKCS#8 key PEM) signed by ``ca``."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(ca_cert.not_valid_before_utc)
        .not_valid_after(ca_cert.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, **_NO_KEY_USAGE), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return _pem_cert(builder.sign(ca_key, hashes.SHA256())), _pem_key(key)


@dataclass(frozen=True)
class Pki:
    """Files the control plane uses, all under ``dir``: the cluster CA (``ca.crt``/``ca.key``: it signs the
    API server's serving certificate and the admin client certificate, CN=admin O=system:masters), the
    front-proxy CA and the API server's proxy client pair (request-header authentication, as kubeadm sets
    it up), the service-account RSA key pair and a static token file with the same admin identity."""

    dir: Path
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    front_proxy_ca_cert: Path
    proxy_client_cert: Path
    proxy_client_key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    admin_token: str

    @classmethod
    def generate(cls, directory: Path) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        not_before = _now() - dt.timedelta(hours=1)
        not_after = _now() + dt.timedelta(days=30)
        ca = _make_ca("gpu-admission-e2e-ca", not_before, not_after)
        front_proxy_ca = _make_ca("gpu-admission-e2e-front-proxy-ca", not_before, not_after)
        serving = _make_leaf(
            ca,
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
            ExtendedKeyUsageOID.SERVER_AUTH,
            [
                x509.DNSName(n)
                for n in (
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                )
            ]
            + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", SERVICE_IP)],
        )
        admin = _make_leaf(
            ca,
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, ADMIN_GROUP),
                    x509.NameAttribute(NameOID.COMMON_NAME, ADMIN_USER),
                ]
            ),
            ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        proxy_client = _make_leaf(
            front_proxy_ca,
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "front-proxy-client")]),
            ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        token = base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")

        files = {
            "ca.crt": _pem_cert(ca[1]),
            "ca.key": _pem_key(ca[0]),
            "apiserver.crt": serving[0],
            "apiserver.key": serving[1],
            "admin.crt": admin[0],
            "admin.key": admin[1],
            "front-proxy-ca.crt": _pem_cert(front_proxy_ca[1]),
            "front-proxy-client.crt": proxy_client[0],
            "front-proxy-client.key": proxy_client[1],
            "sa.key": _pem_key(sa),
            "sa.pub": sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            # static token file: token,user,uid,"group1,group2"
            "tokens.csv": f'{token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n'.encode(),
        }
        for name, data in files.items():
            p = directory / name
            p.write_bytes(data)
            p.chmod(0o600)
        return cls(
            dir=directory,
            ca_cert=directory / "ca.crt",
            ca_key=directory / "ca.key",
            serving_cert=directory / "apiserver.crt",
            serving_key=directory / "apiserver.key",
            admin_cert=directory / "admin.crt",
            admin_key=directory / "admin.key",
            front_proxy_ca_cert=directory / "front-proxy-ca.crt",
            proxy_client_cert=directory / "front-proxy-client.crt",
            proxy_client_key=directory / "front-proxy-client.key",
            sa_key=directory / "sa.key",
            sa_pub=directory / "sa.pub",
            token_file=directory / "tokens.csv",
            admin_token=token,
        )


# ---------------------------------------------------------------------------------------------------------
# Processes


@dataclass
class _Component:
    name: str
    cmd: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    log_handle: IO[bytes] | None = field(default=None, repr=False)


class _PortConflict(ControlPlaneError):
    pass


_LIVE: set[ControlPlane] = set()


@atexit.register
def _stop_all() -> None:
    for cp in list(_LIVE):
        with contextlib.suppress(Exception):
            cp.stop()


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager on free loopback ports.

    Attributes after ``start()``: ``server`` (https URL), ``kubeconfig`` (admin kubeconfig path, user in group
    system:masters via a client certificate and a static bearer token), ``pki`` (CA and keys), ``logs``
    (component name -> log file), ``workdir``, ``startup_seconds``, ``kubectl_path``.
    """

    def __init__(
        self,
        bin_dir: str | os.PathLike[str],
        *,
        kubectl: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        controllers: Iterable[str] = DEFAULT_CONTROLLERS,
        scheduler_config: Mapping[str, Any] | None = None,
        extra_apiserver_args: Sequence[str] = (),
        feature_gates: str = "",
        timeout: float = 60.0,
        keep_workdir: bool | None = None,
        verbosity: int = 1,
    ) -> None:
        self.bin_dir = Path(bin_dir)
        for b in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
            if not os.access(self.bin_dir / b, os.X_OK):
                raise ControlPlaneError(
                    f"{self.bin_dir / b} is missing or not executable (run {BUILD_SCRIPT.relative_to(REPO_ROOT)})"
                )
        self.minor = binary_minor(self.bin_dir / "kube-apiserver")
        self.kubectl_path = kubectl or find_kubectl(self.minor, self.bin_dir)
        self._workdir_arg = Path(workdir) if workdir else None
        extra = [c for since, names in sorted(CONTROLLERS_SINCE.items()) if self.minor >= since for c in names]
        self.controllers = tuple(dict.fromkeys([*controllers, *extra]))
        self.scheduler_overrides = dict(scheduler_config or {})
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.feature_gates = feature_gates  # more gates for every component ("WorkloadWithJob=true")
        self.timeout = timeout
        if keep_workdir is None:
            keep_workdir = os.environ.get("GPU_ADMISSION_E2E_KEEP", "") not in ("", "0")
        self.keep_workdir = keep_workdir
        self.verbosity = verbosity

        self.workdir: Path = Path()
        self.server = ""
        self.kubeconfig = Path()
        self.pki: Pki | None = None
        self.logs: dict[str, Path] = {}
        self.ports: dict[str, int] = {}
        self.startup_seconds = 0.0
        self.phase_seconds: dict[str, float] = {}
        self._components: list[_Component] = []
        self._owns_workdir = False
        self._started = False

    # -- lifecycle ----------------------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> ControlPlane:
        """Start every component and wait until each is ready. Retries with new ports when one was taken
        between choosing and binding; raises ControlPlaneError (with the failing log's tail) otherwise."""
        if self._started:
            return self
        t0 = time.monotonic()
        _LIVE.add(self)
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
                break
            except _PortConflict:
                self._kill_all()
                if attempt == attempts:
                    self.stop(keep_logs=True)
                    raise
            except BaseException:
                self.stop(keep_logs=True)
                raise
        self.startup_seconds = time.monotonic() - t0
        self._started = True
        return self

    def _start_once(self) -> None:
        self._components = []
        if self._owns_workdir and self.workdir.is_dir():
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._workdir_arg:
            self.workdir = self._workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._owns_workdir = False
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="gpu-admission-cp-"))
            self._owns_workdir = True
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.logs = {}
        self.phase_seconds = {}
        mark = time.monotonic()

        names = ("etcd-client", "etcd-peer", "apiserver", "scheduler", "controller-manager")
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        etcd_url = f"http://127.0.0.1:{self.ports['etcd-client']}"
        peer_url = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._launch(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        # The PKI (RSA key generation included) is made while etcd boots.
        self.pki = pki = Pki.generate(self.workdir / "pki")
        self.server = f"https://127.0.0.1:{self.ports['apiserver']}"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self._write_kubeconfig(self.kubeconfig)
        self._wait_http("etcd", f"{etcd_url}/health", lambda body: b'"health":"true"' in body, timeout=20)
        self.phase_seconds["etcd"] = time.monotonic() - mark

        self._launch(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['apiserver']}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--token-auth-file={pki.token_file}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.proxy_client_cert}",
                f"--proxy-client-key-file={pki.proxy_client_key}",
                "--endpoint-reconciler-type=none",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true",
                "--profiling=false",
                f"--v={self.verbosity}",
                *self._gates("apiserver"),
                *self.extra_apiserver_args,
            ],
        )
        self._wait_http(
            "kube-apiserver",
            f"{self.server}/readyz",
            lambda body: body.strip() == b"ok",
            timeout=self.timeout,
            client_cert=True,
        )
        self.phase_seconds["kube-apiserver"] = time.monotonic() - mark

        sched_cfg: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig), "qps": 500, "burst": 1000},
            "leaderElection": {"leaderElect": False},
        }
        sched_cfg.update(self.scheduler_overrides)
        sched_cfg_path = self.workdir / "scheduler-config.yaml"
        sched_cfg_path.write_text(yaml.safe_dump(sched_cfg, sort_keys=False))
        delegated = [f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}"]
        self._launch(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--config={sched_cfg_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                *delegated,
                *self._gates("scheduler"),
                f"--v={self.verbosity}",
            ],
        )
        self._launch(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                *delegated,
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
                f"--cert-dir={self.workdir / 'controller-manager-certs'}",
                "--leader-elect=false",
                f"--controllers={','.join(self.controllers)}",
                *self._gates("controller-manager"),
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                "--use-service-account-credentials=false",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                "--concurrent-job-syncs=10",
                f"--v={self.verbosity}",
            ],
        )
        self._wait_http(
            "kube-scheduler",
            f"https://127.0.0.1:{self.ports['scheduler']}/readyz",
            lambda body: body.strip() == b"ok",
            timeout=self.timeout,
        )
        self.phase_seconds["kube-scheduler"] = time.monotonic() - mark
        self._wait_http(
            "kube-controller-manager",
            f"https://127.0.0.1:{self.ports['controller-manager']}/healthz",
            lambda body: body.strip() == b"ok",
            timeout=self.timeout,
        )
        self.phase_seconds["kube-controller-manager"] = time.monotonic() - mark

    def _gates(self, component: str) -> list[str]:
        """Feature gates (and, for the API server, API versions) the release needs switched on."""
        gates = [g for g in (WORKLOAD_GATES if self.minor >= 37 else "", self.feature_gates) if g]
        out = [f"--feature-gates={','.join(gates)}"] if gates else []
        if component == "apiserver" and self.minor >= 37:
            out.append(f"--runtime-config={WORKLOAD_API}")
        return out

    def _launch(self, name: str, cmd: list[str]) -> None:
        log = self.workdir / "logs" / f"{name}.log"
        comp = _Component(name=name, cmd=cmd, log=log)
        comp.log_handle = log.open("ab")
        comp.log_handle.write(("$ " + " ".join(cmd) + "\n").encode())
        comp.log_handle.flush()
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
        try:
            comp.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=comp.log_handle,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            comp.log_handle.close()
            raise ControlPlaneError(f"cannot start {name} ({cmd[0]}): {exc}") from exc
        self._components.append(comp)
        self.logs[name] = log

    def _component(self, name: str) -> _Component:
        for c in self._components:
            if c.name == name:
                return c
        raise KeyError(name)

    def _failure(self, name: str, reason: str) -> ControlPlaneError:
        comp = self._component(name)
        tail = _tail(comp.log)
        msg = f"{name} {reason}; log {comp.log}, last lines:\n{tail}"
        if "address already in use" in tail:
            return _PortConflict(msg)
        return ControlPlaneError(msg)

    def _wait_http(
        self, name: str, url: str, ok: Callable[[bytes], bool], *, timeout: float, client_cert: bool = False
    ) -> None:
        comp = self._component(name)
        ctx = ssl.create_default_context()
        if client_cert and self.pki:
            ctx.load_verify_locations(cafile=str(self.pki.ca_cert))
            ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        else:  # scheduler / controller-manager serve a self-signed certificate
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            assert comp.proc is not None
            rc = comp.proc.poll()
            if rc is not None:
                raise self._failure(name, f"exited with code {rc} before becoming ready")
            try:
                with opener.open(url, timeout=2) as resp:
                    body = resp.read()
                if ok(body):
                    return
                last = f"answered {body[:200]!r}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:300]!r}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            if time.monotonic() >= deadline:
                raise self._failure(name, f"not ready after {timeout:.0f}s at {url} ({last})")
            time.sleep(0.05)

    def _write_kubeconfig(self, path: Path) -> None:
        assert self.pki is not None

        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": self.server, "certificate-authority-data": b64(self.pki.ca_cert)}}
            ],
            "users": [
                {
                    "name": ADMIN_USER,
                    "user": {
                        "client-certificate-data": b64(self.pki.admin_cert),
                        "client-key-data": b64(self.pki.admin_key),
                    },
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": ADMIN_USER}}],
            "current-context": "e2e",
        }
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        path.chmod(0o600)

    def _kill_all(self) -> None:
        comps = [c for c in reversed(self._components) if c.proc is not None]
        for c in comps:
            assert c.proc is not None
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for c in comps:
            assert c.proc is not None
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(timeout=5)
        for c in self._components:
            if c.log_handle:
                c.log_handle.close()
                c.log_handle = None
        self._components = []

    def stop(self, *, keep_logs: bool = False) -> None:
        """Kill every component (SIGTERM, then SIGKILL after 5s) and remove the work dir unless kept
        (``keep_workdir=True`` or ``GPU_ADMISSION_E2E_KEEP=1``); ``keep_logs`` removes all but ``logs/``
        (used when start() fails, so that the log named in the error still exists). Idempotent."""
        self._kill_all()
        _LIVE.discard(self)
        self._started = False
        if not (self._owns_workdir and self.workdir.is_dir()):
            return
        if self.keep_workdir:
            print(f"control plane work dir kept: {self.workdir}", file=sys.stderr)
        elif keep_logs:
            for child in self.workdir.iterdir():
                if child.name != "logs":
                    if child.is_dir():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise ControlPlaneError (with the log tail) when a component has died since start."""
        for c in self._components:
            if c.proc is not None and (rc := c.proc.poll()) is not None:
                raise self._failure(c.name, f"died with exit code {rc}")

    def log_tail(self, name: str, lines: int = 40) -> str:
        return _tail(self.logs[name], lines)

    # -- kubectl ------------------------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | Mapping[str, Any] | list[Any] | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster. ``input`` may be text or a JSON-able object (sent as
        JSON on stdin, e.g. with ``-f -``). Raises KubectlError when ``check`` and kubectl fails."""
        if not self.server:
            raise ControlPlaneError("control plane not started")
        stdin = input if isinstance(input, str) or input is None else json.dumps(input)
        cmd = [
            self.kubectl_path,
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.workdir / 'kubectl-cache'}",
            *args,
        ]
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        try:
            result = subprocess.run(
                cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ControlPlaneError(f"kubectl {' '.join(args)} timed out after {timeout:.0f}s") from exc
        if check and result.returncode != 0:
            raise KubectlError(args, result)
        return result

    def get_json(self, *args: str) -> Any:
        """``kubectl get <args> -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def server_version(self) -> dict[str, Any]:
        """The API server's /version document (gitVersion, major, minor, …)."""
        version: dict[str, Any] = json.loads(self.kubectl("get", "--raw", "/version").stdout)
        return version

    # -- nodes and pods -----------------------------------------------------------------------------------

    def create_nodes(
        self,
        path_or_objects: str | os.PathLike[str] | Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        mark_ready: bool = True,
    ) -> list[str]:
        """Create Node objects including their ``status`` (capacity, allocatable). Accepts a YAML/JSON file
        (one or many documents, ``kind: List`` allowed), one object or a list of objects. With
        ``mark_ready`` a ``Ready=True`` condition is added to nodes that carry no conditions (there is no
        kubelet to report one). Returns the node names.

        The API server keeps ``status`` on a Node create (checked against what was stored); should a
        future release drop it, the status is written through the ``/status`` subresource instead."""
        nodes = [copy.deepcopy(dict(n)) for n in _load_objects(path_or_objects)]
        bad = [n.get("kind") for n in nodes if n.get("kind") != "Node"]
        if bad:
            raise ControlPlaneError(f"create_nodes expects only Node objects, got kinds {bad}")
        if not nodes:
            return []
        stamp = _now().strftime("%Y-%m-%dT%H:%M:%SZ")
        for n in nodes:
            n.setdefault("apiVersion", "v1")
            status = n.setdefault("status", {})
            if mark_ready and not status.get("conditions"):
                status["conditions"] = [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "fake node: no kubelet runs in the e2e control plane",
                        "lastHeartbeatTime": stamp,
                        "lastTransitionTime": stamp,
                    }
                ]
        self.kubectl("create", "-f", "-", "-o", "name", input={"apiVersion": "v1", "kind": "List", "items": nodes})
        names = [n["metadata"]["name"] for n in nodes]
        stored = {n["metadata"]["name"]: n for n in self.get_json("nodes", *names)["items"]}
        for n in nodes:
            name = n["metadata"]["name"]
            want = n.get("status", {})
            have = stored.get(name, {}).get("status", {})
            if any(not _same_quantities(want.get(k, {}), have.get(k, {})) for k in ("capacity", "allocatable")):
                self.kubectl(
                    "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": want})
                )
        return names

    def wait_for_scheduled(self, namespace: str, pod: str, timeout: float = 30.0) -> str:
        """Wait until the scheduler binds the pod; return its node name."""

        def bound() -> str | None:
            obj = self.get_json("pod", pod, "-n", namespace)
            return str(obj["spec"].get("nodeName") or "") or None

        return wait_until(bound, timeout=timeout, what=f"pod {namespace}/{pod} to be scheduled")

    def wait_for_pods(
        self, namespace: str, selector: str, count: int, *, scheduled: bool = False, timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` pods match the label selector (and are bound when ``scheduled``)."""

        def enough() -> list[dict[str, Any]] | None:
            items: list[dict[str, Any]] = self.get_json("pods", "-n", namespace, "-l", selector)["items"]
            if scheduled:
                items = [p for p in items if p["spec"].get("nodeName")]
            return items if len(items) >= count else None

        what = f"{count} {'scheduled ' if scheduled else ''}pods matching {selector!r} in {namespace}"
        return wait_until(enough, timeout=timeout, what=what)


def _same_quantities(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    # The API server canonicalises quantities ("2000Gi" may come back as "2Ti"), so compare key sets only
    # plus the plain integers that matter for scheduling (GPU counts, pods).
    if set(want) != set(have):
        return False
    return all(str(v) == str(have[k]) for k, v in want.items() if str(v).isdigit() and str(have[k]).isdigit())


def _load_objects(
    src: str | os.PathLike[str] | Mapping[str, Any] | Iterable[Mapping[str, Any]],
) -> list[Mapping[str, Any]]:
    if isinstance(src, str | os.PathLike):
        path = Path(src)
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        except (OSError, yaml.YAMLError) as exc:
            raise ControlPlaneError(f"cannot read objects from {path}: {exc}") from exc
    elif isinstance(src, Mapping):
        docs = [src]
    else:
        docs = list(src)
    out: list[Mapping[str, Any]] = []
    for d in docs:
        if not isinstance(d, Mapping):
            raise ControlPlaneError(f"expected a Kubernetes object, got {type(d).__name__}")
        if str(d.get("kind", "")).endswith("List") and "items" in d:
            out.extend(d["items"] or [])
        else:
            out.append(d)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.e2e.cluster``: start a cluster with the example nodes, print how to use it and run
    until Ctrl-C (handy for poking at the webhook by hand)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.e2e.cluster", description=main.__doc__)
    ap.add_argument("--nodes", default=str(DEFAULT_NODES_FILE), help="nodes file ('' for none)")
    ap.add_argument("--once", action="store_true", help="start, report the startup time, stop")
    ns = ap.parse_args(argv)
    try:
        cp = ControlPlane(build_binaries()).start()
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        if ns.nodes:
            cp.create_nodes(ns.nodes)
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in cp.phase_seconds.items())
        with contextlib.suppress(BrokenPipeError):
            print(
                f"control plane ready in {cp.startup_seconds:.2f}s ({phases})\nexport KUBECONFIG={cp.kubeconfig}",
                flush=True,
            )
        if not ns.once:
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
