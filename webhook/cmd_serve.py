"""`gpu-admission serve`: the admission webhook over TLS, with live policy, inventory and certificate reload."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys
import threading
from datetime import UTC
from pathlib import Path
from typing import Any

from webhook.cli import UsageError
from webhook.logs import setup_logging

log = logging.getLogger("gpu-admission.serve")
SWITCH_INTERVAL = 0.0005  # seconds a thread may hold the GIL while another waits (see run)


def register(sub: Any) -> None:
    from webhook import audit as audit_mod

    p = sub.add_parser("serve", help="serve the mutating and validating webhooks over TLS")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--tls-cert", required=True, metavar="FILE", help="serving certificate (PEM)")
    p.add_argument("--tls-key", required=True, metavar="FILE", help="its private key (PEM)")
    p.add_argument("--cert-reload-interval", type=float, default=10.0, metavar="SECONDS",
                   help="how often to look for rotated certificate files (default 10)")  # fmt: skip
    src = p.add_mutually_exclusive_group()
    src.add_argument("--policy", metavar="FILE", help="policy file, reloaded when it changes")
    src.add_argument("--policy-configmap", metavar="NS/NAME", help="watch the policy in this ConfigMap")
    p.add_argument("--nodes", metavar="FILE", help="a fixed inventory instead of watching Nodes")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: KUBECONFIG, ~/.kube, in-cluster)")
    p.add_argument("--no-kube", action="store_true", help="never talk to a cluster (clusterless runs)")
    p.add_argument(
        "--max-inflight",
        type=int,
        default=256,
        help="requests queued or in progress beyond which new ones get 429 at once (default 256)",
    )
    p.add_argument("--max-body", type=int, default=8 * 2**20, help="largest request body in bytes (default 8 MiB)")
    p.add_argument("--shutdown-delay", type=float, default=0.0, metavar="SECONDS",
                   help="on SIGTERM, fail /readyz and keep serving this long before closing (default 0)")  # fmt: skip
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--fault-injection", default="", help=argparse.SUPPRESS)  # tests only: slow-rule:MS | raise-rule
    audit_mod.add_arguments(p)
    p.set_defaults(func=run)


class CertReloader:
    """Reload rotated certificate files into the live SSLContext: new handshakes get the new pair,
    connections already open keep theirs, and nothing restarts."""

    def __init__(self, cert: str, key: str, interval: float) -> None:
        from certs.tlsconfig import server_ssl_context

        self.cert, self.key = Path(cert), Path(key)
        if self.cert.parent != self.key.parent:
            raise UsageError("--tls-cert and --tls-key must be in the same directory")
        self.context = server_ssl_context(self.cert.parent, cert_name=self.cert.name, key_name=self.key.name)
        self.interval = interval
        self.reloads = 0
        self.error: str | None = None
        self._stamp = self._mtime()
        self._not_after = self._read_not_after()
        self._stop = threading.Event()

    def _mtime(self) -> tuple[float, float]:
        try:
            return (self.cert.stat().st_mtime, self.key.stat().st_mtime)
        except OSError:
            return (0.0, 0.0)

    def _read_not_after(self) -> float:
        from certs.store import read_cert

        try:
            return read_cert(self.cert).not_valid_after_utc.replace(tzinfo=UTC).timestamp()
        except Exception:
            return 0.0

    async def watch(self) -> None:
        """Poll the files; apply a rotated pair ON THE EVENT LOOP. Handshakes run on the loop too, and each
        new connection copies the context's pair when it starts, so swapping certificate and key inside one
        loop callback means no handshake ever sees the new certificate with the old key (which a swap from
        another thread allowed: a client saw an aborted handshake)."""
        from certs.errors import CertError
        from certs.store import load_pair
        from certs.tlsconfig import load_into_context

        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            await asyncio.sleep(self.interval)
            stamp = self._mtime()
            if stamp == self._stamp:
                continue
            try:  # read and verify off the loop: it may retry while a writer is mid-rotation
                pair = await loop.run_in_executor(
                    None, lambda: load_pair(self.cert.parent, cert_name=self.cert.name, key_name=self.key.name)
                )
                load_into_context(self.context, pair)
            except CertError as exc:
                self.error = str(exc)
                log.error("certificate reload failed; serving the previous one", extra={"error": str(exc)})
                continue
            self._stamp = stamp
            self._not_after = pair.cert.not_valid_after_utc.timestamp()
            self.reloads += 1
            self.error = None
            log.info("certificate reloaded", extra={"not_after": self._not_after})

    def status(self) -> dict[str, Any]:
        return {"loaded": True, "notAfterUnix": self._not_after, "reloads": self.reloads, "error": self.error}

    def stop(self) -> None:
        self._stop.set()


def _install_fault(spec: str) -> None:
    """Test-only fault injection: add a rule that sleeps or raises, to prove deadlines and failure modes
    against the real server. Hidden from --help; never enabled unless the flag is given."""
    from policies import engine
    from policies.rules import Rule, Violation

    if not spec:
        return
    kind, _, arg = spec.partition(":")
    if kind == "slow-rule":
        import time

        delay = float(arg or "1000") / 1000

        def slow(_: Any) -> list[Violation]:
            time.sleep(delay)
            return []

        rule = Rule("fault-slow", slow, "sleeps (fault injection)")
    elif kind == "raise-rule":

        def boom(_: Any) -> list[Violation]:
            raise RuntimeError("injected fault")

        rule = Rule("fault-raise", boom, "raises (fault injection)")
    else:
        raise UsageError(f"--fault-injection: unknown fault {spec!r}")
    engine.RULES = (*engine.RULES, rule)  # type: ignore[attr-defined]
    log.warning("fault injection enabled", extra={"fault": spec})


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from certs.errors import CertError
    from webhook import audit as audit_mod
    from webhook.app import ServerConfig, create_app, fast_path
    from webhook.metrics import Metrics
    from webhook.state import State
    from webhook.transport import CoalescingHttpToolsProtocol

    setup_logging(args.log_level)
    # Watcher threads (a Node storm: JSON decoding and inventory batches) share the GIL with the event loop,
    # which waits up to one switch interval for it whenever they run: 5 ms by default, the whole p99 budget.
    sys.setswitchinterval(SWITCH_INTERVAL)
    state = State()
    cm: tuple[str, str] | None = None
    if args.policy_configmap:
        ns, _, name = args.policy_configmap.partition("/")
        if not ns or not name:
            raise UsageError("--policy-configmap must be NAMESPACE/NAME")
        cm = (ns, name)
    try:
        reloader = CertReloader(args.tls_cert, args.tls_key, args.cert_reload_interval)
    except CertError as exc:
        raise UsageError(f"TLS: {exc}") from None
    if args.policy:
        try:
            state.watch_policy_file(args.policy)
        except OSError as exc:
            raise UsageError(f"policy {args.policy}: {exc.strerror or exc}") from None
        except Exception as exc:
            raise UsageError(f"policy {args.policy}: {exc}") from None
    if args.nodes:
        from webhook.manifests import ManifestError, load_objects

        try:
            state.set_nodes(load_objects([args.nodes]), f"file:{args.nodes}")
        except ManifestError as exc:
            raise UsageError(f"nodes: {exc}") from None
    client = None
    if not args.no_kube and (args.kubeconfig or cm or not args.nodes):
        from cluster.kubeclient import KubeClient, KubeConfigError

        try:
            client = KubeClient.from_config(args.kubeconfig)
        except KubeConfigError as exc:
            if args.kubeconfig or cm:
                raise UsageError(str(exc)) from None
            log.warning("no cluster configuration: serving without live inventory", extra={"error": str(exc)})
    if client is not None:
        if cm:
            state.watch_policy_configmap(client, *cm)
        if not args.nodes:
            state.watch_nodes(client)
        state.watch_namespaces(client)
        state.watch_targets(client)
        state.watch_pods(client)
    elif cm:
        raise UsageError("--policy-configmap needs a cluster (drop --no-kube)")
    audit = audit_mod.from_args(args)
    _install_fault(args.fault_injection)
    cfg = ServerConfig(
        max_body=args.max_body,
        max_inflight=args.max_inflight,
        policy_configmap=cm,
        cert_status=reloader.status,
    )
    app = create_app(state, metrics=Metrics(), audit=audit, config=cfg)
    config = uvicorn.Config(
        fast_path(app),
        host=args.host,
        port=args.port,
        http=CoalescingHttpToolsProtocol,  # httptools, one TLS record and one send per response
        ws="none",  # no WebSocket endpoints: an Upgrade request is answered as plain HTTP
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=25,
        lifespan="off",
    )
    config.load()
    config.ssl = reloader.context  # our context: TLS >= 1.2, reloadable in place
    assert isinstance(config.ssl, ssl.SSLContext)

    class Server(uvicorn.Server):
        """Drain on SIGTERM/SIGINT: fail /readyz, keep serving for --shutdown-delay, finish in-flight
        reviews, exit 0. (uvicorn's own handler would re-raise the signal after shutdown.)"""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if cfg.draining:
                self._stop_now(sig)
                return
            cfg.draining = True
            log.info("shutting down", extra={"signal": sig, "delay": args.shutdown_delay})
            if args.shutdown_delay > 0:
                threading.Timer(args.shutdown_delay, self._stop_now, (sig,)).start()
            else:
                self._stop_now(sig)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            self._cert_task = asyncio.get_running_loop().create_task(reloader.watch())

        def _stop_now(self, sig: int) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    server = Server(config)
    # Requests uvicorn has started tasks for (queued on the loop or running): the overload signal. Open
    # idle keep-alive connections do not count, so an API server's connection pool never trips it.
    cfg.backlog = lambda: len(server.server_state.tasks)
    log.info(
        "serving",
        extra={"port": args.port, "policy_hash": state.snapshot().policy.hash, "pid": os.getpid()},
    )
    try:
        server.run()  # uvloop (a dependency, like httptools): ~2x the reviews/s of asyncio + h11
    finally:
        reloader.stop()
        state.stop()
        if audit is not None:
            audit.close(timeout=10)
    return 0
