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
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from webhook.cli import UsageError
from webhook.guard import ConnectionLimits
from webhook.logs import setup_logging

log = logging.getLogger("gpu-admission.serve")
LEDGER_LEASE = "gpu-admission-ledger"
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
    p.add_argument("--native", action="store_true",
                   help="skip the rules `gpu-admission policy native` generates: ValidatingAdmissionPolicies judge "
                   "them in the API server (deploy/overlays/native)")  # fmt: skip
    p.add_argument("--native-mutations", action="store_true",
                   help="with --native: also skip the mutations `policy native` writes as "
                   "MutatingAdmissionPolicies (Kubernetes >= 1.36; not with its --no-mutations)")  # fmt: skip
    p.add_argument("--max-body", type=int, default=8 * 2**20, help="largest request body in bytes (default 8 MiB)")
    lim = p.add_argument_group("connection limits (docs/deploy.md, Limits)")
    lim.add_argument("--max-bytes-inflight", type=int, default=32 * 2**20, metavar="BYTES",
                     help="request bytes held at once over all connections; bodies up to 64 KiB are not "
                     "counted (default 32 MiB)")  # fmt: skip
    lim.add_argument("--max-header-bytes", type=int, default=ConnectionLimits.max_header_bytes, metavar="BYTES",
                     help="largest request head, request line and headers (default 32 KiB)")  # fmt: skip
    lim.add_argument("--header-timeout", type=float, default=ConnectionLimits.header_timeout, metavar="SECONDS",
                     help="from a request's first byte to the end of its headers (default 5)")  # fmt: skip
    lim.add_argument("--body-timeout", type=float, default=ConnectionLimits.body_timeout, metavar="SECONDS",
                     help="from the end of a request's headers to its last body byte (default 10)")  # fmt: skip
    lim.add_argument("--idle-timeout", type=float, default=ConnectionLimits.idle_timeout, metavar="SECONDS",
                     help="close a connection that has sent no request after this long (default 5)")  # fmt: skip
    lim.add_argument("--keepalive-timeout", type=float, default=ConnectionLimits.keepalive_timeout,
                     metavar="SECONDS", help="close a connection idle this long after a response (default 120: "
                     "longer than the API server keeps an idle connection, 90 s)")  # fmt: skip
    lim.add_argument("--handshake-timeout", type=float, default=ConnectionLimits.handshake_timeout, metavar="SECONDS",
                     help="from accepting a connection to the end of its TLS handshake (default 10)")  # fmt: skip
    lim.add_argument("--max-connections", type=int, default=0, metavar="N",
                     help="open connections beyond which the least recently active idle one is closed "
                     "(default: the open-file limit minus 128)")  # fmt: skip
    p.add_argument("--shutdown-delay", type=float, default=0.0, metavar="SECONDS",
                   help="on SIGTERM, fail /readyz and keep serving this long before closing (default 0)")  # fmt: skip
    p.add_argument("--exception-group", action="append", metavar="GROUP",
                   help="group whose members may change the namespace label gpu-admission.io/enforcement, as they "
                   "may grant GPUPolicyExceptions (repeatable; default gpu-admission:exception-approvers; "
                   "system:masters and kube-system's service accounts always may)")  # fmt: skip
    sc = p.add_argument_group("background scan (docs/deploy.md, Scan; off by default)")
    sc.add_argument("--scan-interval", type=float, default=0.0, metavar="SECONDS",
                    help="judge every workload of the cluster this often and after each policy change, as "
                    "metrics (0: off, the default; at least 60)")  # fmt: skip
    sc.add_argument("--scan-qps", type=float, default=2.0, metavar="X",
                    help="list requests per second of a scan at most (default 2)")  # fmt: skip
    sc.add_argument("--scan-page-size", type=int, default=100, metavar="N",
                    help="objects per list request of a scan (default 100)")  # fmt: skip
    p.add_argument(
        "--ledger-window",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="the post-launch ledger: a job not fully bound this long after its first pod is final "
        "(partly or never bound); 0 turns the ledger off (default 600)",
    )
    p.add_argument(
        "--ledger-lease",
        default=LEDGER_LEASE,
        metavar="[NAMESPACE/]NAME",
        help="the Lease that elects the one replica whose ledger counts jobs and writes their follow-ups, in the "
        f"server's own namespace unless given (default {LEDGER_LEASE}); '' for none: a single replica, always "
        "counting (docs/deploy.md, Ledger leader)",
    )
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
        self.warnings: tuple[str, ...] = ()
        self.expired = False
        self.key_exposed = False
        self._warned_at = 0.0
        self.check()

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
            self.check()
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
            self.check()

    def check(self, now: float | None = None) -> tuple[str, ...]:
        """The serving certificate's problems that do not stop serving: expired, or a key others can read.
        Logged as warnings when they change and once an hour while they last; /readyz and metrics show them."""
        from certs.store import key_exposure

        current = time.time() if now is None else now
        found = []
        self.expired = bool(self._not_after) and current >= self._not_after
        if self.expired:
            when = datetime.fromtimestamp(self._not_after, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            found.append(f"serving certificate {self.cert} expired at {when}: the API server rejects it; rotate it")
        exposed = key_exposure(self.key)
        self.key_exposed = exposed is not None
        if exposed:
            found.append(exposed)
        warnings = tuple(found)
        if warnings and (warnings != self.warnings or current - self._warned_at >= 3600):
            for w in warnings:
                log.warning("certificate problem", extra={"warning": w})
            self._warned_at = current
        self.warnings = warnings
        return warnings

    def status(self) -> dict[str, Any]:
        return {
            "loaded": True,
            "notAfterUnix": self._not_after,
            "expired": self.expired,
            "keyExposed": self.key_exposed,
            "warnings": list(self.warnings),
            "reloads": self.reloads,
            "error": self.error,
        }

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


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (as Go programs do) and return it: a container's usual
    soft limit of 1,024 is what ~1,000 idle connections exhausted."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return int(soft)


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    for flag in (
        "max_header_bytes",
        "header_timeout",
        "body_timeout",
        "idle_timeout",
        "keepalive_timeout",
        "handshake_timeout",
    ):
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive")
    files = raise_open_file_limit()
    max_connections = args.max_connections or max(16, files - 128)  # files for the rest: audit, watches, TLS
    return ConnectionLimits(
        max_header_bytes=args.max_header_bytes,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        keepalive_timeout=args.keepalive_timeout,
        max_connections=max_connections,
        handshake_timeout=args.handshake_timeout,
    )


def background_scan(args: argparse.Namespace, client: Any, state: Any, metrics: Any) -> Any:
    """The Scanner of --scan-interval (None: off), with its metrics registered."""
    if not args.scan_interval:
        return None
    from webhook import scan as scan_mod
    from webhook.scanner import Scanner

    if client is None:
        raise UsageError("--scan-interval needs a cluster (a kubeconfig, or in-cluster credentials)")
    if not (0.1 <= args.scan_qps <= 1000 and 1 <= args.scan_page_size <= 10_000):
        raise UsageError("--scan-qps must be 0.1-1000 and --scan-page-size 1-10000")
    try:
        scanner = Scanner(client, state, args.scan_interval, scan_mod.Limits(args.scan_page_size, args.scan_qps))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    scanner.register(metrics)
    return scanner


def lease_ref(value: str) -> tuple[str, str]:
    """(namespace or "", name) of --ledger-lease; UsageError when it is neither NAME nor NAMESPACE/NAME."""
    ns, _, name = value.rpartition("/")
    if "/" in ns or not name or value.startswith("/"):
        raise UsageError(f"--ledger-lease {value!r}: expected NAME or NAMESPACE/NAME")
    return ns, name


def ledger_elector(args: argparse.Namespace, client: Any, tracker: Any) -> Any:
    """The Elector of --ledger-lease for the tracker (None: no election), on a client of its own whose
    requests end well within the renew deadline."""
    if not args.ledger_lease or tracker is None:
        return None
    import socket
    import uuid

    from cluster.kubeclient import KubeClient
    from cluster.lease import Elector, LeaseConfig

    ns, name = lease_ref(args.ledger_lease)
    # hostname: the pod's name in a cluster; a random suffix tells a restarted process from its predecessor
    lease = LeaseConfig(ns or client.config.namespace, name, f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}")

    def changed(leader: bool, previous: Any) -> None:
        if leader:
            tracker.promote(previous.renewed if previous is not None else None)

    elector = Elector(KubeClient(client.config, timeout=lease.renew_deadline / 2), lease, on_change=changed)
    tracker.attach(leading=lambda: elector.leader)
    return elector


def _ready_details(scanner: Any, elector: Any) -> Any:
    """/readyz's extra details: the scan's and the ledger leadership's (neither makes the server unready)."""
    if scanner is None and elector is None:
        return None

    def details() -> tuple[bool, dict[str, Any]]:
        out: dict[str, Any] = {}
        if scanner is not None:
            out["scan"] = scanner.details()
        if elector is not None:
            out["ledgerLeader"] = elector.status()
        return True, out

    return details


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from certs.errors import CertError
    from policies.protect import DEFAULT_GROUP
    from webhook import audit as audit_mod
    from webhook.app import ServerConfig, create_app, fast_path
    from webhook.guard import guarded_protocol, handshake_bounded_loop
    from webhook.metrics import Metrics
    from webhook.state import State, pod_fetcher

    setup_logging(args.log_level)
    if args.ledger_lease:
        lease_ref(args.ledger_lease)  # a bad value is refused before anything starts
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
        from webhook.manifests import ManifestError
        from webhook.nodefile import load_node_file

        try:
            state.set_nodes(load_node_file(args.nodes), f"file:{args.nodes}")
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
        if args.ledger_window > 0:
            from webhook import ledger as ledger_mod

            state.ledger = ledger_mod.for_state(state, args.ledger_window)
        state.watch_pods(client)  # before watch_dra: the claims it watches are counted into the pod view
        state.fetch_pod = pod_fetcher(client)  # the bind check's read of a pod its watch has not delivered
        state.watch_dra(client, slices=not args.nodes)
        state.watch_exceptions(client)
    elif cm:
        raise UsageError("--policy-configmap needs a cluster (drop --no-kube)")
    audit = audit_mod.from_args(args)
    _install_fault(args.fault_injection)
    cfg = ServerConfig(
        max_body=args.max_body,
        max_inflight=args.max_inflight,
        max_bytes_inflight=args.max_bytes_inflight,
        policy_configmap=cm,
        cert_status=reloader.status,
        exception_groups=tuple(args.exception_group or (DEFAULT_GROUP,)),
        native=_native_rules(args.native_mutations) if args.native else frozenset(),
    )
    metrics = Metrics()
    scanner = background_scan(args, client, state, metrics)
    elector = ledger_elector(args, client, state.ledger)
    cfg.extra_ready = _ready_details(scanner, elector)
    if state.ledger is not None:
        from webhook.ledger import follow_up

        write = (lambda row: audit.record(follow_up(row))) if audit is not None else None
        state.ledger.attach(metrics, write)
    app = create_app(state, metrics=metrics, audit=audit, config=cfg)
    if scanner is not None:
        scanner.start()
    if elector is not None:
        elector.start()
    limits = connection_limits(args)
    metrics.describe("gpu_admission_connections_closed_total", "counter", "Connections closed by a limit, by reason")
    loop_factory = handshake_bounded_loop(limits.handshake_timeout)

    class Config(uvicorn.Config):
        def get_loop_factory(self) -> Any:
            return loop_factory  # uvloop, with a bound on TLS handshakes

    config = Config(
        fast_path(app),
        host=args.host,
        port=args.port,
        # httptools, one TLS record and one send per response (webhook/transport.py), with the connection
        # limits of webhook/guard.py
        http=guarded_protocol(
            limits, lambda reason: metrics.inc("gpu_admission_connections_closed_total", (("reason", reason),))
        ),
        ws="none",  # no WebSocket endpoints: an Upgrade request is answered as plain HTTP
        log_config=None,
        access_log=False,
        timeout_keep_alive=max(1, round(limits.idle_timeout)),
        timeout_graceful_shutdown=25,  # in-flight reviews (a review's deadline is at most 30 s)
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
            if elector is not None:  # hand the ledger to another replica now, off the event loop
                threading.Thread(target=elector.release, name="lease-release", daemon=True).start()
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
        if elector is not None:
            elector.release()
        state.stop()
        if audit is not None:
            audit.close(timeout=10)
    # Everything is written (audit log closed, log lines flushed below): skip the interpreter's teardown of
    # the heap, which took ~1 s on a busy node and counts against the pod's termination grace period.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _native_rules(mutations: bool) -> frozenset[str]:
    from policies import native  # lazily, like every import here: `gpu-admission --help` stays fast

    # The mutations are skipped only where the current policy has them generated (native.native_mutations).
    return native.NATIVE_RULES | (frozenset(native.MAP_MUTATIONS) if mutations else frozenset())
