"""Experiments on the server without editing it: a `sitecustomize` put first on the server's PYTHONPATH.

These measure what a change to webhook/ or policies/ would buy before anyone makes it (docs/benchmarks.md
quotes them); they are never part of the product. Engine experiments (ENGINE_PATCHES) patch this process,
for the engine part. `--variant a+b` combines them. The baseline (no variant) is the product
exactly as shipped (uvloop + httptools, which the package requires; the server is started with the
benchmark's own interpreter).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.serverproc import ROOT

SNIPPETS = {
    # gc.collect() + gc.freeze() once the app is built: the objects of start-up (FastAPI, pydantic, the policy,
    # the inventory) leave the collector's generations, so a full collection no longer walks them.
    "gc-freeze": """
import gc as _gc
import webhook.app as _app
_create_app = _app.create_app
def _frozen_create_app(*a, **k):
    app = _create_app(*a, **k)
    _gc.collect()
    _gc.freeze()
    return app
_app.create_app = _frozen_create_app
""",
    # A shorter GIL switch interval (default 5 ms): a thread waiting for the GIL (the event loop while a review
    # runs in the pool, or the reverse) waits at most this long.
    "switchinterval": """
import sys as _sys
_sys.setswitchinterval(0.0005)
""",
    # uvicorn's own httptools protocol instead of webhook.transport's: head and body of every response as two
    # writes (two TLS records, two sends), as before the writes were coalesced.
    "uncoalesced": """
import webhook.transport as _transport
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpToolsProtocol
_transport.CoalescingHttpToolsProtocol = _HttpToolsProtocol
""",
    # Issue #14's hardening off, to measure what it costs: uvicorn's protocol without the connection limits of
    # webhook/guard.py (header size, timeouts, pipelining back-pressure, connection cap) ...
    "unguarded": """
import webhook.guard as _guard
import webhook.transport as _transport
_guard.guarded_protocol = lambda limits, on_close=None: _transport.CoalescingHttpToolsProtocol
""",
    # ... and without the nesting-depth check of every admission request (policies/limits.py).
    "no-depth-check": """
import webhook.admission as _admission
_admission.json_bytes_too_deep = lambda raw, limit=100: False
""",
    # Not an experiment, a probe (tests/soak.py summarises it): JSON lines on stderr for each event-loop stall of
    # 10 ms or more (`lag`: a 5 ms ticker's lateness, which waiting for a core on a loaded machine inflates;
    # `busy`: the loop thread's own CPU time between two ticks, which it does not), each garbage collection of
    # 1 ms or more (generation, thread), and each policy load and malloc_trim, with their milliseconds.
    "stall-log": """
import asyncio as _asyncio, gc as _gc, sys as _sys, threading as _threading, time as _time
import uvicorn as _uvicorn
import webhook.state as _state
def _probe(name, ms, **more):
    extra = "".join(',"%s":%s' % (k, v if isinstance(v, int) else '"%s"' % v) for k, v in more.items())
    _sys.stderr.write('{"probe":"%s","ms":%.2f,"t":%.3f%s}\\n' % (name, ms, _time.time(), extra))
_gc_started = [0.0]
def _gc_probe(phase, info):
    if phase == "start":
        _gc_started[0] = _time.perf_counter()
    elif (ms := (_time.perf_counter() - _gc_started[0]) * 1000) >= 1:
        _probe("gc", ms, gen=info["generation"], thread=_threading.current_thread().name)
_gc.callbacks.append(_gc_probe)
def _timed(name, fn):
    def timed(*a, **k):
        t = _time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            _probe(name, (_time.perf_counter() - t) * 1000)
    return timed
_state._trim = _timed("malloc_trim", _state._trim)
_state.State.set_policy = _timed("set_policy", _state.State.set_policy)
_startup = _uvicorn.Server.startup
async def _probed_startup(self, sockets=None):
    await _startup(self, sockets=sockets)
    loop = _asyncio.get_running_loop()
    cpu_at = [_time.thread_time()]
    def tick(due):
        now, cpu = loop.time(), _time.thread_time()
        if (lag := (now - due) * 1000) >= 10:
            _probe("lag", lag)
        if (busy := (cpu - cpu_at[0]) * 1000) >= 10:  # CPU of the loop thread itself: no wait for a core in it
            _probe("busy", busy)
        cpu_at[0] = cpu
        loop.call_at(now + 0.005, tick, now + 0.005)
    loop.call_at(loop.time() + 0.005, tick, loop.time() + 0.005)
_uvicorn.Server.startup = _probed_startup
""",
    # The audit writer without its linger: it writes what is queued as soon as it wakes (smaller batches,
    # more wake-ups and writes).
    "audit-linger-0": """
import functools as _functools
import webhook.audit as _audit
_audit.AuditLog.__init__ = _functools.partialmethod(_audit.AuditLog.__init__, linger=0.0)
""",
    # No audit log writes: records are dropped on the request path (an upper bound of what the audit log costs:
    # the record dict, the queue, waking the writer thread and its GIL hand-offs).
    "audit-off": """
import webhook.audit as _audit
_audit.AuditLog.record = lambda self, rec: True
""",
}


# In-process experiments on the engine (the engine part runs in this process): name -> apply, returning undo.
# (None now: cached-candidates became Inventory.candidates' own cache.)
ENGINE_PATCHES: dict[str, Callable[[], Callable[[], None]]] = {}


def engine_patch(spec: str) -> Callable[[], None]:
    """Apply the engine experiments of `spec`; returns one undo for all of them."""
    undos = [ENGINE_PATCHES[p]() for p in names(spec) if p in ENGINE_PATCHES]

    def undo() -> None:
        for u in reversed(undos):
            u()

    return undo


def names(spec: str) -> list[str]:
    parts = [p for p in spec.split("+") if p and p != "baseline"]
    unknown = [p for p in parts if p not in SNIPPETS and p not in ENGINE_PATCHES]
    if unknown:
        raise ValueError(f"unknown variant {unknown[0]!r} (known: {', '.join(SNIPPETS)})")
    return parts


def env_for(spec: str, root: Path | None = None) -> dict[str, str] | None:
    """The environment for a server process running variant `spec`, or None for the baseline; `root`: the
    source tree the server runs from (default this one; another checkout for an A/B of a change)."""
    parts = [p for p in names(spec) if p in SNIPPETS]
    if not parts and root is None:
        return None
    paths = [str(root or ROOT), os.environ.get("PYTHONPATH", "")]
    if parts:
        directory = Path(tempfile.mkdtemp(prefix="gpu-admission-variant-"))
        (directory / "sitecustomize.py").write_text("".join(SNIPPETS[p] for p in parts))
        paths.insert(0, str(directory))
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env
