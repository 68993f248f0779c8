"""Slow and hostile clients: each is cut after its timeout, and nobody else waits for it.

The server runs with 2-second timeouts so the test is quick; production defaults are in
``swapwise serve --help`` and BENCHMARKS.md. "Not delayed" is checked as every other
admission being answered within a client timeout far below the hostile client's hold.
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.reliability.support import Server, review_json

TIMEOUT = 2  # the server's request, handshake and write timeouts in this module
CUT = 30  # how long the test waits at most for the server to cut a client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc = Server(tmp_path_factory.mktemp("hostile"), None, "--drain-seconds", "0",
                  "--request-timeout", str(TIMEOUT), "--handshake-timeout", str(TIMEOUT),
                  "--write-timeout", str(TIMEOUT)).start()
    yield proc
    proc.stop()


def admissions_flow(server: Server, count: int = 10) -> None:
    """``count`` admissions, each on a new connection, each answered within 5 s."""
    for _ in range(count):
        with httpx.Client(base_url=server.url, verify=server.ssl_context(), timeout=5) as client:
            assert client.post("/mutate/default", json=review_json()).status_code == 200


class Background:
    """Admissions from another thread while the test plays the hostile client."""

    def __init__(self, server: Server) -> None:
        self.errors: list[BaseException] = []
        self.done = 0
        self.stop = threading.Event()

        def run() -> None:
            while not self.stop.is_set():
                try:
                    admissions_flow(server, 1)
                    self.done += 1
                except BaseException as exc:  # reported by the test
                    self.errors.append(exc)
                    return

        self.thread = threading.Thread(target=run, daemon=True)

    def __enter__(self) -> Background:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        assert self.errors == [], self.errors
        assert self.done > 0


def tls_socket(server: Server, rcvbuf: int | None = None) -> ssl.SSLSocket:
    raw = socket.socket()
    if rcvbuf is not None:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.settimeout(CUT)
    raw.connect(("127.0.0.1", server.port))
    context = ssl.create_default_context(cafile=str(server.ca_file()))
    return context.wrap_socket(raw, server_hostname="localhost")


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or CUT passes)."""
    sock.settimeout(CUT)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, ssl.SSLError, TimeoutError):
        pass
    return data


def test_slowloris_headers_are_cut_with_408(server: Server) -> None:
    with Background(server), tls_socket(server) as tls:
        tls.sendall(b"POST /mutate/default HTTP/1.1\r\nHost: x\r\n")
        reply = b""
        for index in range(CUT * 4):  # one header line every 250 ms, forever
            readable, _, _ = select.select([tls], [], [], 0.25)
            if readable or tls.pending():
                reply = read_until_closed(tls)
                break
            try:
                tls.sendall(b"X-Slow-%d: 1\r\n" % index)
            except OSError:
                break
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]


def test_trickled_body_is_cut_with_408(server: Server) -> None:
    body = json.dumps(review_json()).encode()
    with Background(server), tls_socket(server) as tls:
        tls.sendall(b"POST /mutate/default HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                    % len(body) + body[:50])
        reply = read_until_closed(tls)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]


def test_silent_connection_is_closed(server: Server) -> None:
    with Background(server), tls_socket(server) as tls:
        assert read_until_closed(tls) == b""


@pytest.mark.parametrize("hello", [b"", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"])
def test_stalled_tls_handshake_is_dropped(server: Server, hello: bytes) -> None:
    with Background(server), socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(hello)
        assert read_until_closed(raw) == b""


def test_client_that_never_reads_is_cut(server: Server) -> None:
    review = json.dumps(review_json(containers=60)).encode()
    request = (b"POST /mutate/default HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(review)) + review
    with Background(server), tls_socket(server, rcvbuf=4096) as tls:
        tls.settimeout(1)
        sent = 0
        try:
            while sent < 5000:  # pipeline requests, never read: answers pile up
                tls.sendall(request)
                sent += 1
        except TimeoutError:
            pass  # the server stopped reading: its writes to us are stuck
        assert sent < 5000, "the server kept reading from a client that never reads"
        tls.settimeout(CUT)
        cut = False
        try:  # the server aborts the connection once its writes stall for TIMEOUT
            for _ in range(CUT * 10):
                tls.sendall(b"x" * 1024)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError, TimeoutError) as exc:
            cut = not isinstance(exc, TimeoutError)
        assert cut


def test_many_idle_connections_are_closed_and_do_not_block(server: Server) -> None:
    with Background(server):
        handshaken = [tls_socket(server) for _ in range(150)]
        raw = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(150)]
        admissions_flow(server, 20)
        try:
            for sock in [*handshaken, *raw]:
                assert read_until_closed(sock) == b""
        finally:
            for sock in [*handshaken, *raw]:
                sock.close()
    admissions_flow(server, 5)


def test_oversized_headers_are_refused_with_431(server: Server) -> None:
    with tls_socket(server) as tls:
        tls.sendall(b"POST /mutate/default HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(100):
                tls.sendall(b"X-Big: " + b"a" * 4000 + b"\r\n")
        except OSError:
            pass
        reply = read_until_closed(tls)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:100]
    admissions_flow(server, 2)
