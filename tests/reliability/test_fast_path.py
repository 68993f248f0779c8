"""The connection protocol's admission fast path (uvicorn_internals.py) writes, byte for
byte, what uvicorn's ASGI path writes, and leaves the connection in the same state; it
takes what kube-apiserver sends (the ``?timeout=`` query), and at most one admission per
read."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import uvicorn
from uvicorn.server import ServerState

from tests.reliability.support import InProcess, review_json
from tests.reliability.test_protocol import FakeTransport
from webhook.server.app import Admission
from webhook.server.uvicorn_internals import GuardedHttpToolsProtocol

BODY = json.dumps(review_json()).encode()


def post(body: bytes = BODY, path: bytes = b"/mutate/default", extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s"
            % (path, extra, len(body), body))


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
READS = {
    "one admission": [post()],
    "pipelined in one read": [post() + post(b"{not json") + post(b"[]")],
    "body over three reads": [post()[:60], post()[60:200], post()[200:]],
    "client closes": [post(extra=b"Connection: close\r\n")],
    "after another route": [HEALTHZ + post()],
    "before another route": [post() + HEALTHZ],
    "unknown profile": [post(path=b"/mutate/nope")],
    "query string": [post(path=b"/mutate/default?timeout=10s")],
    "escaped path": [post(path=b"/mutate/d%65fault")],
    "two segments": [post(path=b"/mutate/default/x")],
    "empty body": [post(b"")],
}


def connect(harness: InProcess | None = None) -> tuple[GuardedHttpToolsProtocol, FakeTransport]:
    """A protocol on the running loop, connected to a fake transport."""
    config = uvicorn.Config((harness or InProcess()).app, http="httptools", lifespan="off",
                            log_config=None, proxy_headers=False)
    config.load()
    protocol = GuardedHttpToolsProtocol(config=config, server_state=ServerState(),
                                        app_state={})
    transport = FakeTransport()
    protocol.connection_made(transport)
    return protocol, transport


async def exchange(reads: list[bytes], fast: bool, draining: bool
                   ) -> tuple[bytes, bool, bool, bool]:
    harness = InProcess()
    harness.state.draining = draining
    protocol, transport = connect(harness)
    server_state = protocol.server_state
    if not fast:
        protocol._admission = None  # every request through uvicorn's ASGI cycle
    for data in reads:
        protocol.data_received(data)
        for _ in range(1000):
            await asyncio.sleep(0)
            if not server_state.tasks:
                break
    return (transport.written, transport.closing, protocol.timeout_keep_alive_task is not None,
            protocol._request_timer is not None)


@pytest.mark.parametrize("draining", [False, True])
@pytest.mark.parametrize("reads", READS.values(), ids=READS.keys())
def test_fast_path_writes_what_the_asgi_path_writes(reads: list[bytes], draining: bool) -> None:
    fast = asyncio.run(exchange(reads, fast=True, draining=draining))
    assert fast[0].startswith(b"HTTP/1.1 ")
    assert fast == asyncio.run(exchange(reads, fast=False, draining=draining))


@pytest.mark.parametrize("draining", [False, True])
def test_a_request_after_connection_close_is_not_answered(draining: bool) -> None:
    """A request sent behind one with ``Connection: close``, in the same read: the fast path
    answers the first, as uvicorn's ASGI path answers it alone, and closes. (What uvicorn's
    own path does with such a read depends on its version: 0.30.0 answers the whole read
    with a 400, the first request unanswered; newer ones as here.)"""
    first = post(extra=b"Connection: close\r\n")
    fast = asyncio.run(exchange([first + post()], fast=True, draining=draining))
    assert fast[0].count(b"HTTP/1.1 ") == 1 and fast[1]
    assert fast == asyncio.run(exchange([first], fast=False, draining=draining))


@pytest.mark.parametrize("path", [b"/mutate/default", b"/mutate/default?timeout=10s"])
def test_an_admission_takes_no_asgi_cycle(path: bytes) -> None:
    """kube-apiserver always appends ?timeout= to the webhook's path: that request too."""

    async def run() -> tuple[GuardedHttpToolsProtocol, FakeTransport]:
        protocol, transport = connect()
        protocol.data_received(post(path=path))
        return protocol, transport

    protocol, transport = asyncio.run(run())
    assert protocol.cycle is None and transport.written.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_read_answers_one_admission_itself_and_queues_the_rest() -> None:
    """Three admissions in one read: the first answered at once, the others as tasks of
    uvicorn's queue, in order, each in its own turn of the event loop."""

    def with_uid(uid: str) -> bytes:
        review = review_json()
        review["request"]["uid"] = uid
        return json.dumps(review).encode()

    async def run() -> tuple[bytes, bytes, bool]:
        protocol, transport = connect()
        protocol.data_received(post(with_uid("first")) + post(with_uid("second"))
                               + post(with_uid("third")))
        at_once = transport.written
        queued = bool(protocol.pipeline) and protocol.flow.read_paused
        for _ in range(1000):
            await asyncio.sleep(0)
            if not protocol.server_state.tasks and not protocol.pipeline:
                break
        return at_once, transport.written, queued

    at_once, written, queued = asyncio.run(run())
    assert re.findall(rb'"uid":"(\w+)"', at_once) == [b"first"]
    assert queued, "the third waits behind the second, with the connection not read"
    assert re.findall(rb'"uid":"(\w+)"', written) == [b"first", b"second", b"third"]


def test_a_bug_is_answered_as_uvicorn_answers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission.record cannot raise today; if it did, both paths write the same 500."""

    def broken(*_args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(Admission, "record", broken)
    fast = asyncio.run(exchange([post() + post()], fast=True, draining=False))
    assert fast[0].startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and fast[1]
    assert fast == asyncio.run(exchange([post() + post()], fast=False, draining=False))
