"""One TLS record and one socket write per response (webhook/transport.py), over real TLS connections.

The client is a plain socket with `ssl.MemoryBIO`: it sees every TLS record the server sends and counts the
ones that carry response bytes. uvicorn's own httptools protocol sends two per response (head, then body);
ours one. Against the real `serve` process the server's socket writes are counted too (write system calls of
its event-loop thread, /proc/PID/task/PID/io). The edge cases (streaming, large bodies, back-pressure,
`100 Continue`, uvicorn's own 400 and 500, `Connection: close`, keep-alive timeout, a client that goes away)
run an in-process uvicorn with `CoalescingHttpToolsProtocol` on uvloop and on asyncio's loop; so does the
last test, with webhook/guard.py's protocol: a connection refused in the middle of a request is not read on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import orjson
import pytest
import uvicorn

from certs.tlsconfig import server_ssl_context
from tests.serverproc import ServerProcess, free_port, make_certs, review
from webhook.transport import FLUSH_BYTES, CoalescingHttpToolsProtocol


class TLSConn:
    """An HTTPS/1.1 client that reads the server's TLS records one at a time."""

    def __init__(self, port: int, ca: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        context = ssl.create_default_context(cafile=ca)
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        self.raw = bytearray()
        self.data_records = 0  # records that carried application bytes (not session tickets, not alerts)
        self.eof = False
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_out()
                if not self._feed_record():
                    raise ConnectionError("closed during the handshake") from None
        self._send_out()
        self.http = h11.Connection(h11.CLIENT)

    def _send_out(self) -> None:
        if data := self.outgoing.read():
            self.sock.sendall(data)

    def _feed_record(self) -> bool:
        """Move one whole TLS record from the socket into the TLS object; False at EOF."""
        while True:
            if len(self.raw) >= 5:
                end = 5 + int.from_bytes(self.raw[3:5], "big")
                if len(self.raw) >= end:
                    self.incoming.write(bytes(self.raw[:end]))
                    del self.raw[:end]
                    return True
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return False
            self.raw += chunk

    def recv(self) -> bytes:
        """The plaintext of the next record that has any; b"" when the server closed the connection."""
        while not self.eof:
            if not self._feed_record():
                self.eof = True
                break
            got = bytearray()
            try:
                while chunk := self.tls.read(1 << 16):
                    got += chunk
                self.eof = True  # b"": the server's close_notify
            except ssl.SSLWantReadError:
                pass
            self._send_out()
            if got:
                self.data_records += 1
                return bytes(got)
        return b""

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self._send_out()

    def send_request(self, method: str, target: str, body: bytes = b"", headers: tuple[Any, ...] = ()) -> None:
        hs = [("Host", "127.0.0.1"), ("Content-Length", str(len(body))), *headers]
        out = self.http.send(h11.Request(method=method, target=target, headers=hs)) or b""
        if body:
            out += self.http.send(h11.Data(data=body)) or b""
        self.send(out + (self.http.send(h11.EndOfMessage()) or b""))

    def next_event(self) -> Any:
        while True:
            event = self.http.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.http.receive_data(self.recv())

    def response(self) -> tuple[h11.Response, bytes, int]:
        """The next response: (head, body, TLS records it took)."""
        before = self.data_records
        head, body = None, bytearray()
        while True:
            event = self.next_event()
            if isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        assert head is not None
        if self.http.our_state is h11.DONE and self.http.their_state is h11.DONE:
            self.http.start_next_cycle()
        return head, bytes(body), self.data_records - before

    def request(self, method: str, target: str, body: bytes = b"", headers: tuple[Any, ...] = ()) -> Any:
        self.send_request(method, target, body, headers)
        return self.response()

    def close(self) -> None:
        self.sock.close()


# -- the real server --------------------------------------------------------------------------------------


def _syscw(pid: int, tid: int) -> int:
    for line in Path(f"/proc/{pid}/task/{tid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise KeyError("syscw")


def test_serve_answers_each_request_with_one_tls_record_and_one_write() -> None:
    srv = ServerProcess()
    try:
        conn = TLSConn(srv.port, srv.ca)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }
        body = orjson.dumps(review(pod))
        json_type = (("Content-Type", "application/json"),)
        conn.request("POST", "/mutate?timeout=5s", body, json_type)  # first-request imports, session tickets
        time.sleep(0.2)
        pid = srv.proc.pid  # the event loop runs in the main thread: its tid is the pid
        writes = _syscw(pid, pid)
        n = 40
        for i in range(n):
            head, out, records = conn.request("POST", ("/mutate", "/validate")[i % 2] + "?timeout=5s", body, json_type)
            assert head.status_code == 200 and orjson.loads(out)["response"]["allowed"] is True
            assert records == 1
        writes = _syscw(pid, pid) - writes
        assert n <= writes <= n + 2  # uvicorn's own protocol: 2 per response
        for path in ("/healthz", "/metrics"):  # FastAPI's responses too
            head, out, records = conn.request("GET", path)
            assert head.status_code == 200 and out and records == 1
        conn.close()
    finally:
        srv.stop()


# -- an in-process uvicorn with the protocol, on both loops ------------------------------------------------

FLOOD_CHUNKS = 256  # x 64 KiB = 16 MiB: more than the loopback socket buffers and the transports hold


class App:
    """An ASGI app with one endpoint per case; `state` lets a test see what it did."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.gate = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]

        async def start(headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": list(headers)})

        async def body(data: bytes, more: bool = False) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        if path == "/small":
            await start(((b"content-length", b"5"),))
            await body(b"hello")
        elif path == "/echo":
            data = bytearray()
            while True:
                message = await receive()
                data += message.get("body", b"")
                if not message.get("more_body"):
                    break
            await start(((b"content-length", str(len(data)).encode()),))
            await body(bytes(data))
        elif path == "/stream":  # the head and a first chunk, then the rest when the test says so
            await start()
            await body(b"first", more=True)
            while not self.gate.is_set():
                await asyncio.sleep(0.005)
            await body(b"second")
        elif path == "/burst":  # ten chunks in one loop turn
            await start()
            for i in range(10):
                await body(b"chunk-%d;" % i, more=True)
            await body(b"")
        elif path == "/large":
            size = 4 << 20
            await start(((b"content-length", str(size).encode()),))
            await body(bytes(range(256)) * (size // 256))
        elif path == "/flood":  # 64 KiB chunks as fast as send() lets them go
            self.state["sent"] = 0
            await start()
            for _ in range(FLOOD_CHUNKS):
                await body(b"f" * FLUSH_BYTES, more=True)
                self.state["sent"] += 1
            await body(b"")
        elif path == "/slow":  # keeps sending after the client has gone
            try:
                await start()
                for _ in range(20):
                    await body(b"s" * 1000, more=True)
                    await asyncio.sleep(0.01)
                await body(b"")
                self.state["slow"] = "finished"
            except BaseException as exc:
                self.state["slow"] = repr(exc)
                raise
        elif path == "/boom":
            raise RuntimeError("boom")
        elif path == "/refuse":  # answered without reading the body, as webhook/app.py answers a 413 or 429
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-length", b"0"), (b"connection", b"close")]})  # fmt: skip
            await body(b"")


@contextlib.contextmanager
def uvicorn_server(
    app: App, tls: Path, loop: str, http: Any = CoalescingHttpToolsProtocol, rcvbuf: int = 0, **kw: Any
) -> Iterator[int]:
    """`rcvbuf`: a fixed receive buffer for the accepted sockets (none grows past it), so what the server
    has not read stays within a known size."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=free_port(),
        http=http,
        loop=loop,
        lifespan="off",
        log_config=None,
        access_log=False,
        **kw,
    )
    config.load()
    config.ssl = server_ssl_context(tls)
    server = uvicorn.Server(config)
    sockets = None
    if rcvbuf:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # accepted sockets inherit it
        listener.bind(("127.0.0.1", config.port))
        sockets = [listener]
    # no signal handlers outside the main thread
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield config.port
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(params=["uvloop", "asyncio"])
def served(request: pytest.FixtureRequest, tls: Path) -> Iterator[tuple[App, Any]]:
    app = App()
    with uvicorn_server(app, tls, request.param, timeout_keep_alive=1) as port:
        yield app, lambda: TLSConn(port, str(tls / "ca-bundle.crt"))


def test_keep_alive_responses_and_pipelining(served: Any) -> None:
    _, connect = served
    conn = connect()
    for _ in range(5):
        head, body, records = conn.request("GET", "/small")
        assert (head.status_code, body, records) == (200, b"hello", 1)
    head, body, records = conn.request("POST", "/echo", b"x" * 10_000)
    assert (head.status_code, body, records) == (200, b"x" * 10_000, 1)
    # two requests in one write: two responses, each whole, in order
    conn.send(b"GET /small HTTP/1.1\r\nHost: a\r\n\r\nPOST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
    data = b""
    while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"abc"):
        chunk = conn.recv()
        assert chunk
        data += chunk
    assert data.index(b"hello") < data.index(b"abc")
    conn.close()


def test_streaming_head_is_not_held_until_the_response_ends(served: Any) -> None:
    app, connect = served
    conn = connect()
    conn.send_request("GET", "/stream")
    head = conn.next_event()  # flushed at the end of the loop turn, while the app still waits
    assert isinstance(head, h11.Response) and head.status_code == 200
    first = conn.next_event()
    assert isinstance(first, h11.Data) and first.data == b"first"
    assert conn.data_records == 1  # head and first chunk: written in one turn, one record
    app.gate.set()
    rest = conn.next_event()
    assert isinstance(rest, h11.Data) and rest.data == b"second"
    assert isinstance(conn.next_event(), h11.EndOfMessage)
    conn.close()


def test_chunks_written_in_one_turn_leave_as_one_record(served: Any) -> None:
    _, connect = served
    conn = connect()
    head, body, records = conn.request("GET", "/burst")
    assert head.status_code == 200
    assert body == b"".join(b"chunk-%d;" % i for i in range(10))
    assert records == 1
    conn.close()


def test_large_body(served: Any) -> None:
    _, connect = served
    conn = connect()
    head, body, records = conn.request("GET", "/large")
    assert head.status_code == 200 and body == bytes(range(256)) * ((4 << 20) // 256)
    assert records >= (4 << 20) // (16 << 10)  # TLS records are at most 16 KiB
    head, body, records = conn.request("GET", "/small")  # the connection is still usable
    assert (head.status_code, body, records) == (200, b"hello", 1)
    conn.close()


def test_back_pressure_holds_a_fast_streaming_app(served: Any) -> None:
    app, connect = served
    conn = connect()
    conn.send_request("GET", "/flood")
    time.sleep(0.5)  # not reading: the server's buffers fill, the transport pauses, send() waits
    assert 0 < app.state["sent"] < FLOOD_CHUNKS // 2
    head, body, _ = conn.response()
    assert head.status_code == 200 and body == b"f" * (FLOOD_CHUNKS * FLUSH_BYTES)
    assert app.state["sent"] == FLOOD_CHUNKS
    conn.close()


def test_expect_100_continue(served: Any) -> None:
    _, connect = served
    conn = connect()
    conn.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    interim = conn.recv()  # written in receive(), then the app waits for the body: must not be held
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.send(b"ping")
    data = b""
    while not data.endswith(b"ping"):
        chunk = conn.recv()
        assert chunk
        data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    conn.close()


def test_malformed_request_gets_uvicorns_400_then_close(served: Any) -> None:
    _, connect = served
    conn = connect()
    conn.send(b"NOT AN HTTP REQUEST\r\n\r\n")
    data = b""
    while chunk := conn.recv():
        data += chunk
    assert data.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"connection: close\r\n" in data and data.endswith(b"Invalid HTTP request received.")
    assert conn.data_records == 1
    conn.close()


def test_app_error_gets_uvicorns_500_then_close(served: Any, caplog: pytest.LogCaptureFixture) -> None:
    _, connect = served
    conn = connect()
    with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
        head, body, records = conn.request("GET", "/boom")
    assert (head.status_code, body, records) == (500, b"Internal Server Error", 1)
    assert conn.recv() == b""  # connection: close
    conn.close()


def test_connection_close_and_keep_alive_timeout(served: Any) -> None:
    _, connect = served
    conn = connect()
    head, body, records = conn.request("GET", "/small", headers=(("Connection", "close"),))
    assert (head.status_code, body, records) == (200, b"hello", 1)
    assert conn.recv() == b""
    conn.close()
    conn = connect()
    assert conn.request("GET", "/small")[1] == b"hello"
    start = time.monotonic()
    assert conn.recv() == b""  # the idle connection is closed after timeout_keep_alive (1 s)
    assert 0.5 < time.monotonic() - start < 5
    conn.close()


def test_client_going_away_mid_response(served: Any, caplog: pytest.LogCaptureFixture) -> None:
    app, connect = served
    conn = connect()
    conn.send_request("GET", "/slow")
    assert isinstance(conn.next_event(), h11.Response)
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()  # RST
    deadline = time.monotonic() + 5
    while "slow" not in app.state and time.monotonic() < deadline:
        time.sleep(0.01)
    assert app.state["slow"] == "finished"  # send() after the disconnect returns quietly
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    conn = connect()  # and the server goes on
    assert conn.request("GET", "/small")[1] == b"hello"
    conn.close()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("refused", ["header line", "unread body"])
def test_a_connection_refused_mid_request_is_not_read_any_further(tls: Path, loop: str, refused: str) -> None:
    """A client still sending after its refusal (a 431 for a 64 MiB header line; a 413 or 429 that leaves a
    64 MiB body unread) gets nothing more read: the server stops reading and aborts the connection after the
    linger. A TLS close read and decrypted everything such a client sent until the abort, in the event loop
    (issue #14's soak: loop stalls of hundreds of ms). With the server's receive buffer fixed at 256 KiB the
    client can hand over at most that, its own send buffer (at most 4 MiB here) and what the TLS layer holds
    (256 KiB) before its sends block: nowhere near 64 MiB within the 3 s linger."""
    from webhook.guard import ConnectionLimits, guarded_protocol

    limits = ConnectionLimits(close_linger=3.0)
    with uvicorn_server(App(), tls, loop, http=guarded_protocol(limits), rcvbuf=256 * 1024) as port:
        context = ssl.create_default_context(cafile=str(tls / "ca-bundle.crt"))
        sock = context.wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1"
        )
        if refused == "header line":
            sock.sendall(b"POST /small HTTP/1.1\r\nHost: x\r\nX-Big: ")
        else:
            sock.sendall(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (64 << 20))
        sent = 0
        started = time.monotonic()
        with contextlib.suppress(OSError):  # reset by the abort (or blocked until the socket timeout)
            for _ in range(64):
                sock.sendall(b"a" * (1 << 20))
                sent += 1 << 20
        ended = time.monotonic() - started
        sock.close()
    assert sent <= 8 << 20, f"the server read {sent >> 20} MiB after refusing the request"
    assert ended < 9, ended  # ended by the abort after the linger, not by the client's 10 s timeout


def test_a_request_sent_to_an_idle_connection_during_a_loop_stall_is_answered(tls: Path) -> None:
    """After a stall in a read callback, uvloop runs its timers before it polls again: a connection idle past
    the idle timeout by then may already hold the client's next request in its socket. Closing it then lost
    that request and the client saw EOF (the soak's `transport` errors, after the stalls of the bodies abuse).
    The guard leaves a connection with unread bytes open, and uvicorn's own keep-alive timer closes nothing."""
    from webhook.guard import ConnectionLimits, guarded_protocol

    guarded = guarded_protocol(ConnectionLimits(idle_timeout=1.0, keepalive_timeout=1.0))

    class Stalling(guarded):  # type: ignore[misc, valid-type]
        def data_received(self, data: bytes) -> None:
            if b"/stall" in data:
                time.sleep(2.0)  # a read callback that holds the loop, as decrypting a flood did
            super().data_received(data)

    with uvicorn_server(App(), tls, "uvloop", http=Stalling, timeout_keep_alive=1) as port:
        ca = str(tls / "ca-bundle.crt")
        conn, staller = TLSConn(port, ca), TLSConn(port, ca)
        assert conn.request("GET", "/small")[1] == b"hello"  # conn is idle from now on
        staller.send_request("GET", "/stall")  # the loop stalls 2 s from about now
        time.sleep(0.5)
        conn.send_request("GET", "/small")  # waits in the socket until the loop wakes, 2 s into conn's idleness
        assert conn.response()[1] == b"hello"
        conn.close()
        staller.close()
