"""Graceful shutdown: SIGTERM under a steady stream of admissions loses none of them.

On SIGTERM the server drains (readiness fails, every answer says ``Connection: close``,
new connections are still served), then closes the port and finishes what is in flight.
A client may then fail to *connect*; it must never lose a request it managed to send.
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
from pathlib import Path

import httpx

from testkit.server_proc import wait_until
from tests.reliability.support import Server, Stream, review_json


def test_sigterm_under_steady_load_loses_no_request(tmp_path: Path) -> None:
    server = Server(tmp_path, None, "--drain-seconds", "2").start()
    assert server.process is not None
    with Stream(server, threads=4) as stream:
        stream.wait_for(100)
        server.process.send_signal(signal.SIGTERM)
        # Draining: not ready any more, still answering.
        draining = False
        with server.client() as probe:
            for _ in range(100):
                try:
                    reply = probe.get("/readyz")
                except httpx.HTTPError:
                    break
                if reply.status_code == 503 and reply.json()["draining"]:
                    draining = True
                    break
        assert draining
        stream.wait_for(20)  # admissions continue during the drain
        assert server.process.wait(30) == 0
        answered = stream.outcomes.ok
        # After exit, clients only ever fail to connect.
        assert wait_until(lambda: len(stream.outcomes.refused) >= 4, 10)
    outcomes = stream.outcomes
    assert outcomes.failed == [], outcomes.failed[:5]
    assert answered >= 120
    assert '"msg": "stopped"' in server.logs()


def _tls(server: Server) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(server.ca_file()))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    return context.wrap_socket(raw, server_hostname="localhost")


def test_request_in_flight_when_the_port_closes_is_answered(tmp_path: Path) -> None:
    """No drain at all: the listener closes at once, a half-sent request still completes."""
    server = Server(tmp_path, None, "--drain-seconds", "0").start()
    assert server.process is not None
    body = json.dumps(review_json()).encode()
    head = (b"POST /mutate/default HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with _tls(server) as tls:
        tls.sendall(head + body[:100])  # headers and part of the body: a request in flight
        server.process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: "Shutting down" in server.logs(), 20)
        tls.sendall(body[100:])
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = tls.recv(65536)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert b"connection: close" in reply.lower()
    assert server.process.wait(30) == 0


def test_idle_keep_alive_connections_do_not_hold_up_shutdown(tmp_path: Path) -> None:
    server = Server(tmp_path, None, "--drain-seconds", "0").start()
    assert server.process is not None
    clients = [server.client() for _ in range(5)]
    for client in clients:
        assert client.post("/mutate/default", json=review_json()).status_code == 200
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(15) == 0
    for client in clients:
        client.close()
