"""One TLS record and one socket write per HTTP response: uvicorn's httptools protocol with coalesced writes.

uvicorn's `HttpToolsProtocol` writes the status line and headers on `http.response.start` and the body on
`http.response.body`: two `transport.write` calls. On a TLS transport (uvloop's or asyncio's SSL protocol)
each write is its own `SSLObject.write` — a TLS record of its own — and its own `send()`: at saturation the
two were 15 % + 12 % of the server's samples (docs/benchmarks.md, finding 1).

`CoalescingHttpToolsProtocol` is that protocol with one change: uvicorn writes to a `CoalescingTransport`,
which holds the bytes written in one event-loop turn and hands them to the real transport as one write:

- when a response is complete (`on_response_complete`), at once, in the turn that completed it: an ordinary
  response (head + body) leaves in one write, with no added latency;
- otherwise at the end of the loop turn (`loop.call_soon`): the head of a streaming response whose body
  comes later, `100 Continue`, the chunks of a streamed body written in one turn;
- at once when more than `FLUSH_BYTES` are held, so a large or fast streamed body reaches the real transport
  (and its flow control: `pause_writing` → uvicorn waits in `send`) just as it did without the wrapper;
- before `close()` (uvicorn's own 400 for a malformed request, `Connection: close`, the keep-alive timeout,
  shutdown), so everything written reaches the peer;
- never after the connection is lost or aborted: held bytes are dropped, as the transport would drop them.

Order is kept: every write goes through the holder. The parsing, routing and ASGI handling are uvicorn's,
untouched; only `connection_made`, `connection_lost` and `on_response_complete` are extended.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Held bytes beyond which a write goes out at once (uvicorn's and uvloop's 64 KiB high-water mark): a large
# body is not held for the rest of the turn, and back-pressure from the real transport works as before.
FLUSH_BYTES = 64 * 1024


class CoalescingTransport(asyncio.Transport):
    """Wraps a transport: `write()`s in one loop turn become one `write()` of the real transport."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._flush_scheduled = False
        self._dead = False  # lost or aborted: nothing more is sent

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data or self._dead:
            return
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse its buffer once write() returns
        self._held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_at_end_of_turn)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _flush_at_end_of_turn(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand what is held to the real transport now, as one write."""
        held = self._held
        if not held:
            return
        self._held = []
        self._held_bytes = 0
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def discard(self) -> None:
        """The connection is gone: drop what is held and send nothing more."""
        self._dead = True
        self._held = []
        self._held_bytes = 0

    # -- the rest of the transport, delegated (held bytes are sent before a close) ------------------------

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self.discard()
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._held_bytes


AHEAD_KEY = "gpu_admission.ahead"


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `CoalescingTransport`: one write per response."""

    transport_class: type[CoalescingTransport] = CoalescingTransport  # webhook/guard.py closes differently

    def connection_made(self, transport: Any) -> None:
        # uvloop's transports are not registered as asyncio.Transport subclasses: no isinstance check here
        super().connection_made(self.transport_class(transport, self.loop))

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(self.transport, CoalescingTransport):
            self.transport.discard()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        # The backlog this request joins, stamped at arrival (webhook/app.py sheds FIFO on it): counted when
        # the request's task is made, all of a burst's tasks exist before the first one runs.
        ahead = len(self.server_state.tasks)
        super().on_headers_complete()
        self.scope[AHEAD_KEY] = ahead  # type: ignore[literal-required]

    def on_response_complete(self) -> None:
        if isinstance(self.transport, CoalescingTransport):
            self.transport.flush()  # head and body of the response now, in the turn that completed it
        super().on_response_complete()
