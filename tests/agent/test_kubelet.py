"""webhook/agent/kubelet.py: the local kubelet's ``/configz``, read directly, against a real
HTTPS server on loopback standing in for the kubelet. Whatever goes wrong is a
:class:`ConfigzError` (the agent counts it and leaves the swap labels as they are), never
another exception and never a silent NoSwap."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent.support import Handler, Request, Tls, free_port, serving
from webhook.agent.kubelet import (
    CONFIGZ_MAX_BYTES,
    ConfigzError,
    Kubelet,
    configz_swap_behavior,
    kubelet_context,
)


def configz(memory_swap: Any = None, **config: Any) -> dict[str, Any]:
    """A ``/configz`` answer as the kubelet writes it."""
    kubeletconfig: dict[str, Any] = {"kind": "KubeletConfiguration", "failSwapOn": False,
                                     **config}
    if memory_swap is not None:
        kubeletconfig["memorySwap"] = memory_swap
    return {"kubeletconfig": kubeletconfig}


# -- the shape of the answer


@pytest.mark.parametrize("payload,behavior", [
    (configz({"swapBehavior": "LimitedSwap"}), "LimitedSwap"),
    (configz({"swapBehavior": "NoSwap"}), "NoSwap"),
    (configz({"swapBehavior": ""}), ""),
    (configz({}), ""),  # memorySwap without swapBehavior: the default
    (configz(), ""),  # no memorySwap at all: the default
    ({"kubeletconfig": {"memorySwap": None}}, ""),
    ({"kubeletconfig": {"memorySwap": {"swapBehavior": None}}}, ""),
    (configz({"swapBehavior": "SomethingNew"}), "SomethingNew"),  # judged later
])
def test_configz_swap_behavior(payload: Any, behavior: str) -> None:
    assert configz_swap_behavior(payload) == behavior


@pytest.mark.parametrize("payload,message", [
    ([], "configz is a JSON list, not an object"),
    ("LimitedSwap", "configz is a JSON str"),
    (None, "configz is a JSON NoneType"),
    ({}, "no kubeletconfig object"),
    ({"kubeletconfig": "x"}, "no kubeletconfig object"),
    ({"kubeletconfig": {"memorySwap": "LimitedSwap"}}, "memorySwap is a JSON str"),
    ({"kubeletconfig": {"memorySwap": {"swapBehavior": 1}}}, "swapBehavior is a JSON int"),
    ({"kubeletconfig": {"memorySwap": {"swapBehavior": ["LimitedSwap"]}}},
     "swapBehavior is a JSON list"),
])
def test_configz_of_another_shape_is_an_error_not_no_swap(payload: Any, message: str) -> None:
    with pytest.raises(ConfigzError, match=message):
        configz_swap_behavior(payload)


# -- over HTTPS


def answering(status: int, body: bytes) -> Callable[[Handler, Request], None]:
    def app(h: Handler, request: Request) -> None:
        h.send_bytes(status, body)
    return app


def kubelet(tls: Tls, port: int, token: str | None = "agent-token",
            timeout: float = 10.0) -> Kubelet:
    return Kubelet("127.0.0.1", port, kubelet_context(str(tls.ca), False), lambda: token,
                   timeout)


def test_reads_configz_with_the_agents_token(tls: Tls) -> None:
    body = json.dumps(configz({"swapBehavior": "LimitedSwap"})).encode()
    with serving(tls, answering(200, body)) as server:
        assert kubelet(tls, server.port).swap_behavior() == "LimitedSwap"
        (request,) = server.requests()
    assert (request.method, request.path) == ("GET", "/configz")
    assert request.headers["authorization"] == "Bearer agent-token"
    assert request.headers["accept"] == "application/json"


def test_the_token_is_asked_for_each_read(tls: Tls) -> None:
    tokens = iter(["one", "two", None])
    body = json.dumps(configz()).encode()
    with serving(tls, answering(200, body)) as server:
        client = Kubelet("127.0.0.1", server.port, kubelet_context(str(tls.ca), False),
                         lambda: next(tokens))
        for _ in range(3):
            client.swap_behavior()
        seen = [r.headers.get("authorization") for r in server.requests()]
    assert seen == ["Bearer one", "Bearer two", None]


def test_a_kubelet_certificate_naming_the_node_not_its_address(tls: Tls,
                                                               tmp_path: Path) -> None:
    """Kubelet serving certificates name the node; the agent calls its IP: the name is not
    checked, the CA is."""
    named = Tls.make(tmp_path / "named")
    other = Tls.make(tmp_path / "other")
    body = json.dumps(configz({"swapBehavior": "NoSwap"})).encode()
    context = named.server_context()
    with serving(named, answering(200, body), context) as server:
        assert Kubelet("localhost", server.port, kubelet_context(str(named.ca), False),
                       lambda: None).swap_behavior() == "NoSwap"
        with pytest.raises(ConfigzError, match="CERTIFICATE_VERIFY_FAILED"):
            Kubelet("127.0.0.1", server.port, kubelet_context(str(other.ca), False),
                    lambda: None).swap_behavior()
        # a self-signed kubelet (kubeadm's default): --kubelet-insecure-tls
        assert Kubelet("127.0.0.1", server.port, kubelet_context(None, True),
                       lambda: None).swap_behavior() == "NoSwap"


@pytest.mark.parametrize("status,body,message", [
    (403, json.dumps({"kind": "Status", "message": "nodes/configz is forbidden"}).encode(),
     "HTTP 403: nodes/configz is forbidden"),
    (401, b"Unauthorized\n", "HTTP 401: Unauthorized"),
    (404, b"", "HTTP 404: (empty body)"),
    (500, b"[" * 100_000, "HTTP 500: " + "[" * 50),
])
def test_http_errors(tls: Tls, status: int, body: bytes, message: str) -> None:
    with serving(tls, answering(status, body)) as server, \
            pytest.raises(ConfigzError) as caught:
        kubelet(tls, server.port).swap_behavior()
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("body", [b"<html>not json</html>", b"", b"\xff\xfe{}",
                                  b"[" * 200_000 + b"]" * 200_000])
def test_an_answer_that_is_not_json(tls: Tls, body: bytes) -> None:
    with serving(tls, answering(200, body)) as server, \
            pytest.raises(ConfigzError, match="not JSON"):
        kubelet(tls, server.port).swap_behavior()


@pytest.mark.parametrize("size", [CONFIGZ_MAX_BYTES + 1, 8 << 20])
def test_an_oversize_answer_is_refused(tls: Tls, size: int) -> None:
    payload = json.dumps(configz({"swapBehavior": "LimitedSwap"}, padding="")).encode()
    body = payload.replace(b'"padding": ""', b'"padding": "' + b"x" * size + b'"')
    with serving(tls, answering(200, body)) as server, \
            pytest.raises(ConfigzError, match=f"larger than {CONFIGZ_MAX_BYTES} bytes"):
        kubelet(tls, server.port).swap_behavior()


def test_an_oversize_answer_is_refused_as_it_streams(tls: Tls) -> None:
    sent = [0]

    def app(h: Handler, request: Request) -> None:
        h.start_stream()
        h.chunk(b'{"kubeletconfig": {"x": "')
        while sent[0] < 256 << 20:
            h.chunk(b"x" * 65536)
            sent[0] += 65536

    with serving(tls, app) as server, pytest.raises(ConfigzError):
        kubelet(tls, server.port, timeout=60).swap_behavior()
    assert sent[0] < 32 << 20, f"{sent[0]} bytes sent"


def test_nothing_listening(tls: Tls) -> None:
    with pytest.raises(ConfigzError, match=r"127\.0\.0\.1:"):
        kubelet(tls, free_port()).swap_behavior()


def test_a_kubelet_that_drips_ends_at_the_timeout(tls: Tls) -> None:
    """A thrashing node's kubelet answers a byte at a time: the read still ends at its
    deadline (issue 46), so the agent's loop goes on sampling pressure."""
    def app(h: Handler, request: Request) -> None:
        h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ")
        h.wfile.flush()
        for _ in range(30):
            if h.server.stopping.wait(1.0):
                return
            h.wfile.write(b"a")
            h.wfile.flush()

    with serving(tls, app) as server:
        started = time.monotonic()
        with pytest.raises(ConfigzError):
            kubelet(tls, server.port, timeout=3).swap_behavior()
        took = time.monotonic() - started
    assert took < 12, f"{took:.1f} s for a 3 s timeout"


def test_a_json_answer_of_another_shape_says_what_is_wrong(tls: Tls) -> None:
    with serving(tls, answering(200, b'{"kind": "Status"}')) as server, \
            pytest.raises(ConfigzError) as caught:
        kubelet(tls, server.port).swap_behavior()
    assert str(caught.value) == "configz has no kubeletconfig object"
