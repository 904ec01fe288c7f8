"""kubeconfig `exec` credential plugins (client.authentication.k8s.io v1 and v1beta1), as client-go runs them.

EKS (`aws eks get-token`), GKE (`gke-gcloud-auth-plugin`) and AKS (`kubelogin`) kubeconfigs name a command
that prints an `ExecCredential` whose `status` holds a bearer token or a client certificate, with an optional
`expirationTimestamp`. The plugin gets the parent environment plus `exec.env`, and `KUBERNETES_EXEC_INFO`: an
`ExecCredential` whose spec says whether it may interact and, with `provideClusterInfo`, which cluster.

Decisions where the spec leaves room (docs/deploy.md, "Cluster credentials"):
- The plugin never gets a terminal: its stdin is closed (stdout is the credential, and our commands run in
  pods and CI). `spec.interactive` is therefore false; `interactiveMode: Always` is refused when the
  kubeconfig is loaded, since such a plugin could only fail later.
- A plugin run is bounded: `EXEC_TIMEOUT_SECONDS`, then its whole process group is killed; its stdout may
  hold at most `MAX_EXEC_OUTPUT` bytes.
- The credential is kept until its expirationTimestamp (none: until the API server answers 401), then the
  plugin runs again, as client-go does.

Every failure raises `ExecPluginError`, one line naming the kubeconfig, the user and what went wrong (with
the last line the plugin wrote to stderr); never the credential itself.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")
EXEC_TIMEOUT_SECONDS = 60.0
MAX_EXEC_OUTPUT = 1024 * 1024
# The per-cluster plugin configuration lives in this cluster extension (passed as spec.cluster.config).
CLUSTER_EXTENSION = "client.authentication.k8s.io/exec"


class ExecPluginError(Exception):
    """The plugin is misconfigured, missing, failed, timed out or printed no usable credential (one line)."""


@dataclass(frozen=True)
class ExecPlugin:
    """A user's `exec` stanza, validated; `where` names the kubeconfig and user in every error."""

    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    api_version: str
    interactive_mode: str
    install_hint: str
    where: str
    # The spec.cluster given to the plugin when provideClusterInfo is set, else None.
    cluster_info: Mapping[str, Any] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Credential:
    """What the plugin printed: a token and/or a client certificate; `expires_at` is a Unix time or None."""

    token: str | None = field(default=None, repr=False)
    client_cert_pem: bytes | None = field(default=None, repr=False)
    client_key_pem: bytes | None = field(default=None, repr=False)
    expires_at: float | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def parse_exec(
    body: Any, *, where: str, base: Path, cluster: Mapping[str, Any] | None = None, ca_pem: bytes | None = None
) -> ExecPlugin:
    """Validate a kubeconfig `user.exec` mapping. `base` resolves a relative command path (one with a `/`),
    as kubectl does; `cluster` (the kubeconfig cluster entry) and its CA go to the plugin with
    provideClusterInfo."""
    if not isinstance(body, dict):
        raise ExecPluginError(f"{where}: exec must be a mapping")
    command = body.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ExecPluginError(f"{where}: exec needs a command")
    if "/" in command and not os.path.isabs(command):
        command = str(base / command)
    api_version = body.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ExecPluginError(
            f"{where}: exec apiVersion {api_version!r} is not supported: use client.authentication.k8s.io/v1 "
            "(or v1beta1)"
        )
    mode = body.get("interactiveMode")
    if mode is None and api_version.endswith("/v1"):
        raise ExecPluginError(f"{where}: exec interactiveMode is required with {api_version} (Never or IfAvailable)")
    mode = mode or "IfAvailable"  # v1beta1's default
    if mode not in INTERACTIVE_MODES:
        raise ExecPluginError(f"{where}: exec interactiveMode {mode!r} must be Never, IfAvailable or Always")
    if mode == "Always":
        raise ExecPluginError(
            f"{where}: exec interactiveMode Always needs a terminal, which gpu-admission never gives a plugin: "
            "log in with the plugin first and set interactiveMode: IfAvailable or Never"
        )
    args = body.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ExecPluginError(f"{where}: exec args must be a list of strings")
    env_list = body.get("env") or []
    env: list[tuple[str, str]] = []
    if not isinstance(env_list, list):
        raise ExecPluginError(f"{where}: exec env must be a list of name/value pairs")
    for index, item in enumerate(env_list):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ExecPluginError(f"{where}: exec env[{index}] needs a name")
        env.append((item["name"], str(item.get("value") if item.get("value") is not None else "")))
    hint = body.get("installHint")
    return ExecPlugin(
        command=command,
        args=tuple(args),
        env=tuple(env),
        api_version=api_version,
        interactive_mode=mode,
        install_hint=" ".join(str(hint).split()) if hint else "",
        where=where,
        cluster_info=_cluster_info(cluster or {}, ca_pem) if body.get("provideClusterInfo") else None,
    )


def _cluster_info(cluster: Mapping[str, Any], ca_pem: bytes | None) -> dict[str, Any]:
    """The kubeconfig cluster as the ExecCredential `Cluster` type spells it (CA always as data)."""
    info: dict[str, Any] = {"server": cluster.get("server", "")}
    for key in ("tls-server-name", "insecure-skip-tls-verify", "proxy-url", "disable-compression"):
        if cluster.get(key):
            info[key] = cluster[key]
    if ca_pem:
        info["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    for extension in cluster.get("extensions") or []:
        if isinstance(extension, dict) and extension.get("name") == CLUSTER_EXTENSION:
            info["config"] = extension.get("extension")
    return info


def exec_info(plugin: ExecPlugin) -> str:
    """The KUBERNETES_EXEC_INFO value: never interactive (the plugin gets no terminal)."""
    spec: dict[str, Any] = {"interactive": False}
    if plugin.cluster_info is not None:
        spec["cluster"] = dict(plugin.cluster_info)
    return json.dumps({"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec})


def run_plugin(plugin: ExecPlugin, *, timeout: float = EXEC_TIMEOUT_SECONDS, now: float | None = None) -> Credential:
    """Run the plugin once and parse what it prints."""
    env = dict(os.environ)
    env.update(plugin.env)
    env["KUBERNETES_EXEC_INFO"] = exec_info(plugin)
    name = f"exec plugin {plugin.command!r}"
    try:
        proc = subprocess.Popen(
            [plugin.command, *plugin.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group, so a timeout kills its children too
        )
    except FileNotFoundError:
        hint = f" ({plugin.install_hint})" if plugin.install_hint else ""
        raise ExecPluginError(f"{plugin.where}: {name} not found{hint}") from None
    except PermissionError:
        raise ExecPluginError(f"{plugin.where}: {name} is not executable") from None
    except OSError as exc:
        raise ExecPluginError(f"{plugin.where}: {name} cannot run ({' '.join(str(exc).split())})") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise ExecPluginError(f"{plugin.where}: {name} did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        detail = _last_line(err)
        raise ExecPluginError(
            f"{plugin.where}: {name} failed with exit code {proc.returncode}" + (f": {detail}" if detail else "")
        )
    if len(out) > MAX_EXEC_OUTPUT:
        raise ExecPluginError(f"{plugin.where}: {name} printed more than {MAX_EXEC_OUTPUT} bytes")
    return parse_credential(out, plugin, time.time() if now is None else now)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.communicate()


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def parse_credential(out: bytes, plugin: ExecPlugin, now: float) -> Credential:
    """The plugin's stdout to a `Credential`, checked against the spec."""
    bad = f"{plugin.where}: exec plugin {plugin.command!r} printed"
    try:
        doc = json.loads(out)
    except (ValueError, UnicodeDecodeError):
        raise ExecPluginError(f"{bad} no JSON ExecCredential") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise ExecPluginError(f"{bad} something other than an ExecCredential")
    if doc.get("apiVersion") != plugin.api_version:
        raise ExecPluginError(f"{bad} apiVersion {doc.get('apiVersion')!r}, the kubeconfig asks {plugin.api_version}")
    status = doc.get("status")
    if not isinstance(status, dict):
        raise ExecPluginError(f"{bad} an ExecCredential without a status")
    token = status.get("token")
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if token is not None and not isinstance(token, str):
        raise ExecPluginError(f"{bad} a token that is not a string")
    if bool(cert) != bool(key):
        raise ExecPluginError(f"{bad} only one of clientCertificateData and clientKeyData")
    if not token and not cert:
        raise ExecPluginError(f"{bad} neither a token nor a client certificate")
    if cert and (not isinstance(cert, str) or not isinstance(key, str) or "-----BEGIN " not in cert + key):
        raise ExecPluginError(f"{bad} a client certificate or key that is not PEM")
    expires = status.get("expirationTimestamp")
    expires_at = _parse_time(expires, bad) if expires else None
    if expires_at is not None and expires_at <= now:
        raise ExecPluginError(f"{bad} a credential that expired at {expires}")
    return Credential(
        token=token or None,
        client_cert_pem=cert.encode() if cert else None,
        client_key_pem=key.encode() if key else None,
        expires_at=expires_at,
    )


def _parse_time(value: Any, bad: str) -> float:
    try:
        parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ExecPluginError(f"{bad} an expirationTimestamp that is not RFC 3339: {str(value)[:40]!r}") from None
    if parsed.tzinfo is None:
        raise ExecPluginError(f"{bad} an expirationTimestamp without a time zone: {str(value)[:40]!r}")
    return parsed.timestamp()


class ExecCredentials:
    """The current credential of one plugin: run on first use, again once expired or when `refresh` is asked
    (after a 401). Thread-safe; concurrent callers wait for one run."""

    def __init__(self, plugin: ExecPlugin, *, timeout: float = EXEC_TIMEOUT_SECONDS) -> None:
        self.plugin = plugin
        self._timeout = timeout
        self._lock = threading.Lock()
        self._current: Credential | None = None
        self.runs = 0

    def get(self, *, rejected_token: str | None = None) -> Credential:
        """The credential; re-run the plugin if it expired, or if the API server rejected its token."""
        with self._lock:
            current = self._current
            if (
                current is None
                or current.expired(time.time())
                or (rejected_token is not None and current.token == rejected_token)
            ):
                current = self._current = run_plugin(self.plugin, timeout=self._timeout)
                self.runs += 1
            return current
