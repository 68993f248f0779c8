"""The agent's own API client: one Node read, watched and patched, on the standard library.

Why not lightkube (which ``audit`` uses): the agent runs on every node and its budget is
40 MiB; lightkube and its models import 30 MiB before the first request, ``http.client``
and ``ssl`` 17. It needs three calls on one object, so the client is small:
``GET /api/v1/nodes/<name>``, a watch of that name, and a merge patch.

Every call has a deadline for the whole call, not only per socket read (a server that drips
a byte every few seconds must not hold a thread forever), and every body is counted as it
streams. Credentials: the pod's service-account token (re-read, so a rotated token is used)
and CA, or a kubeconfig (client certificate or token) for running off the cluster.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import math
import os
import socket
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import yaml

from webhook.base.upstream import Deadline

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_OBJECT_BYTES = 4 << 20  # a Node is tens of KiB; a watch event carries one
FIELD_MANAGER = "swapwise-node-agent"


class ApiError(Exception):
    """A request that did not get the answer it needed; ``status`` 0: no HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


class Limit:
    """How long a call's next socket operation may wait: what is left of ``deadline``
    (TimeoutError once it has passed: an OSError, so every call's handler takes it), and at
    most ``idle``."""

    def __init__(self, deadline: Deadline, idle: float = math.inf) -> None:
        self.deadline = deadline
        self.idle = idle

    def __call__(self) -> float:
        left = self.deadline.remaining()
        if left <= 0:
            raise TimeoutError(f"{self.deadline.what}: deadline of {self.deadline.seconds:g} s "
                               "passed")
        return max(0.01, min(self.idle, left))


class _BoundedReader(io.RawIOBase):
    """The socket as a response reads it, every read bounded by ``limit``."""

    def __init__(self, sock: socket.socket, limit: Limit) -> None:
        self.sock = sock
        self.limit = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.sock.settimeout(self.limit())
        return self.sock.recv_into(buffer)


def _response_class(limit: Limit) -> type[http.client.HTTPResponse]:
    class Response(http.client.HTTPResponse):
        def __init__(self, sock: socket.socket, debuglevel: int = 0, method: str | None = None,
                     url: str | None = None) -> None:
            super().__init__(sock, debuglevel, method, url)
            self.fp.close()
            self.fp = io.BufferedReader(_BoundedReader(sock, limit))

    return Response


class BoundedConnection(http.client.HTTPSConnection):
    """HTTPS whose every socket operation waits at most ``limit()``: the TCP connect, the TLS
    handshake, the request, and each read of the answer, its status line, header lines and
    chunk framing included. http.client reads those a line at a time, each read with only
    the socket's own timeout: a server that sent a header byte a second held a call with a
    3 s timeout as long as it liked."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, limit: Limit) -> None:
        super().__init__(host, port, timeout=limit(), context=context)
        self.tls = context
        self.limit = limit
        self.response_class = _response_class(limit)

    def connect(self) -> None:
        self.timeout = self.limit()
        http.client.HTTPConnection.connect(self)  # TCP
        self.sock.settimeout(self.limit())  # the whole handshake, in the ssl module
        self.sock = self.tls.wrap_socket(self.sock, server_hostname=self.host)

    def send(self, data: Any) -> None:
        if self.sock is not None:
            self.sock.settimeout(self.limit())
        super().send(data)


@dataclass
class ApiConfig:
    server: str  # https://host:port
    context: ssl.SSLContext
    token: str | None = None
    token_file: Path | None = None

    def bearer(self) -> str | None:
        if self.token_file is not None:
            # re-read each time: the kubelet rotates a projected token in place
            return self.token_file.read_text().strip()
        return self.token

    @classmethod
    def in_cluster(cls) -> ApiConfig:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
            "KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ApiError(0, "not in a cluster (KUBERNETES_SERVICE_HOST unset): give "
                              "--kubeconfig")
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        return cls(server, context, token_file=SERVICE_ACCOUNT / "token")

    @classmethod
    def from_kubeconfig(cls, path: Path) -> ApiConfig:
        """The current context of a kubeconfig: its server, CA and user (client certificate
        or token, inline or in files)."""
        config = yaml.safe_load(path.read_text())
        if not isinstance(config, dict):
            raise ApiError(0, f"{path}: not a kubeconfig")

        def named(kind: str, name: Any) -> dict[str, Any]:
            for entry in config.get(f"{kind}s") or []:
                if isinstance(entry, dict) and entry.get("name") == name:
                    value = entry.get(kind)
                    return value if isinstance(value, dict) else {}
            raise ApiError(0, f"{path}: no {kind} {name!r}")

        context_name = config.get("current-context")
        context = named("context", context_name)
        cluster, user = named("cluster", context.get("cluster")), named("user", context.get("user"))
        server = cluster.get("server")
        if not isinstance(server, str) or not server.startswith("https://"):
            raise ApiError(0, f"{path}: the cluster's server must be an https:// URL")
        private = Path(tempfile.mkdtemp(prefix="swapwise-agent-"))

        def file_of(key: str, owner: dict[str, Any]) -> str | None:
            if isinstance(owner.get(f"{key}-data"), str):
                target = private / key
                target.write_bytes(base64.b64decode(owner[f"{key}-data"]))
                target.chmod(0o600)
                return str(target)
            value = owner.get(key)
            return str(path.parent / value) if isinstance(value, str) else None

        ssl_context = ssl.create_default_context(cafile=file_of("certificate-authority",
                                                                 cluster))
        if cluster.get("insecure-skip-tls-verify") is True:
            ssl_context.check_hostname = False
            ssl_context.verify_mode = ssl.CERT_NONE
        cert, key = file_of("client-certificate", user), file_of("client-key", user)
        if cert and key:
            ssl_context.load_cert_chain(cert, key)
        token = user.get("token") if isinstance(user.get("token"), str) else None
        # relative to the kubeconfig, as kubectl resolves it (and the certificate files)
        token_file = path.parent / user["tokenFile"] if isinstance(user.get("tokenFile"),
                                                                  str) else None
        return cls(server, ssl_context, token=token, token_file=token_file)


def status_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status body, else the start of the body as text."""
    text = body[:2000].decode("utf-8", "replace")
    try:
        status = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can
        return text.strip()[:300] or "(empty body)"
    message = status.get("message") if isinstance(status, dict) else None
    return message[:300] if isinstance(message, str) and message else text.strip()[:300]


class NodeApi:
    """GET, watch and merge-patch one Node."""

    def __init__(self, config: ApiConfig, timeout: float = 15.0) -> None:
        self.config = config
        self.timeout = timeout  # one GET or PATCH, whole
        split = urlsplit(config.server)
        self.host = split.hostname or ""
        self.port = split.port or 443

    def _connection(self, limit: Limit) -> BoundedConnection:
        return BoundedConnection(self.host, self.port, self.config.context, limit)

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": FIELD_MANAGER}
        token = self.config.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return {**headers, **(extra or {})}

    def call(self, method: str, path: str, body: bytes | None = None,
              content_type: str | None = None) -> Any:
        connection = self._connection(Limit(Deadline(self.timeout, f"{method} {path}")))
        try:
            connection.request(method, path, body=body, headers=self._headers(
                {"Content-Type": content_type} if content_type else None))
            response = connection.getresponse()
            data = read_body(response)
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(0, f"{method} {path}: {exc or type(exc).__name__}") from exc
        finally:
            connection.close()
        if not 200 <= response.status < 300:  # a create answers 201
            raise ApiError(response.status, status_message(data))
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ApiError(response.status, f"{method} {path}: not JSON: {exc}") from exc

    def get(self, name: str) -> dict[str, Any]:
        node = self.call("GET", f"/api/v1/nodes/{quote(name, safe='')}")
        if not isinstance(node, dict):
            raise ApiError(200, "a Node is not a JSON object")
        return node

    def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        query = urlencode({"fieldManager": FIELD_MANAGER})
        node = self.call("PATCH", f"/api/v1/nodes/{quote(name, safe='')}?{query}",
                          json.dumps(body).encode(), "application/merge-patch+json")
        if not isinstance(node, dict):
            raise ApiError(200, "a Node is not a JSON object")
        return node

    def watch(self, name: str, resource_version: str, seconds: int,
              idle: float) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events of one Node from ``resource_version``, for at most ``seconds`` (+ 30 s of
        slack, the client's own deadline) and at most ``idle`` seconds without a byte (the
        server sends a bookmark about once a minute). Ends when the server ends it."""
        query = urlencode({"fieldSelector": f"metadata.name={name}", "watch": "true",
                           "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                           "timeoutSeconds": str(seconds)})
        path = f"/api/v1/nodes?{query}"
        whole = Deadline(seconds + 30, "the watch")
        # connect, headers (and an error's body) within the call timeout; then ``idle``
        limit = Limit(Deadline(min(self.timeout, seconds + 30), "the watch's answer"))
        connection = self._connection(limit)
        try:
            connection.request("GET", path, headers=self._headers())
            response = connection.getresponse()
            if response.status != 200:
                raise ApiError(response.status, status_message(read_body(response)))
            limit.deadline, limit.idle = whole, idle
            pending = bytearray()
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    return
                pending += chunk
                while (end := pending.find(b"\n")) >= 0:
                    line = bytes(pending[:end])
                    del pending[:end + 1]
                    if line.strip():
                        yield _event(line)
                if len(pending) > MAX_OBJECT_BYTES:
                    raise ApiError(200, f"a watch event over {MAX_OBJECT_BYTES} bytes")
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(0, f"watch: {exc or type(exc).__name__}") from exc
        finally:
            connection.close()


def read_body(response: http.client.HTTPResponse, most: int = MAX_OBJECT_BYTES) -> bytes:
    """The whole body, counted as it streams (at most ``most`` bytes); the connection's
    limit bounds the time."""
    data = bytearray()
    while chunk := response.read1(65536):
        data += chunk
        if len(data) > most:
            raise ApiError(response.status, f"answer over {most} bytes")
    return bytes(data)


def _event(line: bytes) -> tuple[str, dict[str, Any]]:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ApiError(200, f"a watch event is not JSON: {exc}") from exc
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise ApiError(200, "a watch event without an object")
    return str(event.get("type")), event["object"]
