"""webhook/agent/nodeapi.py against a real HTTPS server on loopback that the test scripts:
the happy paths, the API server's errors, and upstreams that misbehave (issue 46): one
deadline for each whole call, bodies counted as they stream, a watch that goes silent.

Timings here are upper bounds with room to spare: a drip that would take 30 s must end the
call within a few; nothing asserts how fast a healthy call is.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.agent.support import Handler, Request, Tls, free_port, node, serving
from webhook.agent.nodeapi import (
    FIELD_MANAGER,
    MAX_OBJECT_BYTES,
    ApiConfig,
    ApiError,
    Limit,
    NodeApi,
    status_message,
)
from webhook.base.upstream import Deadline

DRIP_SECONDS = 30  # how long a drip would last: every drip test must end far sooner
NESTED = b"[" * 200_000 + b"]" * 200_000


def answer(obj: Any, status: int = 200) -> Callable[[Handler, Request], None]:
    def app(h: Handler, request: Request) -> None:
        h.send_json(status, obj)
    return app


def elapsed(call: Callable[[], Any]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except Exception as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


# -- GET and PATCH


def test_get_sends_the_token_and_reads_the_node(tls: Tls) -> None:
    obj = node("node-a", labels={"a": "b"})
    with serving(tls, answer(obj)) as server:
        got = NodeApi(server.config()).get("node-a")
        (request,) = server.requests()
    assert got == obj
    assert (request.method, request.path) == ("GET", "/api/v1/nodes/node-a")
    assert request.headers["authorization"] == "Bearer t0ken"
    assert request.headers["accept"] == "application/json"
    assert request.headers["user-agent"] == FIELD_MANAGER


def test_get_without_a_token_sends_no_authorization(tls: Tls) -> None:
    with serving(tls, answer(node())) as server:
        NodeApi(server.config(token=None)).get("node-a")
        (request,) = server.requests()
    assert "authorization" not in request.headers


def test_a_name_is_one_path_segment(tls: Tls) -> None:
    with serving(tls, answer(node())) as server:
        NodeApi(server.config()).get("a/../b?c")
        (request,) = server.requests()
    assert request.path == "/api/v1/nodes/a%2F..%2Fb%3Fc"
    assert request.query == {}


def test_patch_is_a_merge_patch_with_the_field_manager(tls: Tls) -> None:
    updated = node("node-a", labels={"swapwise.io/swap-node": "true"}, version="2")
    body = {"metadata": {"labels": {"swapwise.io/swap-node": "true"}}}
    with serving(tls, answer(updated)) as server:
        got = NodeApi(server.config()).patch("node-a", body)
        (request,) = server.requests()
    assert got == updated
    assert request.method == "PATCH"
    assert request.path == "/api/v1/nodes/node-a"
    assert request.query == {"fieldManager": FIELD_MANAGER}
    assert request.headers["content-type"] == "application/merge-patch+json"
    assert request.json() == body


@pytest.mark.parametrize("status,body,message", [
    (404, json.dumps({"kind": "Status", "message": 'nodes "node-a" not found'}).encode(),
     'nodes "node-a" not found'),
    (403, b"forbidden by a proxy\n", "forbidden by a proxy"),
    (500, b"", "(empty body)"),
    (409, b'["not", "a", "status"]', '["not", "a", "status"]'),
    (422, json.dumps({"kind": "Status", "message": ""}).encode(),
     '{"kind": "Status", "message": ""}'),
])
def test_errors_carry_the_status_and_its_message(tls: Tls, status: int, body: bytes,
                                                 message: str) -> None:
    def app(h: Handler, request: Request) -> None:
        h.send_bytes(status, body)
    with serving(tls, app) as server, pytest.raises(ApiError) as caught:
        NodeApi(server.config()).patch("node-a", {})
    assert caught.value.status == status
    assert str(caught.value) == f"HTTP {status}: {message}"


@pytest.mark.parametrize("body,message", [(b"<html>", "not JSON"),
                                          (b"[1, 2]", "a Node is not a JSON object"),
                                          (NESTED, "not JSON")])
def test_a_200_that_is_not_a_node(tls: Tls, body: bytes, message: str) -> None:
    def app(h: Handler, request: Request) -> None:
        h.send_bytes(200, body)
    with serving(tls, app) as server, pytest.raises(ApiError, match=message) as caught:
        NodeApi(server.config()).get("node-a")
    assert caught.value.status == 200


def test_a_deeply_nested_error_body_is_still_an_api_error(tls: Tls) -> None:
    def app(h: Handler, request: Request) -> None:
        h.send_bytes(500, NESTED)
    with serving(tls, app) as server, pytest.raises(ApiError) as caught:
        NodeApi(server.config()).get("node-a")
    assert caught.value.status == 500


def test_nothing_listening_is_status_0() -> None:
    config = ApiConfig(f"https://127.0.0.1:{free_port()}", ssl.create_default_context())
    with pytest.raises(ApiError) as caught:
        NodeApi(config, timeout=5).get("node-a")
    assert caught.value.status == 0
    assert "GET /api/v1/nodes/node-a" in str(caught.value)


def test_a_server_the_ca_did_not_sign_is_refused(tls: Tls, tmp_path: Path) -> None:
    other = Tls.make(tmp_path)
    with serving(tls, answer(node())) as server, pytest.raises(ApiError) as caught:
        NodeApi(ApiConfig(server.url, other.client_context())).get("node-a")
    assert caught.value.status == 0
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    assert server.requests() == []


# -- hostile: deadlines


def drip_body(h: Handler, request: Request) -> None:
    """Headers at once, then a byte of a promised body every second."""
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(DRIP_SECONDS + 10))
    h.end_headers()
    h.wfile.flush()
    for _ in range(DRIP_SECONDS):
        if h.server.stopping.wait(1.0):
            return
        h.wfile.write(b" ")
        h.wfile.flush()


def drip_headers(h: Handler, request: Request) -> None:
    """A status line, then a header a byte a second."""
    h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
    h.wfile.flush()
    for _ in range(DRIP_SECONDS):
        if h.server.stopping.wait(1.0):
            return
        h.wfile.write(b"a")
        h.wfile.flush()


def drip_chunk_size(h: Handler, request: Request) -> None:
    """A chunked answer whose first chunk-size line never ends: a byte a second."""
    h.start_stream()
    for _ in range(DRIP_SECONDS):
        if h.server.stopping.wait(1.0):
            return
        h.wfile.write(b"0")
        h.wfile.flush()


@pytest.mark.parametrize("app,method", [(drip_body, "GET"), (drip_headers, "GET"),
                                        (drip_chunk_size, "GET"), (drip_headers, "PATCH")],
                         ids=["body", "headers", "chunk-size", "patch-headers"])
def test_a_drip_ends_the_call_at_its_deadline(tls: Tls, app: Callable[[Handler, Request], None],
                                              method: str) -> None:
    with serving(tls, app) as server:
        api = NodeApi(server.config(), timeout=3)
        took, error = elapsed(lambda: api.get("node-a") if method == "GET"
                              else api.patch("node-a", {}))
    assert isinstance(error, ApiError), error
    assert error.status == 0
    assert "deadline" in str(error) or "timed out" in str(error)
    assert took < 12, f"{took:.1f} s: the deadline of 3 s did not bind the whole call"


def test_a_watch_whose_headers_drip_ends_at_the_call_timeout(tls: Tls) -> None:
    with serving(tls, drip_headers) as server:
        api = NodeApi(server.config(), timeout=3)
        took, error = elapsed(lambda: list(api.watch("node-a", "1", 600, idle=600)))
    assert isinstance(error, ApiError), error
    assert took < 12, f"{took:.1f} s"


def test_a_watch_that_drips_ends_at_its_whole_deadline(tls: Tls) -> None:
    """A byte every half second keeps the idle limit from ever firing; the watch's own
    deadline (timeoutSeconds + 30 s) must still end it."""
    def app(h: Handler, request: Request) -> None:
        h.start_stream()
        for _ in range(200):  # 100 s
            if h.server.stopping.wait(0.5):
                return
            h.chunk(b" ")

    with serving(tls, app) as server:
        api = NodeApi(server.config(), timeout=5)
        took, error = elapsed(lambda: list(api.watch("node-a", "1", 1, idle=5)))
    assert isinstance(error, ApiError), error
    assert error.status == 0
    assert 25 < took < 60, f"{took:.1f} s (deadline 1 + 30 s)"


def test_a_silent_watch_ends_at_its_idle_limit(tls: Tls) -> None:
    def app(h: Handler, request: Request) -> None:
        h.start_stream()
        h.server.stopping.wait(DRIP_SECONDS)

    with serving(tls, app) as server:
        api = NodeApi(server.config(), timeout=25)  # only ``idle`` may end it
        took, error = elapsed(lambda: list(api.watch("node-a", "1", 600, idle=1)))
    assert isinstance(error, ApiError), error
    assert error.status == 0
    assert took < 15, f"{took:.1f} s"


# -- hostile: sizes


def stream_zeros(total: int, chunked: bool, sent: list[int],
                 status: int = 200) -> Callable[[Handler, Request], None]:
    def app(h: Handler, request: Request) -> None:
        block = b"0" * 65536
        if chunked:
            h.start_stream(status)
        else:
            h.send_response(status)
            h.send_header("Content-Length", str(total))
            h.end_headers()
        while sent[0] < total:
            h.chunk(block) if chunked else h.wfile.write(block)
            sent[0] += len(block)
    return app


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
@pytest.mark.parametrize("status", [200, 500])
def test_a_body_over_the_cap_is_refused_as_it_streams(tls: Tls, chunked: bool,
                                                      status: int) -> None:
    sent = [0]
    total = 256 << 20
    with serving(tls, stream_zeros(total, chunked, sent, status)) as server, \
            pytest.raises(ApiError, match=f"over {MAX_OBJECT_BYTES} bytes") as caught:
        NodeApi(server.config(), timeout=60).get("node-a")
    assert caught.value.status == status
    # the client stopped reading near the cap: the server could not send the rest
    assert sent[0] < 64 << 20, f"{sent[0]} bytes sent"


# -- watch


def watch_of(events: list[bytes], end: bool = True) -> Callable[[Handler, Request], None]:
    def app(h: Handler, request: Request) -> None:
        h.start_stream()
        for data in events:
            h.chunk(data)
        if end:
            h.end_stream()
    return app


def line(kind: str, obj: Any) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def test_a_watch_asks_for_one_node_and_yields_its_events(tls: Tls) -> None:
    one, two = node(version="5"), node(version="6", labels={"x": "y"})
    bookmark = {"kind": "Node", "metadata": {"resourceVersion": "7"}}
    text = line("ADDED", one) + line("MODIFIED", two) + b"\n" + line("BOOKMARK", bookmark)
    # chunk boundaries anywhere: mid-event, several events in one
    pieces = [text[:10], text[10:len(text) // 2], text[len(text) // 2:]]
    with serving(tls, watch_of(pieces)) as server:
        events = list(NodeApi(server.config()).watch("node-a", "4", 1800, idle=60))
        (request,) = server.requests()
    assert events == [("ADDED", one), ("MODIFIED", two), ("BOOKMARK", bookmark)]
    assert request.path == "/api/v1/nodes"
    assert request.query == {"fieldSelector": "metadata.name=node-a", "watch": "true",
                             "resourceVersion": "4", "allowWatchBookmarks": "true",
                             "timeoutSeconds": "1800"}
    assert request.headers["authorization"] == "Bearer t0ken"


def test_a_watch_that_closes_at_once_yields_nothing(tls: Tls) -> None:
    with serving(tls, watch_of([])) as server:
        assert list(NodeApi(server.config()).watch("node-a", "4", 60, idle=60)) == []


def test_a_watch_cut_mid_event_is_an_error(tls: Tls) -> None:
    text = line("MODIFIED", node(version="9"))
    with serving(tls, watch_of([text, text[:20]], end=False)) as server:
        events = NodeApi(server.config()).watch("node-a", "4", 60, idle=60)
        assert next(events)[0] == "MODIFIED"
        with pytest.raises(ApiError) as caught:  # the connection closed inside the stream
            next(events)
    assert caught.value.status == 0


def test_a_watch_ended_after_half_an_event_yields_only_whole_events(tls: Tls) -> None:
    text = line("MODIFIED", node(version="9"))
    with serving(tls, watch_of([text, text[:20]])) as server:
        assert [kind for kind, _ in NodeApi(server.config()).watch(
            "node-a", "4", 60, idle=60)] == ["MODIFIED"]


def test_an_error_event_is_yielded_for_the_watcher(tls: Tls) -> None:
    gone = {"kind": "Status", "code": 410, "reason": "Expired",
            "message": "too old resource version: 4 (90)"}
    with serving(tls, watch_of([line("ERROR", gone)])) as server:
        assert list(NodeApi(server.config()).watch("node-a", "4", 60, idle=60)) == [
            ("ERROR", gone)]


@pytest.mark.parametrize("data,message", [
    (b"garbage\n", "not JSON"),
    (b'{"type": "ADDED"}\n', "without an object"),
    (b'{"type": "ADDED", "object": [1]}\n', "without an object"),
    (b"[1, 2]\n", "without an object"),
    (NESTED + b"\n", "not JSON"),
])
def test_a_garbage_event_ends_the_watch(tls: Tls, data: bytes, message: str) -> None:
    good = line("MODIFIED", node(version="9"))
    with serving(tls, watch_of([good, data, good])) as server:
        events = NodeApi(server.config()).watch("node-a", "4", 60, idle=60)
        assert next(events)[0] == "MODIFIED"
        with pytest.raises(ApiError, match=message) as caught:
            next(events)
    assert caught.value.status == 200


def test_an_event_over_the_cap_ends_the_watch(tls: Tls) -> None:
    sent = [0]

    def app(h: Handler, request: Request) -> None:
        h.start_stream()
        h.chunk(line("ADDED", node()))
        h.chunk(b'{"type": "MODIFIED", "object": {"x": "')
        while sent[0] < 256 << 20:
            h.chunk(b"a" * 65536)
            sent[0] += 65536

    with serving(tls, app) as server:
        events = NodeApi(server.config()).watch("node-a", "4", 60, idle=60)
        assert next(events)[0] == "ADDED"
        with pytest.raises(ApiError, match=f"over {MAX_OBJECT_BYTES} bytes"):
            next(events)
    assert sent[0] < 64 << 20, f"{sent[0]} bytes sent"


@pytest.mark.parametrize("status", [410, 403, 500])
def test_a_watch_refused_is_an_api_error_with_its_status(tls: Tls, status: int) -> None:
    def app(h: Handler, request: Request) -> None:
        h.send_status(status, f"refused {status}")
    with serving(tls, app) as server, pytest.raises(ApiError) as caught:
        list(NodeApi(server.config()).watch("node-a", "4", 60, idle=60))
    assert caught.value.status == status
    assert f"refused {status}" in str(caught.value)


# -- credentials


def _client_ca_and_cert(directory: Path) -> tuple[Path, bytes, bytes]:
    """A CA (as a file, for the server) and a client certificate and key it signed (PEM)."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                        "system:node-agent")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(ca_key, hashes.SHA256()))
    ca_file = directory / "client-ca.crt"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return (ca_file, cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def kubeconfig(path: Path, server: str, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "contexts": [{"name": "elsewhere", "context": {"cluster": "x", "user": "x"}},
                     {"name": "here", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
    }))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_kubeconfig_with_inline_ca_and_client_certificate(tls: Tls, tmp_path: Path) -> None:
    client_ca, cert, key = _client_ca_and_cert(tmp_path)
    context = tls.server_context()
    context.load_verify_locations(client_ca)
    context.verify_mode = ssl.CERT_REQUIRED
    with serving(tls, answer(node()), context) as server:
        path = kubeconfig(tmp_path / "config", server.url,
                          {"certificate-authority-data": b64(tls.ca.read_bytes())},
                          {"client-certificate-data": b64(cert), "client-key-data": b64(key)})
        config = ApiConfig.from_kubeconfig(path)
        assert config.bearer() is None
        NodeApi(config).get("node-a")
        (request,) = server.requests()
    assert request.peer == "system:node-agent"
    assert "authorization" not in request.headers


def test_kubeconfig_with_files_relative_to_it_and_a_token(tls: Tls, tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes(tls.ca.read_bytes())
    with serving(tls, answer(node())) as server:
        path = kubeconfig(tmp_path / "config", server.url,
                          {"certificate-authority": "pki/ca.crt"}, {"token": "static"})
        NodeApi(ApiConfig.from_kubeconfig(path)).get("node-a")
        (request,) = server.requests()
    assert request.headers["authorization"] == "Bearer static"


def test_kubeconfig_token_file_is_read_again_for_each_call(tls: Tls, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    with serving(tls, answer(node())) as server:
        path = kubeconfig(tmp_path / "config", server.url,
                          {"certificate-authority-data": b64(tls.ca.read_bytes())},
                          {"tokenFile": str(token), "token": "ignored"})
        api = NodeApi(ApiConfig.from_kubeconfig(path))
        api.get("node-a")
        token.write_text("rotated\n")  # the kubelet rotates a projected token in place
        api.get("node-a")
        seen = [r.headers["authorization"] for r in server.requests()]
    assert seen == ["Bearer first", "Bearer rotated"]


def test_kubeconfig_token_file_relative_to_the_kubeconfig(tls: Tls, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """kubectl (client-go) resolves a relative tokenFile against the kubeconfig's
    directory, as it does the certificate files."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "token").write_text("relative\n")
    monkeypatch.chdir(tmp_path)  # not where the kubeconfig is
    with serving(tls, answer(node())) as server:
        path = kubeconfig(tmp_path / "conf" / "config", server.url,
                          {"certificate-authority-data": b64(tls.ca.read_bytes())},
                          {"tokenFile": "token"})
        NodeApi(ApiConfig.from_kubeconfig(path)).get("node-a")
        (request,) = server.requests()
    assert request.headers["authorization"] == "Bearer relative"


def test_kubeconfig_insecure_skip_tls_verify(tls: Tls, tmp_path: Path) -> None:
    with serving(tls, answer(node())) as server:
        path = kubeconfig(tmp_path / "config", server.url, {"insecure-skip-tls-verify": True},
                          {"token": "t"})
        assert NodeApi(ApiConfig.from_kubeconfig(path)).get("node-a") == node()


def test_kubeconfig_verifies_the_server_by_default(tls: Tls, tmp_path: Path) -> None:
    with serving(tls, answer(node())) as server:
        path = kubeconfig(tmp_path / "config", server.url, {}, {"token": "t"})
        with pytest.raises(ApiError, match="CERTIFICATE_VERIFY_FAILED"):
            NodeApi(ApiConfig.from_kubeconfig(path)).get("node-a")


@pytest.mark.parametrize("text,message", [
    ("- a list\n", "not a kubeconfig"),
    ("current-context: nowhere\ncontexts: []\n", "no context 'nowhere'"),
    ("current-context: here\ncontexts: [{name: here, context: {cluster: c, user: u}}]\n"
     "clusters: [{name: c, cluster: {server: 'https://x'}}]\n", "no user 'u'"),
    ("current-context: here\ncontexts: [{name: here, context: {cluster: c, user: u}}]\n"
     "clusters: [{name: c, cluster: {server: 'http://x'}}]\nusers: [{name: u, user: {}}]\n",
     "must be an https:// URL"),
])
def test_kubeconfig_that_cannot_be_used(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(ApiError, match=message):
        ApiConfig.from_kubeconfig(path)


def test_in_cluster_needs_the_service_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ApiError, match="not in a cluster"):
        ApiConfig.in_cluster()


# -- pieces


def test_a_limit_raises_once_its_deadline_passed() -> None:
    now = [0.0]
    deadline = Deadline(30, "a call", clock=lambda: now[0])
    limit = Limit(deadline, idle=5)
    assert limit() == 5  # the idle bound, while more of the deadline is left
    now[0] = 28.0
    assert limit() == pytest.approx(2.0)
    now[0] = 30.0
    with pytest.raises(TimeoutError, match="a call: deadline of 30 s passed"):
        limit()


@pytest.mark.parametrize("body,message", [
    (b'{"message": "quota"}', "quota"),
    (b'{"message": 5}', '{"message": 5}'),
    (b"  plain text  ", "plain text"),
    (b"", "(empty body)"),
    (b"\xff\xfe", "\ufffd\ufffd"),
    (b'{"message": "' + b"m" * 1000 + b'"}', "m" * 300),
    (NESTED, "[" * 300),
])
def test_status_message(body: bytes, message: str) -> None:
    assert status_message(body) == message

