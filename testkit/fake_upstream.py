"""Upstreams that misbehave, on loopback: a tiny HTTP server whose every answer a test writes.

``swapwise tune`` and ``swapwise audit`` call Prometheus and the Kubernetes API; these are the
stand-ins that drip, bomb, repeat themselves or carry hostile strings, each a few lines in
the test that needs it (tests/test_tune.py, tests/test_audit.py).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

# (handler, method, path with query, request body) -> nothing: the function answers itself.
Respond = Callable[["Handler", str, str, bytes], None]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    respond: Respond
    stopping: threading.Event
    requests: list[str]

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.requests.append(f"{self.command} {self.path}")
        # The client giving up is what the hostile answers are for.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.respond(self, self.command, self.path, body)

    do_GET = do_POST = _handle

    def log_message(self, *args: Any) -> None:
        pass

    def send(self, status: int, body: bytes, content_type: str = "application/json",
             headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def json(self, status: int, document: Any, headers: dict[str, str] | None = None) -> None:
        self.send(status, json.dumps(document).encode(), headers=headers)

    def drip(self, every: float = 0.5) -> None:
        """Headers at once, then one byte of a never-ending body every ``every`` seconds:
        each read of the client gets something in time, the whole never comes."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(1 << 30))
        self.end_headers()
        self.wfile.write(b"{")
        self.wfile.flush()
        while not self.stopping.wait(every):
            self.wfile.write(b" ")
            self.wfile.flush()


class Upstream:
    """A server on 127.0.0.1 answering every request with ``respond``."""

    def __init__(self, respond: Respond) -> None:
        self.stopping = threading.Event()
        self.requests: list[str] = []
        handler = type("Handler", (Handler,), {
            "respond": staticmethod(respond), "stopping": self.stopping,
            "requests": self.requests})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Upstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def upstream(respond: Respond) -> Iterator[Upstream]:
    with Upstream(respond) as server:
        yield server


def gzip_bomb(size: int) -> bytes:
    """``size`` bytes of JSON whitespace, gzip-compressed (about a thousandth of it)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = b" " * (1 << 20)
    parts = [compressor.compress(block) for _ in range(size // len(block))]
    return b"".join([*parts, compressor.flush()])


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for ``server`` (plain HTTP, a token that means nothing)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": "fake"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))
    return path


def object_list(kind: str, items: list[dict[str, Any]], token: str | None = None
                ) -> dict[str, Any]:
    """A Kubernetes ``<kind>List`` page, with a ``continue`` token when given."""
    metadata: dict[str, Any] = {"resourceVersion": "1"}
    if token is not None:
        metadata["continue"] = token
    return {"apiVersion": "v1", "kind": f"{kind}List", "metadata": metadata, "items": items}


def status(code: int, message: str) -> dict[str, Any]:
    """A Kubernetes Status, as the API server answers errors."""
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message,
            "reason": "Forbidden" if code == 403 else "InternalError", "code": code}


def wait_for(condition: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)
