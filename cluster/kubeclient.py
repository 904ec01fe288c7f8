"""A small synchronous Kubernetes REST client on httpx: plain JSON dicts in and out, no typed models.

Configuration comes from a kubeconfig file (its current context, or a named one) or from inside a cluster
(the service-account token, CA and `KUBERNETES_SERVICE_HOST`/`_PORT`). Supported credentials: bearer token
(`token`, `tokenFile`), client certificate (`client-certificate[-data]` + `client-key[-data]`), basic auth,
and `exec` credential plugins (cluster/execcred.py: the plugin runs when the client is made, again when its
credential expires or after a 401); legacy auth-provider plugins are refused with a clear error. A token
read from a file (in-cluster, or `tokenFile`) is re-read every minute, and at once after a 401, because
projected tokens rotate.

Every API failure raises `KubeError(status, reason, message)` with the API server's `Status` message;
transport failures use status 0. Configuration problems raise `KubeConfigError`, one line naming the file.
Neither ever carries a token or key.
"""

from __future__ import annotations

import base64
import binascii
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import httpx
import orjson
import yaml

from cluster.execcred import Credential, ExecCredentials, ExecPlugin, ExecPluginError, parse_exec
from cluster.pem import load_pem_chain

JSON: TypeAlias = dict[str, Any]
ParamValue: TypeAlias = str | int | bool | None

DEFAULT_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_SECONDS = 60.0
MAX_WATCH_LINE = 64 * 1024 * 1024

PATCH_TYPES: dict[str, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


class KubeConfigError(Exception):
    """The configuration cannot be used; `str(exc)` is one line naming the file and the problem."""


class KubeError(Exception):
    """The API server refused a request (`status` is the HTTP code) or could not be reached (`status` 0)."""

    def __init__(self, status: int, reason: str, message: str, details: JSON | None = None) -> None:
        self.status = status
        self.reason = reason
        self.message = " ".join(message.split())
        self.details = details or {}
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"HTTP {self.status}" if self.status else "no response"
        reason = f" {self.reason}" if self.reason else ""
        return f"{self.message} ({where}{reason})" if self.message else f"{where}{reason}"

    @property
    def gone(self) -> bool:
        """410: the resourceVersion is too old (watch) or the continue token expired (list)."""
        return self.status == 410

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @classmethod
    def from_status(cls, status: Any, *, http_status: int = 0) -> KubeError:
        """From a `Status` object (an error response body or the object of a watch ERROR event)."""
        if not isinstance(status, dict):
            return cls(http_status, "", f"unexpected error object: {str(status)[:200]}")
        code = status.get("code")
        details = status.get("details")
        return cls(
            code if isinstance(code, int) and code else http_status,
            str(status.get("reason") or ""),
            str(status.get("message") or ""),
            details if isinstance(details, dict) else None,
        )

    @classmethod
    def from_response(cls, response: httpx.Response) -> KubeError:
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict) and body.get("kind") == "Status":
            error = cls.from_status(body, http_status=response.status_code)
            error.status = response.status_code
            return error
        text = response.content[:300].decode("utf-8", "replace")
        return cls(response.status_code, response.reason_phrase, text)


# --------------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to talk to it. Secrets are kept out of `repr`."""

    server: str
    ca_pem: bytes | None = field(default=None, repr=False)
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    client_cert_pem: bytes | None = field(default=None, repr=False)
    client_key_pem: bytes | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    namespace: str = "default"
    proxy_url: str | None = None
    source: str = ""
    exec_plugin: ExecPlugin | None = None


def default_kubeconfig_paths(environ: Mapping[str, str] | None = None) -> list[Path]:
    """`$KUBECONFIG` (a path list) if set, else `~/.kube/config`."""
    env = os.environ if environ is None else environ
    listed = [Path(p).expanduser() for p in env.get("KUBECONFIG", "").split(os.pathsep) if p.strip()]
    return listed or [Path("~/.kube/config").expanduser()]


def _read_kubeconfig_file(path: Path) -> JSON:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KubeConfigError(f"kubeconfig {path}: no such file") from None
    except IsADirectoryError:
        raise KubeConfigError(f"kubeconfig {path}: is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: cannot read ({_one_line(exc)})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise KubeConfigError(f"kubeconfig {path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise KubeConfigError(f"kubeconfig {path}: expected a mapping at the top level")
    return data


@dataclass
class _Named:
    body: JSON
    base: Path  # the directory of the file that defined it: relative paths are relative to it
    origin: Path


def _collect(merged: dict[str, _Named], doc: JSON, section: str, inner: str, path: Path) -> None:
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise KubeConfigError(f"kubeconfig {path}: {section} must be a list")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise KubeConfigError(f"kubeconfig {path}: {section}[{index}] needs a name")
        body = entry.get(inner) or {}
        if not isinstance(body, dict):
            raise KubeConfigError(f"kubeconfig {path}: {section}[{index}].{inner} must be a mapping")
        # The first file that defines a name wins, as kubectl merges $KUBECONFIG.
        merged.setdefault(entry["name"], _Named(body=body, base=path.parent, origin=path))


def _b64(value: Any, what: str, origin: Path) -> bytes:
    if not isinstance(value, str):
        raise KubeConfigError(f"kubeconfig {origin}: {what} must be a base64 string")
    try:
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise KubeConfigError(f"kubeconfig {origin}: {what} is not valid base64") from None


def _file_bytes(value: Any, what: str, named: _Named) -> bytes:
    if not isinstance(value, str) or not value:
        raise KubeConfigError(f"kubeconfig {named.origin}: {what} must be a file path")
    target = Path(value).expanduser()
    if not target.is_absolute():
        target = named.base / target
    try:
        return target.read_bytes()
    except FileNotFoundError:
        raise KubeConfigError(f"kubeconfig {named.origin}: {what} {target}: no such file") from None
    except OSError as exc:
        raise KubeConfigError(f"kubeconfig {named.origin}: {what} {target}: {_one_line(exc)}") from None


def _material(named: _Named, data_key: str, file_key: str) -> bytes | None:
    body = named.body
    if body.get(data_key):
        return _b64(body[data_key], data_key, named.origin)
    if body.get(file_key):
        return _file_bytes(body[file_key], file_key, named)
    return None


def _check_pem(data: bytes | None, marker: bytes, what: str, origin: Path) -> None:
    if data is not None and b"-----BEGIN " not in data:
        raise KubeConfigError(f"kubeconfig {origin}: {what} is not PEM")
    if data is not None and marker not in data:
        raise KubeConfigError(f"kubeconfig {origin}: {what} holds no {marker.decode()} block")


def load_kubeconfig(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    *,
    context: str | None = None,
) -> KubeConfig:
    """Resolve a kubeconfig (one file, a list merged like `$KUBECONFIG`, or the default) to a `KubeConfig`."""
    if path is None:
        paths = default_kubeconfig_paths()
    elif isinstance(path, str | os.PathLike):
        paths = [Path(path).expanduser()]
    else:
        paths = [Path(p).expanduser() for p in path]
    clusters: dict[str, _Named] = {}
    contexts: dict[str, _Named] = {}
    users: dict[str, _Named] = {}
    current: str | None = None
    existing = [p for p in paths if p.exists()] if len(paths) > 1 else paths
    if not existing:
        raise KubeConfigError(f"kubeconfig {os.pathsep.join(map(str, paths))}: no such file")
    for file in existing:
        doc = _read_kubeconfig_file(file)
        _collect(clusters, doc, "clusters", "cluster", file)
        _collect(contexts, doc, "contexts", "context", file)
        _collect(users, doc, "users", "user", file)
        if not current and isinstance(doc.get("current-context"), str) and doc["current-context"]:
            current = doc["current-context"]
    label = str(existing[0]) if len(existing) == 1 else os.pathsep.join(map(str, existing))
    name = context or current
    if not name:
        raise KubeConfigError(f"kubeconfig {label}: no current-context set (pass a context)")
    if name not in contexts:
        raise KubeConfigError(f"kubeconfig {label}: context {name!r} not found")
    ctx = contexts[name].body
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if not isinstance(cluster_name, str) or cluster_name not in clusters:
        raise KubeConfigError(f"kubeconfig {label}: cluster {cluster_name!r} of context {name!r} not found")
    cluster = clusters[cluster_name]
    server = cluster.body.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"kubeconfig {cluster.origin}: cluster {cluster_name!r} has no https:// server")
    insecure = bool(cluster.body.get("insecure-skip-tls-verify", False))
    ca_pem = _material(cluster, "certificate-authority-data", "certificate-authority")
    _check_pem(ca_pem, b"CERTIFICATE", "certificate-authority", cluster.origin)
    if insecure and ca_pem is not None:
        raise KubeConfigError(
            f"kubeconfig {cluster.origin}: cluster {cluster_name!r} sets both a certificate authority and "
            "insecure-skip-tls-verify"
        )

    token: str | None = None
    token_file: Path | None = None
    exec_plugin: ExecPlugin | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    username: str | None = None
    password: str | None = None
    if user_name is not None:
        if not isinstance(user_name, str) or user_name not in users:
            raise KubeConfigError(f"kubeconfig {label}: user {user_name!r} of context {name!r} not found")
        user = users[user_name]
        provider = user.body.get("auth-provider")
        if provider:
            kind = provider.get("name") if isinstance(provider, dict) else None
            raise KubeConfigError(
                f"kubeconfig {user.origin}: user {user_name!r} uses the legacy auth-provider {kind!r}, which "
                "Kubernetes removed: switch the user to its exec plugin (gke-gcloud-auth-plugin, kubelogin, "
                "aws eks get-token)"
            )
        if user.body.get("exec"):
            exec_plugin = _exec_plugin(user, user_name, cluster, ca_pem)
        if user.body.get("token"):
            token = str(user.body["token"]).strip()
        elif user.body.get("tokenFile"):
            raw = user.body["tokenFile"]
            token_file = Path(str(raw)).expanduser()
            if not token_file.is_absolute():
                token_file = user.base / token_file
            token = _read_token(token_file, f"kubeconfig {user.origin}: tokenFile")
        cert_pem = _material(user, "client-certificate-data", "client-certificate")
        key_pem = _material(user, "client-key-data", "client-key")
        _check_pem(cert_pem, b"CERTIFICATE", "client-certificate", user.origin)
        _check_pem(key_pem, b"PRIVATE KEY", "client-key", user.origin)
        if (cert_pem is None) != (key_pem is None):
            raise KubeConfigError(
                f"kubeconfig {user.origin}: user {user_name!r} needs both client-certificate and client-key"
            )
        if user.body.get("username") is not None:
            username = str(user.body["username"])
            password = str(user.body.get("password") or "")
    namespace = ctx.get("namespace")
    tls_name = cluster.body.get("tls-server-name")
    proxy = cluster.body.get("proxy-url")
    return KubeConfig(
        server=server.rstrip("/"),
        ca_pem=ca_pem,
        insecure_skip_tls_verify=insecure,
        tls_server_name=tls_name if isinstance(tls_name, str) and tls_name else None,
        token=token,
        token_file=token_file,
        client_cert_pem=cert_pem,
        client_key_pem=key_pem,
        username=username,
        password=password,
        namespace=namespace if isinstance(namespace, str) and namespace else "default",
        proxy_url=proxy if isinstance(proxy, str) and proxy else None,
        source=f"kubeconfig {label} (context {name})",
        exec_plugin=exec_plugin,
    )


def _exec_plugin(user: _Named, user_name: str, cluster: _Named, ca_pem: bytes | None) -> ExecPlugin:
    others = [
        key
        for key in ("token", "tokenFile", "username", "client-certificate", "client-certificate-data")
        if user.body.get(key)
    ]
    if others:
        raise KubeConfigError(
            f"kubeconfig {user.origin}: user {user_name!r} sets both exec and {others[0]}: keep one of them"
        )
    try:
        return parse_exec(
            user.body["exec"],
            where=f"kubeconfig {user.origin}: user {user_name!r}",
            base=user.base,
            cluster=cluster.body,
            ca_pem=ca_pem,
        )
    except ExecPluginError as exc:
        raise KubeConfigError(str(exc)) from None


def _read_token(path: Path, what: str) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise KubeConfigError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KubeConfigError(f"{what} {path}: cannot read ({_one_line(exc)})") from None
    if not token:
        raise KubeConfigError(f"{what} {path}: empty")
    return token


def load_incluster(sa_dir: Path | str = DEFAULT_SA_DIR, environ: Mapping[str, str] | None = None) -> KubeConfig:
    """The configuration of a pod: service-account token (re-read as it rotates), CA and service host."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset")
    base = Path(sa_dir)
    token_file = base / "token"
    token = _read_token(token_file, "service-account token")
    try:
        ca_pem = (base / "ca.crt").read_bytes()
    except OSError as exc:
        raise KubeConfigError(f"service-account CA {base / 'ca.crt'}: {_one_line(exc)}") from None
    try:
        namespace = (base / "namespace").read_text(encoding="utf-8").strip() or "default"
    except OSError:
        namespace = "default"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return KubeConfig(
        server=f"https://{host}:{port}",
        ca_pem=ca_pem,
        token=token,
        token_file=token_file,
        namespace=namespace,
        source="in-cluster service account",
    )


def load_config(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    sa_dir: Path | str = DEFAULT_SA_DIR,
    environ: Mapping[str, str] | None = None,
) -> KubeConfig:
    """An explicit kubeconfig, else `$KUBECONFIG`, else `~/.kube/config` if present, else in-cluster."""
    env = os.environ if environ is None else environ
    if kubeconfig is not None:
        return load_kubeconfig(kubeconfig, context=context)
    if env.get("KUBECONFIG", "").strip():
        return load_kubeconfig(default_kubeconfig_paths(env), context=context)
    home = Path("~/.kube/config").expanduser()
    if home.is_file():
        return load_kubeconfig(home, context=context)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return load_incluster(sa_dir, env)
    raise KubeConfigError("no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, or run in a pod")


# --------------------------------------------------------------------------------------------------------
# Transport


def ssl_context_for(config: KubeConfig) -> ssl.SSLContext:
    """The client TLS context: the cluster CA (or system roots), and the client certificate if any."""
    try:
        if config.insecure_skip_tls_verify:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif config.ca_pem is not None:
            context = ssl.create_default_context(cadata=config.ca_pem.decode("ascii", "replace"))
        else:
            context = ssl.create_default_context()
    except (ssl.SSLError, ValueError) as exc:
        raise KubeConfigError(f"{config.source}: certificate authority unusable ({_one_line(exc)})") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.client_cert_pem is not None and config.client_key_pem is not None:
        try:
            load_pem_chain(context, config.client_cert_pem, config.client_key_pem)
        except ssl.SSLError as exc:
            raise KubeConfigError(
                f"{config.source}: client certificate or key unusable ({exc.reason or 'bad PEM'})"
            ) from None
    return context


class _TokenSource(Protocol):
    def token(self, *, rejected: str | None = None) -> str | None:
        """The token to send; `rejected` is one the API server just answered 401 to (get a new one)."""


class _FileToken:
    """A fixed token, or one read from a file: re-read periodically and right after a 401."""

    def __init__(self, token: str | None, token_file: Path | None, refresh: float) -> None:
        self._token = token
        self._file = token_file
        self._refresh = refresh
        self._read_at = time.monotonic()
        self._lock = threading.Lock()

    def token(self, *, rejected: str | None = None) -> str | None:
        if self._file is None:
            return self._token
        with self._lock:
            if rejected is not None or time.monotonic() - self._read_at >= self._refresh:
                try:
                    fresh = self._file.read_text(encoding="utf-8").strip()
                except (OSError, UnicodeDecodeError):
                    fresh = ""
                if fresh:  # keep the last good token if the file is briefly missing mid-rotation
                    self._token = fresh
                self._read_at = time.monotonic()
            return self._token


class _ExecToken:
    """The credential of an exec plugin. A client certificate it returns is loaded into the client's TLS
    context (new connections present it; a renewed one replaces it)."""

    def __init__(self, credentials: ExecCredentials, tls: ssl.SSLContext) -> None:
        self._credentials = credentials
        self._tls = tls
        self._cert: bytes | None = None

    def credential(self, rejected: str | None = None) -> Credential:
        credential = self._credentials.get(rejected_token=rejected)
        if credential.client_cert_pem is not None and credential.client_cert_pem != self._cert:
            assert credential.client_key_pem is not None  # parse_credential requires both
            load_pem_chain(self._tls, credential.client_cert_pem, credential.client_key_pem)
            self._cert = credential.client_cert_pem
        return credential

    def token(self, *, rejected: str | None = None) -> str | None:
        try:
            return self.credential(rejected).token
        except (ExecPluginError, ssl.SSLError) as exc:
            raise KubeError(0, "ExecCredentialFailed", _one_line(exc)) from None


class _BearerAuth(httpx.Auth):
    """`Authorization: Bearer` from a token source; after a 401, asks the source again and retries once."""

    def __init__(self, source: _TokenSource) -> None:
        self._source = source

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self._source.token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401 and token:
            fresh = self._source.token(rejected=token)
            if fresh and fresh != token:
                request.headers["Authorization"] = f"Bearer {fresh}"
                yield request


def _camel(name: str) -> str:
    name = name.rstrip("_")  # continue_ -> continue
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def query_params(params: Mapping[str, ParamValue]) -> dict[str, str]:
    """Keyword arguments to query parameters: `label_selector` -> `labelSelector`, booleans as true/false."""
    out: dict[str, str] = {}
    for key, value in params.items():
        if value is None:
            continue
        out[_camel(key)] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def iter_json_lines(chunks: Iterable[bytes], *, max_line: int = MAX_WATCH_LINE) -> Iterator[bytes]:
    """Split a byte stream into newline-delimited lines (blank lines skipped), whatever the chunking."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buffer[start:end]).strip()
            start = end + 1
            if line:
                yield line
        del buffer[:start]
        if len(buffer) > max_line:
            raise KubeError(0, "WatchLineTooLong", f"a watch event exceeds {max_line} bytes")
    tail = bytes(buffer).strip()
    if tail:
        yield tail


Decode: TypeAlias = Callable[[bytes], Any]  # a response body or watch line to JSON values (orjson.loads by default)


def decode_watch_event(line: bytes, decode: Decode = orjson.loads) -> JSON:
    """One watch line to `{"type": ..., "object": {...}}`; `KubeError` if it is not a watch event."""
    try:
        event = decode(line)
    except orjson.JSONDecodeError as exc:
        raise KubeError(0, "InvalidWatchEvent", f"watch line is not JSON: {exc}") from None
    if (
        not isinstance(event, dict)
        or not isinstance(event.get("type"), str)
        or not isinstance(event.get("object"), dict)
    ):
        raise KubeError(0, "InvalidWatchEvent", "watch line is not an event with a type and an object")
    return event


class WatchHandle:
    """Lets another thread end a watch that is blocked reading an idle stream: `abort()`.

    It shuts the connection's socket down (through a duplicate descriptor, so the TLS object of the reading
    thread is left alone); the watch then ends quietly.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._response: httpx.Response | None = None
        self._aborted = False

    @property
    def aborted(self) -> bool:
        return self._aborted

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            response = self._response
        if response is not None:
            _shutdown_socket(response)

    def _attach(self, response: httpx.Response) -> None:
        with self._lock:
            self._response = response
            aborted = self._aborted
        if aborted:
            _shutdown_socket(response)

    def _detach(self) -> None:
        with self._lock:
            self._response = None


def _shutdown_socket(response: httpx.Response) -> None:
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return
    try:
        duplicate = socket.socket(fileno=os.dup(sock.fileno()))
    except OSError:
        return
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        duplicate.close()


class KubeClient:
    """Synchronous Kubernetes API client. Thread-safe (httpx's pool is); use one per process and `close()`."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout: float = 30.0,
        user_agent: str = "gpu-admission",
        token_refresh: float = TOKEN_REFRESH_SECONDS,
    ) -> None:
        self._config = config
        self._timeout = timeout
        tls = ssl_context_for(config)
        auth: httpx.Auth | None = None
        if config.exec_plugin is not None:
            source = _ExecToken(ExecCredentials(config.exec_plugin), tls)
            try:  # now, so that a missing or failing plugin is a configuration error, not a later request's
                source.credential()
            except ExecPluginError as exc:
                raise KubeConfigError(str(exc)) from None
            except ssl.SSLError as exc:
                raise KubeConfigError(
                    f"{config.source}: client certificate from the exec plugin unusable ({exc.reason or 'bad PEM'})"
                ) from None
            auth = _BearerAuth(source)
        elif config.token or config.token_file:
            auth = _BearerAuth(_FileToken(config.token, config.token_file, token_refresh))
        elif config.username is not None:
            auth = httpx.BasicAuth(config.username, config.password or "")
        self._http = httpx.Client(
            base_url=config.server,
            verify=tls,
            auth=auth,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            headers={"Accept": "application/json", "User-Agent": user_agent},
            trust_env=False,
            proxy=config.proxy_url,
            follow_redirects=False,
        )
        self._extensions: dict[str, Any] = {"sni_hostname": config.tls_server_name} if config.tls_server_name else {}

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        timeout: float = 30.0,
    ) -> KubeClient:
        """A client from an explicit kubeconfig, `$KUBECONFIG`, `~/.kube/config` or the pod's account."""
        return cls(load_config(kubeconfig, context=context), timeout=timeout)

    @property
    def config(self) -> KubeConfig:
        return self._config

    def close(self) -> None:
        self._http.close()

    @property
    def closed(self) -> bool:
        return self._http.is_closed

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------------------

    @staticmethod
    def _check_path(path: str) -> str:
        if not path.startswith("/") or path.startswith("//"):
            raise ValueError(f"API path must start with a single '/': {path!r}")
        return path

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, ParamValue] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        decode: Decode = orjson.loads,
    ) -> JSON:
        """Send one request; the decoded JSON body (`decode`: a cut-down decoder), or `KubeError`."""
        headers = {}
        content: bytes | None = None
        if body is not None:
            content = orjson.dumps(body)
            headers["Content-Type"] = content_type
        try:
            with self._http.stream(
                method,
                self._check_path(path),
                params=query_params(params or {}),
                content=content,
                headers=headers,
                extensions=self._extensions,
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise KubeError.from_response(response)
                # Read as chunks, not response.read(): the response sits in a reference cycle, and content kept
                # on it would live until the next cyclic collection (a first list of 50,000 Nodes runs with
                # the collector paused: 700 MB of pages held to the end).
                body = b"".join(response.iter_bytes())
        except httpx.TimeoutException as exc:
            raise KubeError(0, "Timeout", f"{method} {path}: {_one_line(exc) or 'timed out'}") from None
        except httpx.HTTPError as exc:
            raise KubeError(0, "ConnectionFailed", f"{method} {path}: {_one_line(exc)}") from None
        if not body:
            return {}
        status = response.status_code
        try:
            decoded = decode(body)
        except orjson.JSONDecodeError:
            raise KubeError(status, "InvalidResponse", f"{method} {path}: not JSON") from None
        if not isinstance(decoded, dict):
            raise KubeError(status, "InvalidResponse", f"{method} {path}: not a JSON object")
        return decoded

    def get(self, path: str, **params: ParamValue) -> JSON:
        return self.request("GET", path, params=params)

    def list(self, path: str, *, decode: Decode = orjson.loads, **params: ParamValue) -> JSON:
        """One list request (one page when `limit` is given; see `list_all`)."""
        return self.request("GET", path, params=params, decode=decode)

    def list_all(
        self,
        path: str,
        *,
        page_size: int = 500,
        transform: Callable[[Any], Any] | None = None,
        decode: Decode = orjson.loads,
        **params: ParamValue,
    ) -> JSON:
        """Every item, following `continue` tokens; a List with all `items` and the last resourceVersion.

        `transform(item)` is applied page by page (None drops the item), so only one page of whole objects
        is in memory at a time; `decode` may cut items down while parsing (cluster.nodes.decode_list). An
        expired continue token (410) restarts the list once without paging, as client-go does.
        """
        items: list[Any] = []
        first: JSON | None = None

        def page(token: str | None) -> JSON:
            return self.list(path, limit=page_size, continue_=token, decode=decode, **params)

        # The next page is asked for as soon as this one's continue token is known, and is served and read
        # while this one is cut down: the API server's work overlaps ours (one request in flight at a time).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="list-next-page") as ahead:
            asked: str | None = None
            pending = ahead.submit(page, asked)
            while True:
                try:
                    current = pending.result()
                except KubeError as exc:
                    if exc.gone and asked is not None:
                        whole = self.list(path, decode=decode, **params)
                        if transform is not None:
                            whole["items"] = _transformed(whole.get("items") or [], transform)
                        return whole
                    raise
                if first is None:  # its apiVersion and kind, not its items (500 whole pods held to the end)
                    first = {k: v for k, v in current.items() if k != "items"}
                metadata = current.get("metadata") or {}
                asked = metadata.get("continue") or None
                if asked:
                    pending = ahead.submit(page, asked)
                page_items = current.get("items") or []
                del current  # the page's whole objects go as soon as they are cut down
                items.extend(page_items if transform is None else _transformed(page_items, transform))
                del page_items
                if not asked:
                    result = dict(first)
                    result["items"] = items
                    result["metadata"] = {k: v for k, v in metadata.items() if k != "continue"}
                    return result

    def create(self, path: str, body: JSON, **params: ParamValue) -> JSON:
        """POST `body` to a collection path."""
        return self.request("POST", path, params=params, body=body)

    def update(self, path: str, body: JSON, **params: ParamValue) -> JSON:
        """PUT `body` to an object path (include metadata.resourceVersion for optimistic concurrency)."""
        return self.request("PUT", path, params=params, body=body)

    def patch(self, path: str, body: Any, content_type: str = "merge", **params: ParamValue) -> JSON:
        """PATCH with `content_type` json (RFC 6902), merge (RFC 7386), strategic, apply, or a MIME type."""
        mime = PATCH_TYPES.get(content_type, content_type)
        if mime not in PATCH_TYPES.values():
            raise ValueError(f"unknown patch type {content_type!r}: use one of {', '.join(PATCH_TYPES)}")
        return self.request("PATCH", path, params=params, body=body, content_type=mime)

    def delete(self, path: str, **params: ParamValue) -> JSON:
        return self.request("DELETE", path, params=params)

    def watch(
        self,
        path: str,
        resource_version: str | None = None,
        timeout_seconds: int | None = None,
        *,
        allow_bookmarks: bool = True,
        handle: WatchHandle | None = None,
        decode: Decode = orjson.loads,
        **params: ParamValue,
    ) -> Iterator[JSON]:
        """Stream watch events `{"type", "object"}` (ADDED, MODIFIED, DELETED, BOOKMARK) as they arrive.

        Ends when the server closes the stream (after `timeout_seconds`) or `handle.abort()` is called. An
        ERROR event, such as 410 Gone for a resourceVersion too old, raises `KubeError` with its Status.
        """
        query = query_params(
            {
                **params,
                "watch": True,
                "resource_version": resource_version,
                "timeout_seconds": timeout_seconds,
                "allow_watch_bookmarks": True if allow_bookmarks else None,
            }
        )
        read = None if timeout_seconds is None else timeout_seconds + 30.0
        timeout = httpx.Timeout(self._timeout, connect=min(self._timeout, 10.0), read=read)
        if handle is not None and handle.aborted:
            return
        try:
            with self._http.stream(
                "GET", self._check_path(path), params=query, timeout=timeout, extensions=self._extensions
            ) as response:
                if handle is not None:
                    handle._attach(response)
                try:
                    if response.status_code >= 400:
                        response.read()
                        raise KubeError.from_response(response)
                    for line in iter_json_lines(response.iter_bytes()):
                        event = decode_watch_event(line, decode)
                        if event["type"] == "ERROR":
                            raise KubeError.from_status(event["object"])
                        yield event
                        if handle is not None and handle.aborted:
                            return
                finally:
                    if handle is not None:
                        handle._detach()
        except httpx.HTTPError as exc:
            if handle is not None and handle.aborted:
                return
            reason = "Timeout" if isinstance(exc, httpx.TimeoutException) else "ConnectionFailed"
            raise KubeError(0, reason, f"watch {path}: {_one_line(exc) or 'timed out'}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _transformed(items: list[Any], transform: Callable[[Any], Any]) -> list[Any]:
    return [t for t in map(transform, items) if t is not None]
