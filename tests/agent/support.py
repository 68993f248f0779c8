"""Loopback upstreams for the node agent's tests.

- :class:`TlsServer`: a real HTTPS server on 127.0.0.1 (``http.server`` behind a certificate
  the test's own CA signed, from ``webhook/certs.py``) whose every request is handed to a
  function the test writes, so a test can answer as a hostile or broken upstream would
  (drip, close at once, oversize, garbage) and count what the client asked.
- :class:`FakeApiServer`: the three calls the agent makes on one Node (GET, watch, merge
  PATCH with a resourceVersion precondition), kept as a real API server keeps them.
(The host's kernel files: testkit/hostfiles.py.)
- :func:`merge_patch`: RFC 7386, to apply what the agent sends.
"""

from __future__ import annotations

import contextlib
import copy
import http.server
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from webhook import certs
from webhook.agent.nodeapi import ApiConfig

GIB = 1 << 30


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


@dataclass(frozen=True)
class Tls:
    """A CA and a serving certificate for 127.0.0.1, as files."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path) -> Tls:
        ca, cert, key = certs.generate(["localhost"], ["127.0.0.1"])
        paths = certs.write(directory, ca, cert, key)
        return cls(paths.ca, paths.cert, paths.key)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    at: float  # monotonic
    peer: str  # the client certificate's common name, "" without one

    def json(self) -> Any:
        return json.loads(self.body)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that never sends its request does not hold a thread forever
    server: TlsServer

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) \
            else None
        names = [value for rdn in (peer or {}).get("subject", ()) for key, value in rdn
                 if key == "commonName"]
        request = Request(self.command, split.path,
                          {k: v[-1] for k, v in parse_qs(split.query).items()},
                          {k.lower(): v for k, v in self.headers.items()}, body,
                          time.monotonic(), names[0] if names else "")
        self.server.record(request)
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client went away: nothing to tell it
            self.server.app(self, request)

    do_GET = do_PATCH = do_POST = _dispatch

    def log_message(self, format: str, *args: Any) -> None:
        return

    # -- answers

    def send_json(self, status: int, obj: Any) -> None:
        self.send_bytes(status, json.dumps(obj).encode())

    def send_bytes(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def send_status(self, code: int, message: str, reason: str = "") -> None:
        """A Kubernetes Status body, as the API server answers an error."""
        self.send_json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "message": message, "reason": reason, "code": code})

    def start_stream(self, status: int = 200) -> None:
        """Headers of a chunked answer (as the API server streams a watch)."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def event(self, kind: str, obj: Any) -> None:
        self.chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


App = Callable[[Handler, Request], None]


class TlsServer(http.server.ThreadingHTTPServer):
    """HTTPS on 127.0.0.1: every request goes to ``app``; every request is recorded."""

    daemon_threads = True

    def __init__(self, tls: Tls, app: App, context: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.tls = tls
        self.context = context or tls.server_context()
        self.app = app
        self.stopping = threading.Event()  # set on close: handlers that wait, stop
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def record(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    def requests(self, method: str | None = None, watch: bool | None = None) -> list[Request]:
        with self._lock:
            found = list(self._requests)
        return [r for r in found if (method is None or r.method == method)
                and (watch is None or (r.query.get("watch") == "true") == watch)]

    def finish_request(self, request: Any, client_address: Any) -> None:
        # the handshake runs in the request's thread, so a client that never finishes it
        # does not stop the server
        request.settimeout(30)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError:
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a client that hangs up mid-answer is what these tests do on purpose

    def start(self) -> TlsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=10)

    def config(self, token: str | None = "t0ken") -> ApiConfig:
        return ApiConfig(self.url, self.tls.client_context(), token=token)


@contextlib.contextmanager
def serving(tls: Tls, app: App, context: ssl.SSLContext | None = None) -> Iterator[TlsServer]:
    server = TlsServer(tls, app, context).start()
    try:
        yield server
    finally:
        server.close()


def node(name: str = "node-a", labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         memory: str | None = "8Gi", version: str = "1") -> dict[str, Any]:
    """A Node as the API server returns one (what the agent reads of it)."""
    obj: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": version, "labels": dict(labels or {}),
                     "annotations": dict(annotations or {})},
        "spec": {}, "status": {"capacity": {}, "nodeInfo": {}},
    }
    if taints is not None:
        obj["spec"]["taints"] = taints
    if memory is not None:
        obj["status"]["capacity"]["memory"] = memory
    return obj


@dataclass
class PatchRule:
    """What :class:`FakeApiServer` answers a PATCH with, besides applying it."""

    status: int = 200  # not 200: refuse every patch with this Status
    message: str = "refused"


class FakeApiServer:
    """One Node behind GET, watch and merge PATCH, with resourceVersions that move on every
    change and a watch that streams each change as MODIFIED, the way kube-apiserver keeps a
    Node; ``patch_rule`` makes every PATCH fail instead."""

    def __init__(self, tls: Tls, obj: dict[str, Any]) -> None:
        self.name = obj["metadata"]["name"]
        self.obj = copy.deepcopy(obj)
        self.version = int(obj["metadata"]["resourceVersion"])
        self.changed = threading.Condition()
        self.patch_rule = PatchRule()
        self.patches: list[dict[str, Any]] = []
        self.server = TlsServer(tls, self._app)

    def __enter__(self) -> FakeApiServer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.changed:
            self.changed.notify_all()
        self.server.close()

    def current(self) -> dict[str, Any]:
        with self.changed:
            return copy.deepcopy(self.obj)

    def update(self, change: Callable[[dict[str, Any]], None]) -> None:
        """Another writer changes the Node (an admin, the kubelet)."""
        with self.changed:
            change(self.obj)
            self._bump()

    def _bump(self) -> None:
        self.version += 1
        self.obj["metadata"]["resourceVersion"] = str(self.version)
        self.changed.notify_all()

    def _app(self, h: Handler, request: Request) -> None:
        path = f"/api/v1/nodes/{self.name}"
        if request.method == "GET" and request.path == path:
            h.send_json(200, self.current())
        elif request.method == "GET" and request.path == "/api/v1/nodes" and \
                request.query.get("watch") == "true":
            self._watch(h, request)
        elif request.method == "PATCH" and request.path == path:
            self._patch(h, request)
        else:
            h.send_status(404, f"{request.method} {request.path} not found", "NotFound")

    def _patch(self, h: Handler, request: Request) -> None:
        if request.headers.get("content-type") != "application/merge-patch+json":
            h.send_status(415, "not a merge patch", "UnsupportedMediaType")
            return
        body = request.json()
        rule = self.patch_rule
        if rule.status != 200:
            h.send_status(rule.status, rule.message)
            return
        with self.changed:
            wanted = body.get("metadata", {}).get("resourceVersion")
            if wanted is not None and wanted != str(self.version):
                h.send_status(409, "the object has been modified; please apply your changes "
                                   "to the latest version and try again", "Conflict")
                return
            self.patches.append(body)
            self.obj = merge_patch(self.obj, body)
            self._bump()
            answer = copy.deepcopy(self.obj)
        h.send_json(200, answer)

    def _watch(self, h: Handler, request: Request) -> None:
        since = int(request.query.get("resourceVersion") or 0)
        until = time.monotonic() + float(request.query.get("timeoutSeconds") or 60)
        h.start_stream()
        while not self.server.stopping.is_set() and time.monotonic() < until:
            with self.changed:
                if self.version <= since:
                    self.changed.wait(0.2)
                    continue
                since = self.version
                obj = copy.deepcopy(self.obj)
            h.event("MODIFIED", obj)
        h.end_stream()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``check`` until it is true, within a generous deadline (a wait, never a timing
    assertion); its value."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)
