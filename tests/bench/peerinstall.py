"""Install Kyverno and Gatekeeper beside gpu-admission on the same real API server (issue #19).

Each peer is installed the way its own release manifest defines it — its CRDs and its webhook configurations
(rules, namespaceSelector, failurePolicy, timeouts as shipped) — with only the `clientConfig` swapped for a URL
on loopback and a CA of our TLS helper, like ours (tests/e2e/webhook.py). The peer process runs here, built
from its Go module by scripts/peers/build.sh into the cache (never in CI's default path), with the control
plane's admin kubeconfig. The checklist as each peer's policies is in tests/bench/peerpolicies/.

A peer's webhook configurations are registered only while it is the configuration under measurement
(`activate` / `deactivate`); its CRDs and policies stay installed (they cost nothing without the webhooks).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import ControlPlane
from tests.serverproc import free_port, make_certs

CACHE = Path(os.environ.get("GPU_ADMISSION_CACHE", "~/.cache/gpu-admission")).expanduser() / "peers"
GATEKEEPER_VERSION = "v3.23.1"
KYVERNO_VERSION = "v1.19.1"
POLICIES = Path(__file__).resolve().parent / "peerpolicies"
BUILD_SCRIPT = "scripts/peers/build.sh"
Json = dict[str, Any]


def gomodcache() -> Path:
    """Where `go install` left the peers' module sources (their install manifests and CRDs)."""
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    go = shutil.which("go")
    if go:
        out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=False).stdout.strip()
        if out:
            return Path(out)
    return Path("~/go/pkg/mod").expanduser()


def load_yaml(path: Path) -> list[Json]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def local_webhooks(configs: list[Json], base_url: str, ca_b64: str) -> list[Json]:
    """Webhook configurations of a release manifest pointed at a URL on loopback (the Service's path kept)."""
    out = []
    for cfg in configs:
        cfg = copy.deepcopy(cfg)
        for wh in cfg["webhooks"]:
            path = wh["clientConfig"].get("service", {}).get("path", "/")
            wh["clientConfig"] = {"url": base_url + path, "caBundle": ca_b64}
        out.append(cfg)
    return out


def as_list(items: list[Json]) -> Json:
    return {"apiVersion": "v1", "kind": "List", "items": items}


# A pod every peer's policies deny (gpu-admission-annotations: an unknown key): whose denial it gets tells which
# admission controller is in effect.
PROBE: Json = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "peer-probe", "namespace": "default", "annotations": {"gpu-admission.io/gpu-memroy": "1Gi"}},
    "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 90.0, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Peer:
    """A peer admission controller: a local process plus its registration on the control plane."""

    name = ""
    version = ""
    webhook_marker = ""  # a substring of every webhook name it registers (API server metrics label)

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.workdir = Path(cp.workdir) / f"peer-{self.name}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tls = make_certs(self.workdir / "tls")
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.workdir / "peer.log"
        self.configs: list[Json] = []
        self.active = False

    @classmethod
    def binary(cls) -> Path:
        raise NotImplementedError

    @classmethod
    def missing(cls) -> str:
        """'' when the peer can run here, else why not (a printed skip reason)."""
        if not os.access(cls.binary(), os.X_OK):
            return f"{cls.name} {cls.version}: {cls.binary()} is not built (run {BUILD_SCRIPT})"
        return ""

    @property
    def ca_b64(self) -> str:
        import base64

        return base64.b64encode((self.tls / "ca.crt").read_bytes()).decode()

    def _spawn(self, args: list[str], env: dict[str, str]) -> None:
        from tests.serverproc import _die_with_parent

        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binary()), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "KUBECONFIG": str(self.cp.kubeconfig), **env},
                preexec_fn=_die_with_parent,
            )

    def log_tail(self, n: int = 15) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(line[:400] for line in lines[-n:])

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.log_tail()}")

    def apply(self, items: list[Json], *extra: str) -> None:
        self.cp.kubectl("apply", *extra, "-f", "-", input=as_list(items))

    def apply_until_accepted(self, items: list[Json], what: str) -> None:
        """Apply until the API server accepts: objects whose kind or validating webhook the peer is still
        bringing up (CRDs it makes, a serving certificate not ready yet) are refused for a while."""
        body = as_list(items)

        def accepted() -> bool:
            self.check_alive()
            return self.cp.kubectl("apply", "-f", "-", input=body, check=False).returncode == 0

        wait_for(accepted, what, interval=1.0)

    def activate(self) -> None:
        self.apply(self.configs)
        self.active = True

    def deactivate(self) -> None:
        for cfg in self.configs:
            self.cp.kubectl("delete", cfg["kind"].lower(), cfg["metadata"]["name"], "--ignore-not-found")
        self.active = False

    def effective(self) -> bool:
        """Is the peer answering the API server now (its denial of PROBE)?"""
        return self.webhook_marker in self.denies(PROBE)

    def wait_effective(self, timeout: float = 60.0) -> None:
        """The API server picks configurations up asynchronously: dry-run PROBE until the peer denies it."""
        wait_for(lambda: self.check_alive() is None and self.effective(), f"{self.name} to take effect", timeout)

    def _terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        self.deactivate()
        self._terminate()

    def denies(self, obj: Json) -> str:
        """The API server's denial of a server-side dry-run create of `obj` ('' when it would be created)."""
        r = self.cp.kubectl("create", "--dry-run=server", "-f", "-", input=obj, check=False)
        return "" if r.returncode == 0 else (r.stderr or r.stdout)


class Gatekeeper(Peer):
    """Gatekeeper's manager (one process: the controller-manager's webhook and mutation operations, plus the
    audit pod's generate and status operations that make constraint CRDs; not audit itself, a periodic scan
    that is not on the admission path)."""

    name = "gatekeeper"
    version = GATEKEEPER_VERSION
    webhook_marker = "gatekeeper.sh"
    namespace = "gatekeeper-system"
    pod = "gatekeeper-local"

    @classmethod
    def binary(cls) -> Path:
        return CACHE / f"gatekeeper-{cls.version}" / "gatekeeper"

    @classmethod
    def manifest(cls) -> Path:
        return gomodcache() / f"github.com/open-policy-agent/gatekeeper/v3@{cls.version}" / "deploy" / "gatekeeper.yaml"

    def start(self) -> Gatekeeper:
        docs = load_yaml(self.manifest())
        self.apply([d for d in docs if d["kind"] in ("Namespace", "CustomResourceDefinition")], "--server-side")
        # Status objects are owned by the manager's own Pod (POD_NAME): a Pod object that no scheduler serves
        # stands for it, with the security context the namespace's restricted Pod Security level demands.
        self.apply([self._placeholder_pod()])
        health = free_port()
        self._spawn(
            [
                f"--port={self.port}",
                "--host=127.0.0.1",
                "--logtostderr",
                f"--exempt-namespace={self.namespace}",
                "--operation=webhook",
                "--operation=mutation-webhook",
                "--operation=generate",
                "--operation=status",
                "--operation=mutation-status",
                "--disable-opa-builtin={http.send}",
                f"--cert-dir={self.tls}",
                "--disable-cert-rotation",
                f"--health-addr=127.0.0.1:{health}",
                "--metrics-addr=0",
                f"--prometheus-port={free_port()}",  # 8888 by default: a second instance could not start
                "--shutdown-delay=0",
            ],
            {"POD_NAMESPACE": self.namespace, "POD_NAME": self.pod, "NAMESPACE": self.namespace},
        )
        wait_for(lambda: self._ready(health), f"gatekeeper /readyz ({self.log})")
        self.configs = local_webhooks(
            [d for d in docs if d["kind"].endswith("WebhookConfiguration")],
            f"https://127.0.0.1:{self.port}",
            self.ca_b64,
        )
        self._install_policies()
        return self

    def _placeholder_pod(self) -> Json:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.pod, "namespace": self.namespace},
            "spec": {
                "schedulerName": "gpu-admission-bench-unscheduled",
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 1000,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "manager",
                        "image": f"openpolicyagent/gatekeeper:{self.version}",
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    }
                ],
            },
        }

    def _ready(self, health: int) -> bool:
        self.check_alive()
        import httpx

        try:
            return httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _install_policies(self) -> None:
        """Templates first; their constraint kinds exist once the manager has made the CRDs."""
        templates = load_yaml(POLICIES / "gatekeeper.yaml")
        self.apply(templates)
        kinds = {t["spec"]["crd"]["spec"]["names"]["kind"].lower() for t in templates}

        def served() -> bool:
            self.check_alive()
            names = self.cp.kubectl("get", "crd", "-o", "name").stdout
            return all(f"/{k}.constraints.gatekeeper.sh" in names for k in kinds)

        wait_for(served, "gatekeeper to create the constraint CRDs of its templates")
        self.apply_until_accepted(load_yaml(POLICIES / "gatekeeper-constraints.yaml"), "the constraints to be accepted")


class Kyverno(Peer):
    """Kyverno's admission controller, with the release manifest's arguments (config/install-latest-testing.yaml)
    except where it runs out of cluster: `--serverIP` on loopback (Kyverno's own out-of-cluster mode: its webhook
    configurations get a URL client config, its certificate an IP SAN), and admission reports off (the reports
    controller that consumes them does not run here; on, they pile up to maxAdmissionReports and then stop,
    which would make later runs cheaper than earlier ones).

    Kyverno registers its webhook configurations itself, from its policies (no manifest carries them), and its
    webhook controller puts them back while it runs: it is only running while measured — `activate` starts
    it, `deactivate` stops it and deletes the configurations it made."""

    name = "kyverno"
    version = KYVERNO_VERSION
    webhook_marker = "kyverno.svc"
    namespace = "kyverno"
    pod = "kyverno-local"
    managed = "webhook.kyverno.io/managed-by=kyverno"
    # The release manifest's arguments replaced for a process on loopback.
    overrides = ("serverIP", "servicePort", "webhookServerPort", "webhookServerHost", "metricsPort",
                 "controllerRuntimeMetricsAddress", "admissionReports", "kubeconfig")  # fmt: skip

    @classmethod
    def binary(cls) -> Path:
        return CACHE / f"kyverno-{cls.version}" / "kyverno"

    @classmethod
    def manifest(cls) -> Path:
        return gomodcache() / f"github.com/kyverno/kyverno@{cls.version}" / "config" / "install-latest-testing.yaml"

    def start(self) -> Kyverno:
        docs = load_yaml(self.manifest())
        self.apply([d for d in docs if d["kind"] in ("Namespace", "CustomResourceDefinition")], "--server-side")
        self.apply([d for d in docs if d["kind"] == "ConfigMap"])
        deployment = next(
            d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kyverno-admission-controller"
        )
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        kept = [a for a in container["args"] if a.lstrip("-").split("=", 1)[0] not in self.overrides]
        self.args = [
            *kept,
            f"--serverIP=127.0.0.1:{self.port}",
            f"--servicePort={self.port}",
            f"--webhookServerPort={self.port}",
            "--webhookServerHost=127.0.0.1",
            f"--metricsPort={free_port()}",
            "--controllerRuntimeMetricsAddress=0",
            "--admissionReports=false",
            f"--kubeconfig={self.cp.kubeconfig}",
        ]
        self.env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        self.env.update(KYVERNO_NAMESPACE=self.namespace, KYVERNO_POD_NAME=self.pod,
                        TUF_ROOT=str(self.workdir / "sigstore"))  # fmt: skip
        self._run()
        # Kyverno registers its policy webhook before its serving certificate is ready: the first applies can
        # fail with "remote error: tls: internal error" (seen in CI).
        self.apply_until_accepted(load_yaml(POLICIES / "kyverno.yaml"),
                                  "kyverno to accept its policies (its webhook's certificate ready)")  # fmt: skip
        wait_for(self._policies_ready, "kyverno to make its policies ready")
        self.wait_effective()
        self.active = True
        return self

    def _policies_ready(self) -> bool:
        self.check_alive()
        items = self.cp.get_json("clusterpolicies.kyverno.io")["items"]
        return bool(items) and all(
            any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in i.get("status", {}).get("conditions", [])
            )
            for i in items
        )

    def _registered(self) -> bool:
        self.check_alive()
        names = self.cp.kubectl("get", "validatingwebhookconfigurations", "-l", self.managed, "-o", "name").stdout
        return bool(names.strip())

    def _run(self) -> None:
        if self.proc is None:
            self._spawn(self.args, self.env)
        wait_for(self._registered, f"kyverno to register its webhooks ({self.log})", timeout=180)

    def activate(self) -> None:
        self._run()
        self.wait_effective()
        self.active = True

    def deactivate(self) -> None:
        self._terminate()
        for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
            self.cp.kubectl("delete", kind, "-l", self.managed, "--ignore-not-found")
        self.active = False


PEERS: dict[str, type[Peer]] = {"gatekeeper": Gatekeeper, "kyverno": Kyverno}
