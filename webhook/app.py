"""The HTTP layer: parse the AdmissionReview, call the engine, serialise the answer. No decisions here.

Every answer goes out before the API server's `?timeout=` (an internal deadline with a margin), malformed
input gets a 400 with one line, and an overloaded server says so at once instead of queueing.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from cluster.kubeclient import KubeError
from cluster.pods import PodEntry
from policies import bindcheck
from policies import exceptions as exceptions_mod
from policies.document import Policy, PolicyError, parse_policy_text
from policies.engine import EXCEPTED, Review, ReviewContext, review
from policies.ledger import Admission, admitted_group
from policies.placement import Reservation
from policies.protect import DEFAULT_GROUP, enforcement_change
from policies.resources import GPU
from policies.userkeys import namespace_mode
from webhook import admission
from webhook.metrics import Metrics
from webhook.reservations import Graces
from webhook.state import POLICY_KEY, State
from webhook.transport import AHEAD_KEY

log = logging.getLogger("gpu-admission.server")

VERSION = "0.1.0"
DEFAULT_TIMEOUT = 10.0  # the API server's default timeoutSeconds
# A bind onto a reserved domain of a pod the pod view has not seen yet waits this long (seconds) for it, polling
# this often: the watch usually delivers a pod before the scheduler binds it; under load it can lag a little.
BIND_VIEW_WAIT = 0.3
BIND_VIEW_POLL = 0.01
# Then the pod is read from the API server (State.fetch_pod), for at most this long: the wait and the read stay
# under the bind webhook's 2 s timeout.
BIND_FETCH_TIMEOUT = 1.0
MAX_TIMEOUT = 30.0


@dataclass
class ServerConfig:
    max_body: int = 8 * 2**20  # an object is at most ~3 MiB in etcd; object + oldObject fit well within
    max_inflight: int = 256
    # Request bytes held at once over all connections (bodies being read or decided); bodies up to
    # SMALL_BODY are not counted, so reviews of ordinary objects are never refused for bytes.
    max_bytes_inflight: int = 32 * 2**20
    deadline_margin: float = 0.25  # seconds kept back from the API server's timeout
    policy_configmap: tuple[str, str] | None = None  # (namespace, name) validated by /validate
    cert_status: Callable[[], dict[str, Any]] | None = None
    extra_ready: Callable[[], tuple[bool, dict[str, Any]]] | None = None
    draining: bool = False
    inflight: int = field(default=0)
    backlog: Callable[[], int] | None = None  # requests queued or running in the HTTP server
    # Groups whose members may change the namespace enforcement label (besides system:masters, kube-system).
    exception_groups: tuple[str, ...] = (DEFAULT_GROUP,)
    # Rules ValidatingAdmissionPolicies judge in the API server (`serve --native`, policies/native.py).
    native: frozenset[str] = frozenset()


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def _error(status: int, message: str) -> Response:
    return Response(_error_body(message), status_code=status, media_type="application/json")


_JSON_HEADERS = [(b"content-type", b"application/json")]
_CLOSE = [(b"connection", b"close")]  # the rest of the body was not read: the connection cannot be reused
SMALL_BODY = 64 * 1024  # a Pod is a few KiB; max_inflight bodies this small take at most 16 MiB


class ByteBudget:
    """Request bytes held by the server at once, over all connections (`--max-bytes-inflight`).

    Without it, 40 connections each sending a body just under --max-body took the server to 411 MiB. Only
    the event loop touches it, so no lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


# /admit mutates and then judges the mutated object in one review: the one call per Pod (docs/deploy.md,
# "One call per pod"). /mutate and /validate are the two stages for workload templates and other kinds. /bind
# judges the scheduler's binds (reserved-bind): every pod's, so counted apart from the reviews of objects.
_ADMISSION_PATHS = {"/admit": "admit", "/mutate": "mutate", "/validate": "validate", "/bind": "bind"}


def fast_path(app: FastAPI) -> Any:
    """An ASGI wrapper that answers POST /admit, /mutate and /validate directly and hands everything else to
    FastAPI. The admission path is the hot one (every pod create); FastAPI's routing and dependency
    machinery cost more than the decision itself, and the handler (`review_bytes`) is the same either way."""
    review_bytes = app.state.review_bytes
    max_body: int = app.state.max_body
    budget: ByteBudget = app.state.byte_budget
    metrics: Metrics = app.state.metrics

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        webhook = _ADMISSION_PATHS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if webhook is None or scope.get("method") != "POST":
            await app(scope, receive, send)
            return
        answer = await read_and_review(scope, receive, webhook)
        if answer is None:
            return  # the client went away
        status, payload, unread = answer
        headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode()), *(_CLOSE if unread else ())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def read_and_review(scope: dict[str, Any], receive: Any, webhook: str) -> tuple[int, bytes, bool] | None:
        """(status, body, whether the request body was left unread) for one admission POST; None when the
        client went away. Bodies past SMALL_BODY are charged to the byte budget while they are held."""
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), b"")
        if declared.isdigit() and int(declared) > max_body:
            metrics.inc("gpu_admission_bad_requests_total", (("reason", "too-large"),))
            return (
                413,
                _error_body(f"request body of {declared.decode()} bytes exceeds the {max_body}-byte limit"),
                True,
            )
        if declared.isdigit() and int(declared) > SMALL_BODY and budget.used + int(declared) > budget.limit:
            return 429, _over_budget(), True
        chunks: list[bytes] = []
        size = held = 0
        try:
            more = True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                more = message.get("more_body", False)
                if size > max_body:
                    metrics.inc("gpu_admission_bad_requests_total", (("reason", "too-large"),))
                    return 413, _error_body(f"request body exceeds the {max_body}-byte limit"), more
                if size > SMALL_BODY:
                    if not budget.take(size - held):
                        return 429, _over_budget(), more
                    held = size
                chunks.append(chunk)
            timeout = None
            for part in scope.get("query_string", b"").decode("latin-1").split("&"):
                if part.startswith("timeout="):
                    timeout = part[len("timeout=") :]
            status, payload = await review_bytes(b"".join(chunks), webhook, timeout, scope.get(AHEAD_KEY))
            return status, payload, False
        finally:
            budget.give(held)

    def _over_budget() -> bytes:
        metrics.inc("gpu_admission_bad_requests_total", (("reason", "overloaded"),))
        return _error_body(f"overloaded: request bytes in flight would pass the {budget.limit}-byte limit; retry")

    return asgi


class DeadlineExceeded(BaseException):
    """Raised inside the engine by SIGALRM when a review runs past its deadline."""


class Watchdog:
    """Run the engine inline on the event loop, preempted at the deadline by a real-time timer.

    Handing each review to a worker thread cost more than the review itself (a GIL hand-off and a future
    per request, ~150 µs measured against ~70 µs of engine time). Inline is fast, but a slow rule would then
    stall the loop: SIGALRM interrupts it at the deadline (Python runs signal handlers in the main thread
    between bytecodes, and interrupted sleeps end), so the API server still gets its answer in time.
    """

    def __init__(self) -> None:
        self._armed = False
        self._installed = False

    def usable(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        if not self._installed:
            signal.signal(signal.SIGALRM, self._fire)
            self._installed = True
        return True

    def _fire(self, signum: int, frame: Any) -> None:
        if self._armed:  # a late tick after the review finished is ignored
            self._armed = False
            raise DeadlineExceeded

    def run(self, fn: Callable[[], Review], seconds: float) -> Review:
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn()
        finally:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)


def parse_timeout(raw: str | None) -> float:
    """The API server's `?timeout=10s` (also accepts `500ms`, `1m`); the default when absent or odd."""
    if not raw:
        return DEFAULT_TIMEOUT
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0))
    for suffix, scale in units:
        if raw.endswith(suffix):
            try:
                value = float(raw[: -len(suffix)]) * scale
            except ValueError:
                return DEFAULT_TIMEOUT
            return min(max(value, 0.05), MAX_TIMEOUT)
    return DEFAULT_TIMEOUT


def create_app(
    state: State,
    *,
    metrics: Metrics | None = None,
    audit: Any = None,
    config: ServerConfig | None = None,
) -> FastAPI:
    cfg = config or ServerConfig()
    m = metrics or Metrics()
    pool = ThreadPoolExecutor(max_workers=cfg.max_inflight, thread_name_prefix="review")
    watchdog = Watchdog()
    app = FastAPI(title="gpu-admission", version=VERSION, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = cfg
    app.state.metrics = m
    app.state.gpu_state = state

    async def review_bytes(
        body: bytes, webhook: str, timeout_raw: str | None, ahead: int | None = None
    ) -> tuple[int, bytes]:
        """One admission review, from the raw body to (HTTP status, JSON body): the whole web layer."""
        started = time.perf_counter()
        if len(body) > cfg.max_body:
            m.inc("gpu_admission_bad_requests_total", (("reason", "too-large"),))
            return 413, _error_body(f"request body exceeds the {cfg.max_body}-byte limit")
        try:
            req = admission.parse(body)
        except admission.BadRequest as exc:
            m.inc("gpu_admission_bad_requests_total", (("reason", "malformed"),))
            log.warning("bad admission request", extra={"webhook": webhook, "error": str(exc)})
            return 400, _error_body(str(exc))
        # `ahead`: requests pending when this one arrived (stamped by webhook/transport.py), so a burst over the
        # limit serves its head and sheds its tail. Unstamped (another HTTP protocol): everything pending now.
        if ahead is None:
            pending = max(cfg.inflight, cfg.backlog() if cfg.backlog is not None else 0)
        else:
            pending = max(cfg.inflight, ahead) + 1
        if pending > cfg.max_inflight:
            # Shed at once rather than answer after the API server gave up: it applies failurePolicy now.
            m.inc("gpu_admission_bad_requests_total", (("reason", "overloaded"),))
            return 429, _error_body(f"overloaded: {pending} reviews in flight (limit {cfg.max_inflight})")
        timeout = parse_timeout(timeout_raw)
        deadline = max(timeout - cfg.deadline_margin, timeout * 0.5)
        cfg.inflight += 1
        try:
            out, record = await decide(req, webhook, deadline)
        finally:
            cfg.inflight -= 1
        elapsed = time.perf_counter() - started
        resp = out["response"]
        verdict = "deny" if not resp["allowed"] else ("warn" if resp.get("warnings") else "allow")
        m.inc("gpu_admission_requests_total", (("webhook", webhook), ("verdict", verdict)))
        m.observe(elapsed, (("webhook", webhook),))
        if record is not None and audit is not None:
            record["verdict"] = verdict
            record["latencyMs"] = round(elapsed * 1000, 3)
            audit.record(record)
        if record is not None and state.ledger is not None and record.get("group") and not req.dry_run:
            state.ledger.admitted(record["group"], _admission(record, verdict))
        return 200, orjson.dumps(out)

    app.state.review_bytes = review_bytes
    app.state.max_body = cfg.max_body
    app.state.byte_budget = ByteBudget(cfg.max_bytes_inflight)

    async def handle(request: Request, webhook: str) -> Response:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > cfg.max_body:
            return _error(413, f"request body of {declared} bytes exceeds the {cfg.max_body}-byte limit")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cfg.max_body:
                return _error(413, f"request body exceeds the {cfg.max_body}-byte limit")
            chunks.append(chunk)
        status, payload = await review_bytes(b"".join(chunks), webhook, request.query_params.get("timeout"))
        return Response(payload, status_code=status, media_type="application/json")

    async def decide(req: admission.Request, webhook: str, deadline: float) -> tuple[dict[str, Any], Any]:
        snap = state.snapshot()
        policy = snap.policy
        obj = req.object
        if req.operation in ("DELETE", "CONNECT") or not isinstance(obj, dict):
            return admission.response(req.uid, allowed=True), None
        if webhook == "validate" and obj.get("kind") == "ConfigMap":
            return _policy_configmap(req, obj), None
        if webhook == "validate" and obj.get("kind") == "Namespace":
            return _namespace_label(req, obj, webhook, policy.hash)
        if webhook == "validate" and exceptions_mod.is_exception(obj):
            return _exception_object(req, obj), None
        if webhook == "bind":
            return await _binding(req, obj, snap)  # (anything but a Binding has no target node: allowed there)
        if obj.get("kind") == "Pod" and req.operation != "CREATE":
            return admission.response(req.uid, allowed=True), None  # pod specs are immutable after create
        ns = req.namespace or _meta(obj, "namespace")
        capacity = state.capacity()
        now = time.time()
        ctx = ReviewContext(
            namespace_labels=snap.namespaces.get(ns),
            resolve=snap.resolve,
            operation=req.operation,
            namespace=ns,
            capacity=capacity,
            reservations=state.reservations.active(),
            exceptions=state.exceptions_in(ns),
            now=now,
            native=cfg.native,
        )

        def run() -> Review:
            return review(
                obj,
                policy=policy,
                inventory=snap.inventory,
                ctx=ctx,
                mutate=webhook != "validate",
                validate=webhook != "mutate",
            )

        try:
            if watchdog.usable():
                r = watchdog.run(run, deadline)
            else:  # not the main thread (an embedding test client): a worker thread, awaited with a timeout
                loop = asyncio.get_running_loop()
                r = await asyncio.wait_for(loop.run_in_executor(pool, run), timeout=deadline)
        except (TimeoutError, DeadlineExceeded):
            return _failure(req, webhook, policy.failure_mode, policy.hash, f"no decision within {deadline:.2f}s")
        except Exception as exc:  # the engine never raises; if it ever does, the policy's failure mode decides
            log.exception("review failed", extra={"uid": req.uid})
            return _failure(req, webhook, policy.failure_mode, policy.hash, f"internal error ({type(exc).__name__})")
        if r.expired:
            state.report_expired(now, r.expired)
        for rule, ref in r.excepted:
            m.inc("gpu_admission_exceptions_applied_total", (("exception", ref), ("rule", rule)))
        for res in r.results:
            if res.outcome in ("deny", "warn", "audit", "error", EXCEPTED):
                m.inc("gpu_admission_rule_results_total", (("rule", res.rule), ("outcome", res.outcome)))
            if res.outcome == "error":
                log.error("rule failed", extra={"uid": req.uid, "rule": res.rule, "detail": res.message})
        for mid in r.mutations:
            m.inc("gpu_admission_mutations_total", (("mutation", mid),))
        if r.placement is not None and r.allowed and webhook != "validate" and not req.dry_run:
            state.reservations.record(r.placement, policy.reservation_seconds, graces(policy))  # dry runs: nothing
        if webhook == "mutate":
            allowed = r.allowed  # only an internal error failing closed denies at the mutating stage
            out = admission.response(
                req.uid,
                allowed=allowed,
                message=r.denial_message(),
                patch=r.patch if allowed else (),
                warnings=r.warnings if any(x.outcome == "error" for x in r.results) else (),
                audit=_audit_annotations(r),
            )
        else:  # validate, or admit (the verdict on the mutated object, with the patch that produced it)
            out = admission.response(
                req.uid,
                allowed=r.allowed,
                message=r.denial_message(),
                patch=r.patch if r.allowed and webhook == "admit" else (),
                warnings=r.warnings,
                audit=_audit_annotations(r),
            )
        return out, _record(req, webhook, r)

    async def _binding(req: admission.Request, obj: dict[str, Any], snap: Any) -> tuple[dict[str, Any], Any]:
        """A pod's bind (pods/binding): refused only when it takes GPUs of another job's reservation
        (policies/bindcheck.py). Never an error: whatever cannot be judged is allowed."""
        policy = snap.policy
        ns = req.namespace or _meta(obj, "namespace")
        name = req.name or _meta(obj, "name")
        held = state.reservations.active()
        mode, _ = namespace_mode(snap.namespaces.get(ns), policy.default_enforcement)
        if mode != "enforce":
            held = ()  # the namespace's pods are not judged (enforcement warn, audit or off)
        pod = None
        if held:
            entry = await _seen_pod(ns, name, obj, snap, held)
            pod = bindcheck.pod_of(ns, name, dict(entry.gpus), entry.job, GPU) if entry is not None else None
        verdict = bindcheck.check(obj, pod, snap.inventory, state.capacity(), held, policy.reservation_seconds)
        outcome = "pass" if verdict.allowed else "deny"
        m.inc("gpu_admission_bind_checks_total", (("outcome", outcome), ("reason", verdict.reason)))
        if verdict.allowed:
            return admission.response(req.uid, allowed=True), None
        log.info("bind refused", extra={"uid": req.uid, "pod": f"{ns}/{name}", "detail": verdict.message})
        rec = _base_record(req, "bind")
        rule = {"rule": bindcheck.RULE, "action": "enforce", "outcome": "deny", "message": verdict.message}
        rec.update(rules=[rule], policyHash=policy.hash)
        return admission.response(req.uid, allowed=False, message=verdict.message), rec

    async def _seen_pod(ns: str, name: str, binding: Any, snap: Any, held: tuple[Reservation, ...]) -> PodEntry | None:
        """The pod view's entry of the pod being bound. A pod created a moment ago may not be in the view yet
        (its watch event on the way): when the bind could break a reservation, wait for it up to
        BIND_VIEW_WAIT, well under the bind webhook's 2 s timeout. None: no GPU pod, or not seen in time."""
        entry = state.pod_entry(ns, name)
        if entry is not None or not bindcheck.at_stake(binding, snap.inventory, held):
            return entry
        deadline = time.monotonic() + BIND_VIEW_WAIT
        while entry is None and time.monotonic() < deadline:
            await asyncio.sleep(BIND_VIEW_POLL)  # other requests are served meanwhile
            entry = state.pod_entry(ns, name)
        result = "seen" if entry is not None else "not-seen"
        if entry is None and state.fetch_pod is not None:
            entry, result = await _fetched_pod(state.fetch_pod, ns, name)
        m.inc("gpu_admission_bind_view_waits_total", (("result", result),))
        return entry

    async def _fetched_pod(
        fetch: Callable[[str, str], PodEntry | None], ns: str, name: str
    ) -> tuple[PodEntry | None, str]:
        """The pod read from the API server, when its watch event is later than the wait (a loaded watch can be
        seconds behind a scheduler that binds within a second of the pod's creation). A failed or slow read
        leaves the pod unseen: the bind is allowed, as the check allows whatever it cannot judge."""
        try:
            got = asyncio.get_running_loop().run_in_executor(pool, fetch, ns, name)
            entry = await asyncio.wait_for(got, BIND_FETCH_TIMEOUT)
        except (KubeError, OSError, TimeoutError, ValueError) as exc:
            log.info("bind check: pod not read", extra={"pod": f"{ns}/{name}", "error": str(exc)})
            return None, "fetch-failed"
        return entry, "fetched" if entry is not None else "not-seen"

    def _failure(
        req: admission.Request, webhook: str, mode: str, policy_hash: str, why: str
    ) -> tuple[dict[str, Any], Any]:
        m.inc("gpu_admission_rule_results_total", (("rule", "engine"), ("outcome", "error")))
        log.error("failing " + mode, extra={"uid": req.uid, "webhook": webhook, "reason": why})
        if mode == "closed":
            out = admission.response(
                req.uid,
                allowed=False,
                message=f"gpu-admission: {why}; failing closed per policy. Retry, or ask the platform team",
                audit={"decision": "deny", "policy-hash": policy_hash, "error": why},
            )
        else:
            out = admission.response(
                req.uid,
                allowed=True,
                warnings=[f"gpu-admission: {why}; allowed unchecked (failing open per policy)"],
                audit={"decision": "allow", "policy-hash": policy_hash, "error": why},
            )
        rec = _base_record(req, webhook)
        rec.update(
            rules=[{"rule": "engine", "action": mode, "outcome": "error", "message": why}], policyHash=policy_hash
        )
        return out, rec

    def _namespace_label(
        req: admission.Request, obj: dict[str, Any], webhook: str, policy_hash: str
    ) -> tuple[dict[str, Any], Any]:
        """The enforcement label may change only by a trusted group's member (policies/protect.py)."""
        denial = enforcement_change(obj, req.old_object, req.groups, cfg.exception_groups)
        outcome = "deny" if denial else "pass"
        m.inc("gpu_admission_rule_results_total", (("rule", "namespace-enforcement-label"), ("outcome", outcome)))
        rec = _base_record(req, webhook)
        rule = {"rule": "namespace-enforcement-label", "action": "enforce", "outcome": outcome, "message": denial or ""}
        rec.update(rules=[rule], policyHash=policy_hash)
        if denial:
            log.warning("namespace label change refused", extra={"user": req.user, "namespace": req.name})
            return admission.response(req.uid, allowed=False, message=denial, code=403), rec
        return admission.response(req.uid, allowed=True), rec

    def _exception_object(req: admission.Request, obj: dict[str, Any]) -> dict[str, Any]:
        """What the CRD schema cannot check (it has no clock): `until` ahead, within MAX_DAYS. The schema
        checked the rest; parse again anyway so a CRD installed without its schema still gets field paths."""
        ns = req.namespace or _meta(obj, "namespace")
        try:
            e = exceptions_mod.parse(obj, namespace=ns)
            errors = exceptions_mod.check_until(e, time.time())
        except exceptions_mod.ExceptionError as exc:
            errors = exc.errors
        if not errors:
            return admission.response(req.uid, allowed=True)
        name = req.name or _meta(obj, "name")
        message = f"{exceptions_mod.KIND} {ns}/{name} is invalid: {'; '.join(errors[:5])}"
        return admission.response(req.uid, allowed=False, message=message, code=422)

    def _policy_configmap(req: admission.Request, obj: dict[str, Any]) -> dict[str, Any]:
        target = cfg.policy_configmap
        ns = req.namespace or _meta(obj, "namespace")
        if target is None or (ns, _meta(obj, "name")) != target:
            return admission.response(req.uid, allowed=True)
        raw = obj.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        text = data.get(POLICY_KEY)
        if not isinstance(text, str):
            return admission.response(
                req.uid, allowed=False, message=f"policy ConfigMap must have a data key {POLICY_KEY!r}", code=422
            )
        try:
            policy = parse_policy_text(text)
        except PolicyError as exc:
            shown = "; ".join(exc.errors[:5]) + (f" (+{len(exc.errors) - 5} more)" if len(exc.errors) > 5 else "")
            return admission.response(
                req.uid, allowed=False, message=f"invalid policy in {POLICY_KEY}: {shown}", code=422
            )
        return admission.response(req.uid, allowed=True, audit={"policy-hash": policy.hash})

    @app.post("/admit")
    async def admit(request: Request) -> Response:
        return await handle(request, "admit")

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        return await handle(request, "mutate")

    @app.post("/validate")
    async def validate(request: Request) -> Response:
        return await handle(request, "validate")

    @app.post("/bind")
    async def bind(request: Request) -> Response:
        return await handle(request, "bind")

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        ok, details = state.ready()
        if cfg.cert_status is not None:
            certs = cfg.cert_status()
            details["certificates"] = certs
            ok = ok and bool(certs.get("loaded"))
        if cfg.extra_ready is not None:
            more_ok, more = cfg.extra_ready()
            details.update(more)
            ok = ok and more_ok
        if cfg.draining:
            ok = False
            details["draining"] = True
        details["ready"] = ok
        return _json(details, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(m.render(), media_type="text/plain; version=0.0.4")

    @app.get("/version")
    async def version() -> Response:
        return _json({"version": VERSION, "policyHash": state.snapshot().policy.hash})

    _register_gauges(m, state, audit, cfg)
    return app


def graces(policy: Policy) -> Graces:
    """The policy's graces for reservations of gangs that will not bind soon (webhook/reservations.py)."""
    return Graces(no_pods=policy.no_pods_grace_seconds, waiting=policy.waiting_grace_seconds)


def _meta(obj: dict[str, Any], key: str) -> str:
    meta = obj.get("metadata")
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, str) else ""


def _audit_annotations(r: Review) -> dict[str, str]:
    """Keys without '/', at most 63 characters (the API server prefixes them with the webhook name)."""
    out = {"decision": r.verdict, "policy-hash": r.policy_hash}
    flagged = [f"{x.rule}={x.outcome}" for x in r.results if x.outcome in ("deny", "warn", "audit", "error", EXCEPTED)]
    if flagged:
        out["rules"] = ",".join(flagged)
    if r.mutations:
        out["mutations"] = ",".join(r.mutations)
    if r.exceptions:
        out["exceptions"] = ",".join(r.exceptions)[:4096]
    return out


def _base_record(req: admission.Request, webhook: str) -> dict[str, Any]:
    obj = req.object if isinstance(req.object, dict) else {}
    return {
        "time": _now(),
        "uid": req.uid,
        "dryRun": req.dry_run,
        "webhook": webhook,
        "user": req.user,
        "groups": list(req.groups),
        "operation": req.operation,
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind") or req.kind,
        "namespace": req.namespace or _meta(obj, "namespace"),
        "name": req.name or _meta(obj, "name") or _meta(obj, "generateName"),
    }


def _record(req: admission.Request, webhook: str, r: Review) -> dict[str, Any] | None:
    if not r.handled or (not r.results and not r.mutations):
        return None  # nothing GPU-related was decided: keep the log about GPU workloads
    rec = _base_record(req, webhook)
    rec.update(
        workload=r.workload,
        rules=[
            {"rule": x.rule, "action": x.action, "outcome": x.outcome, "message": x.message}
            for x in r.results
            if x.action != "mutate"
        ],
        mutations=list(r.mutations),
        warnings=list(r.warnings),
        patch=list(r.patch),
        policyHash=r.policy_hash,
    )
    if r.exceptions or r.expired:
        rec.update(exceptions=list(r.exceptions), expiredExceptions=list(r.expired))
    obj = req.object if isinstance(req.object, dict) else {}
    rec["group"] = admitted_group(str(rec["kind"] or ""), str(rec["namespace"]), _meta(obj, "name"), obj)
    return rec


def _admission(rec: dict[str, Any], verdict: str) -> Admission:
    """What the ledger keeps of a decision: uid, time, verdict, the rules that fired and the mutations."""
    fired = [x["rule"] for x in rec["rules"] if x["outcome"] in ("deny", "warn", "audit", "error")]
    rules = tuple(dict.fromkeys([*fired, *rec["mutations"]]))
    return Admission(rec["uid"], time.time(), verdict, rules, rec.get("workload") or "unclassified")


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _register_gauges(m: Metrics, state: State, audit: Any, cfg: ServerConfig) -> None:
    m.gauge(
        "gpu_admission_policy_info",
        "The active policy (hash label); 1",
        lambda: [((("hash", state.snapshot().policy.hash), ("source", state.status.policy_source)), 1.0)],
    )
    m.gauge(
        "gpu_admission_policy_reload_failures_total",
        "Policy edits rejected (the last good policy kept serving)",
        lambda: [((), float(state.status.reload_failures))],
        kind="counter",
    )
    m.gauge(
        "gpu_admission_gpu_nodes",
        "GPU nodes in the inventory",
        lambda: [((), float(state.snapshot().inventory.node_count))],
    )
    m.gauge("gpu_admission_inflight", "Reviews being decided now", lambda: [((), float(cfg.inflight))])

    def exception_counts() -> list[tuple[tuple[tuple[str, str], ...], float]]:
        expired = state.report_expired(time.time())  # also logs each newly expired one, once
        snap = state.exceptions.snapshot()
        return [
            ((("state", "active"),), float(len(snap) - expired)),
            ((("state", "expired"),), float(expired)),
            ((("state", "invalid"),), float(len(snap.skipped))),
        ]

    m.gauge(
        "gpu_admission_exceptions",
        "GPUPolicyExceptions watched: active, expired (ignored; each logged once), invalid (left out)",
        exception_counts,
    )
    m.gauge(
        "gpu_admission_node_objects_clipped_total",
        "Node objects skipped, or fields of them dropped, at decode (reason: too-many-labels, label-too-long, "
        "bad-resource, no-name, not-an-object; limits in cluster/nodes.py)",
        lambda: [((("reason", k),), float(v)) for k, v in sorted(state.node_transform.snapshot().items())],
        kind="counter",
    )
    m.gauge(
        "gpu_admission_node_label_sets",
        "Distinct node label sets (all labels but the hostname) shared by the nodes that carry them",
        lambda: [((), float(len(state.node_transform.label_sets)))],
    )
    m.gauge(
        "gpu_admission_node_labels_unshared_total",
        "Nodes given labels of their own because the shared label sets were at their bound (cluster/labelsets.py)",
        lambda: [((), float(state.node_transform.label_sets.unshared))],
        kind="counter",
    )

    def node_batches() -> list[tuple[tuple[tuple[str, str], ...], float]]:
        b = state.node_batches
        if b is None:
            return []
        unchanged = state.node_events_unchanged
        return [
            ((("counter", "received"),), float(b.received + unchanged)),
            ((("counter", "unchanged"),), float(unchanged)),
            ((("counter", "applied"),), float(b.applied)),
            ((("counter", "batches"),), float(b.batches)),
        ]

    m.gauge(
        "gpu_admission_node_events_total",
        "Node events received from the watch, those changing nothing the inventory reads (dropped), those applied "
        "to the inventory after coalescing, and batches applied",
        node_batches,
        kind="counter",
    )
    m.gauge(
        "gpu_admission_node_batch_seconds_total",
        "Time spent applying node event batches to the inventory",
        lambda: [((), state.node_batches.apply_seconds)] if state.node_batches is not None else [],
        kind="counter",
    )
    m.gauge(
        "gpu_admission_pod_view_skipped_total",
        "Pod objects the pod view could not read (skipped, not counted as holding GPUs)",
        lambda: [((), float(state.pods.skipped if state.pods is not None else 0))],
        kind="counter",
    )
    m.gauge(
        "gpu_admission_pod_view_gpu_pods",
        "GPU pods in the pod view (placement's capacity view)",
        lambda: [((), float(state.pods.snapshot().pods if state.pods is not None else 0))],
    )
    m.gauge(
        "gpu_admission_placement_reservations",
        "Jobs whose pinned domain holds GPUs reserved until their pods bind",
        lambda: [((), float(len(state.reservations.active())))],  # ends what ended since the last review
    )
    m.gauge(
        "gpu_admission_placement_reservations_ended_total",
        "Reservations ended, by reason: bound (all pods bound), expired (placement.reservationSeconds), "
        "unschedulable, gated, unscheduled (no scheduler tried its pods), no-pods (none seen), replaced, dropped",
        lambda: [((("reason", k),), float(v)) for k, v in sorted(state.reservations.ended.items())],
        kind="counter",
    )
    if cfg.cert_status is not None:
        status = cfg.cert_status

        def expiry() -> list[tuple[tuple[tuple[str, str], ...], float]]:
            s = status()
            return [((), float(s["notAfterUnix"]))] if s.get("notAfterUnix") else []

        m.gauge("gpu_admission_cert_expiry_timestamp_seconds", "Serving certificate notAfter (Unix time)", expiry)

        def problems() -> list[tuple[tuple[tuple[str, str], ...], float]]:
            s = status()
            return [
                ((("problem", "expired"),), float(bool(s.get("expired")))),
                ((("problem", "key-exposed"),), float(bool(s.get("keyExposed")))),
            ]

        m.gauge(
            "gpu_admission_cert_problem",
            "1 while the serving certificate has expired or its private key is readable by others",
            problems,
        )
    if audit is not None:

        def audit_stats() -> list[tuple[tuple[tuple[str, str], ...], float]]:
            return [((("counter", k),), float(v)) for k, v in audit.stats().items()]

        m.gauge("gpu_admission_audit_records", "Audit log counters (written, dropped, rotations, errors)", audit_stats)
