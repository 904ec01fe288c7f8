"""What one client may hold of the server: the connection-level limits uvicorn's httptools protocol lacks.

Without them (issue #14), one 64 MiB header line was read in full while legitimate reviews waited seconds;
a connection that pipelined reviews for 3 s took the server from 61 to 429 MiB (uvicorn resumes reading
after every response, however many requests are queued); slow-header clients and TLS connections that never
sent a request stayed open forever, so ~1,000 of them under the usual 1,024 open files starved the server;
and on SIGTERM an idle keep-alive connection kept the process alive for the 25 s graceful timeout (a TLS
close waits for the peer's close_notify, which an idle client never sends).

`guarded_protocol(limits)` is `CoalescingHttpToolsProtocol` with, per connection:

- a header size limit: bytes received while a request's head is incomplete, beyond `max_header_bytes`,
  get 431 and the connection is closed (the count may run one read past the limit, never more);
- a header timeout (first byte of a request to the end of its headers) and a body timeout (end of headers to
  the last body byte): 408 and close; a stalled body also holds bytes of the in-flight budget (webhook/app.py);
- an idle timeout: a connection that has not sent a request yet is closed after `idle_timeout`, one that
  has been answered and sent nothing since after `keepalive_timeout` (longer than the 90 s a Go client such as
  the API server keeps an idle connection, so the client closes first: a close from our side can cross the
  client's next request on the wire, which the API server does not retry); by the sweep only (uvicorn's own
  keep-alive timer is off: its closes were not counted) and never while bytes wait unread in its socket: timers
  run before the loop reads, so after a stall a connection idle "too long" may already hold the client's next
  request, and closing it then lost that request (the client saw EOF: the soak's `transport` errors);
- back-pressure on pipelining: reading stays paused while a queued request waits, so a client cannot queue
  more than one read's worth of requests;
- a cap on open connections: a new connection past `max_connections` closes the least recently active
  connection that has no request in the application (or, when every one has, the new one);
- shutdown: connections with no request in the application are closed at once, and aborted if the TLS
  close has not finished after `close_linger`; busy ones are closed the same way after their response;
- a connection closed in the middle of a request (a 431, a 408, a 413 or 429 that left the body unread, a
  malformed request) is not read any further: reading stops, what was written goes out, and the connection
  is aborted after `close_linger` (`RefusingTransport`). A TLS close would read and decrypt everything the
  peer still sends until its close_notify.

A connection whose TLS handshake never completes never reaches the protocol (the loop's TLS layer calls
`connection_made` after the handshake), so none of the above sees it: `handshake_bounded_loop` makes the
event loop abort it after `handshake_timeout` (uvloop's default is 60 s).

Limits and their flags: docs/deploy.md, "Limits". Closed connections are counted by reason in
`gpu_admission_connections_closed_total`.

The timeouts cost the hot path nothing but a float per phase: each connection keeps the loop time its
current phase expires at, and one sweep over the open connections, every `sweep_interval()` (a quarter of
the shortest timeout, at most a second), closes those past it. A timer per request and phase cost ~9 % of
the server's CPU per review (tests/bench/hardening.py).
"""

from __future__ import annotations

import asyncio
import fcntl
import math
import sys
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int = 32 * 1024  # the API server sends < 1 KiB of headers
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    idle_timeout: float = 5.0  # a connection that has sent no request yet
    keepalive_timeout: float = 120.0  # after a response: past the API server's 90 s idle connections (client-go)
    max_connections: int = 4096
    close_linger: float = 0.5  # seconds a closing TLS connection may wait for the peer before it is aborted
    handshake_timeout: float = 10.0  # accept to handshake done: the API server waits at most 10 s by default

    def sweep_interval(self) -> float:
        """How often expired phases are looked for: a timeout fires up to this much late."""
        return min(1.0, min(self.header_timeout, self.body_timeout, self.idle_timeout) / 4)


def handshake_bounded_loop(timeout: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """A loop factory for uvicorn (`Config.get_loop_factory`): uvloop whose TLS servers abort a handshake still
    unfinished after `timeout` seconds (uvicorn passes no ssl_handshake_timeout to create_server)."""
    import uvloop  # uvicorn's loop: imported by `serve` only

    class HandshakeBoundedLoop(uvloop.Loop):
        async def create_server(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", timeout)
            return await super().create_server(*args, **kwargs)

    return HandshakeBoundedLoop


def _unread(transport: Any) -> bool:
    """Whether bytes wait unread in the connection's socket (a request sent during a loop stall)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        count = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return False
    return int.from_bytes(count, sys.byteorder) > 0


def guarded_protocol(limits: ConnectionLimits, on_close: Callable[[str], None] | None = None) -> type[Any]:
    """A protocol class for `uvicorn.Config(http=...)` enforcing `limits`; `on_close(reason)` counts closes."""
    from webhook.transport import CoalescingHttpToolsProtocol, CoalescingTransport  # uvicorn: `serve` only

    class RefusingTransport(CoalescingTransport):
        """`close()` in the middle of a request stops reading and aborts after the linger, instead of a TLS close.

        uvloop's TLS close discards the peer's data until its close_notify, decrypting all of it with no flow
        control: up to 32 reads of 256 KiB per connection per loop turn. In the soak (issue #14) a client still
        streaming its 64 MiB header line after the 431, or the 36 of 40 clients of 8 MiB bodies refused with
        429, were decrypted like that in the event loop until the linger's abort: loop turns of hundreds of
        milliseconds. Not reading, the kernel's buffers fill and the peer's sends block; our answer, already
        written, reaches the peer before the abort. Between requests (idle, shutdown) nothing is coming: the
        TLS close stays."""

        def __init__(self, transport: Any, loop: Any) -> None:
            super().__init__(transport, loop)
            self.mid_request = False  # set by the protocol: a request's head or body is being received
            self._refusing = False

        def close(self) -> None:
            if self._refusing:
                return
            if not self.mid_request:
                super().close()
                return
            self._refusing = True
            self.flush()
            self.pause_reading()
            self._loop.call_later(limits.close_linger, self._end)

        def _end(self) -> None:
            if not self._dead:
                self.abort()

        def is_closing(self) -> bool:
            return self._refusing or super().is_closing()

    # Open connections, least recently active first (dicts keep insertion order; activity re-inserts).
    registry: dict[GuardedProtocol, None] = {}
    count = on_close or (lambda reason: None)
    sweeping: list[bool] = []  # one sweep chain per protocol class (one per server), started by a connection
    interval = limits.sweep_interval()

    def sweep(loop: Any) -> None:
        if not registry:
            sweeping.clear()  # the next connection starts it again
            return
        now = loop.time()
        for conn in [c for c in registry if c._deadline <= now]:
            conn._expired()
        loop.call_later(interval, sweep, loop)

    class GuardedProtocol(CoalescingHttpToolsProtocol):
        transport_class = RefusingTransport

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._phase = "idle"  # of the parser: idle (between requests), head, body
            self._messages = 0  # heads begun or completed: tells whether a read crossed a boundary
            self._head_bytes = 0
            self._deadline = math.inf  # loop time the current phase expires at
            self._closing = False
            self._lost = False
            self._stopping = False
            self._idle_for = limits.idle_timeout  # keepalive_timeout once a response went out

        # -- connection --------------------------------------------------------------------------------

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            assert isinstance(self.transport, RefusingTransport)  # made by CoalescingHttpToolsProtocol
            self._wire = self.transport
            registry[self] = None
            if not sweeping:
                sweeping.append(True)
                self.loop.call_later(interval, sweep, self.loop)
            if len(registry) > limits.max_connections:
                self._evict()
            if not self._closing:
                self._deadline = self.loop.time() + limits.idle_timeout

        def connection_lost(self, exc: Exception | None) -> None:
            self._lost = True
            self._deadline = math.inf
            registry.pop(self, None)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._closing:
                return  # answered and closing: what else the client sends is dropped unread
            before = self._messages
            super().data_received(data)
            if self._phase != "head":
                return
            if self._messages != before:
                self._head_bytes = 0  # this read began the head: its part of it is not counted (one read at most)
                return
            self._head_bytes += len(data)
            if self._head_bytes > limits.max_header_bytes:
                self._refuse(431, f"request header larger than {limits.max_header_bytes} bytes", "header-too-large")

        def shutdown(self) -> None:
            self._stopping = True
            if self._busy():
                super().shutdown()  # uvicorn closes it after the response; on_response_complete lingers
            else:
                self._close("shutdown")

        # -- parser callbacks --------------------------------------------------------------------------

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._phase = "head"
            self._wire.mid_request = True
            self._messages += 1
            self._head_bytes = 0
            registry.pop(self, None)
            registry[self] = None  # most recently active
            self._deadline = self.loop.time() + limits.header_timeout

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._phase = "body"
            self._messages += 1
            self._deadline = self.loop.time() + limits.body_timeout

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._phase = "idle"
            self._wire.mid_request = False
            self._deadline = math.inf  # the application has it; its own deadline answers in time

        def on_response_complete(self) -> None:
            super().on_response_complete()  # starts the next pipelined request and resumes reading
            if self.transport.is_closing():
                # uvicorn closed it after this response (`Connection: close`, or our 413/429 that left the
                # body unread): abort after the linger, or a client still sending gets every byte read
                self._close("")
                return
            if self.pipeline:
                self.flow.pause_reading()  # more are queued: read no more until they are answered
            if self._stopping or self._closing:
                if not self._busy():
                    self._close("shutdown")
            elif self._phase == "idle" and not self._busy():
                self._idle_for = limits.keepalive_timeout
                self._deadline = self.loop.time() + self._idle_for

        # -- limits ------------------------------------------------------------------------------------

        def _busy(self) -> bool:
            """A request is in the application (running or queued behind another)."""
            return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

        def _evict(self) -> None:
            for conn in registry:
                if conn is not self and not conn._busy() and not conn._closing:
                    conn._close("evicted")
                    return
            self._close("too-many-connections")

        def _expired(self) -> None:
            self._deadline = math.inf
            if self._phase == "head":
                why = f"request header not received within {limits.header_timeout:g}s"
                self._refuse(408, why, "header-timeout")
            elif self._phase == "body":
                self._refuse(408, f"request body not received within {limits.body_timeout:g}s", "body-timeout")
            elif self._busy():
                pass
            elif _unread(self.transport):
                self._deadline = self.loop.time() + self._idle_for  # read this turn: no longer idle
            else:
                self._close("idle-timeout" if self._idle_for == limits.idle_timeout else "keepalive-timeout")

        def timeout_keep_alive_handler(self) -> None:
            """uvicorn's keep-alive timer: off, the sweep closes idle connections (see the module docstring)."""

        def _refuse(self, status: int, message: str, reason: str) -> None:
            """Answer with one JSON line and close: the client learns why instead of seeing a reset."""
            body = orjson.dumps({"error": message})
            head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
                status,
                _REASONS[status],
                len(body),
            )
            if not self._closing and not self.transport.is_closing() and self._may_answer():
                self.transport.write(head + b"connection: close\r\n\r\n" + body)
            self._close(reason)

        def _may_answer(self) -> bool:
            """No response of an earlier request can be under way: ours would cut into it."""
            if self.pipeline:
                return False
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                return True
            return self._phase == "body" and not cycle.response_started  # this request's own, not yet answered

        def _close(self, reason: str) -> None:
            if self._closing or self._lost:
                return
            self._closing = True
            if reason:
                count(reason)
            self._deadline = math.inf
            self.flow.pause_reading()
            self.transport.close()
            # A TLS close waits for the peer's close_notify; a client that never answers would hold the
            # connection (and a graceful shutdown) until the loop's 30 s SSL shutdown timeout.
            self.loop.call_later(limits.close_linger, self._abort)

        def _abort(self) -> None:
            if not self._lost:
                self.transport.abort()

    return GuardedProtocol
