"""The connection protocol's admission fast path (uvicorn_internals.py) writes, byte for
byte, what uvicorn's ASGI path writes, and leaves the connection in the same state."""

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
    "query string": [post(path=b"/mutate/default?x=1")],
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


def test_an_admission_takes_no_asgi_cycle() -> None:
    async def run() -> tuple[GuardedHttpToolsProtocol, FakeTransport]:
        protocol, transport = connect()
        protocol.data_received(post())
        await asyncio.sleep(0)  # the Outbox writes it
        return protocol, transport

    protocol, transport = asyncio.run(run())
    assert protocol.cycle is None and transport.written.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_bug_is_answered_as_uvicorn_answers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission.record cannot raise today; if it did, both paths write the same 500."""

    def broken(*_args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(Admission, "record", broken)
    fast = asyncio.run(exchange([post() + post()], fast=True, draining=False))
    assert fast[0].startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and fast[1]
    assert fast == asyncio.run(exchange([post() + post()], fast=False, draining=False))


# -- the Outbox: keep-alive answers written once every ready connection has been read


def test_answers_wait_until_every_ready_connection_is_read() -> None:
    async def run() -> tuple[list[bytes], list[bytes]]:
        harness = InProcess()
        connections = [connect(harness) for _ in range(3)]
        for protocol, _ in connections:
            protocol.data_received(post())
        during = [transport.written for _, transport in connections]
        await asyncio.sleep(0)
        return during, [transport.written for _, transport in connections]

    during, after = asyncio.run(run())
    assert during == [b"", b"", b""]
    assert all(a.startswith(b"HTTP/1.1 200 OK\r\n") and a.count(b"HTTP/1.1") == 1 for a in after)


def test_answers_pipelined_in_one_read_go_out_in_one_write_in_order() -> None:
    def with_uid(uid: str) -> bytes:
        review = review_json()
        review["request"]["uid"] = uid
        return json.dumps(review).encode()

    async def run() -> list[bytes]:
        protocol, transport = connect()
        writes: list[bytes] = []
        transport.write = writes.append  # type: ignore[method-assign,assignment]
        protocol.data_received(post(with_uid("first")) + post(b"[]") + post(with_uid("third")))
        await asyncio.sleep(0)
        return writes

    writes = asyncio.run(run())
    assert len(writes) == 1, writes
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", writes[0]) == [b"200", b"400", b"200"]
    assert re.findall(rb'"uid":"(\w+)"', writes[0]) == [b"first", b"third"]


@pytest.mark.parametrize("then", ["400", "431", "end of input", "shutdown", "another route"])
def test_what_waits_is_written_before_anything_else_on_the_connection(then: str) -> None:
    """The answer waiting for the Outbox goes out first, whatever else writes or closes the
    connection in the same pass of the loop."""

    async def run() -> tuple[bytes, bool]:
        protocol, transport = connect()
        protocol.data_received(post())
        if then == "400":
            protocol.data_received(b"NOT-HTTP \x00\r\n\r\n")
        elif then == "431":
            protocol.data_received(b"GET /healthz HTTP/1.1\r\nx: " + b"a" * 70_000)
        elif then == "end of input":
            protocol.eof_received()
        elif then == "shutdown":
            protocol.shutdown()
        else:
            protocol.data_received(HEALTHZ)
            for _ in range(100):
                await asyncio.sleep(0)
        written_now = transport.written
        await asyncio.sleep(0)
        assert transport.written == written_now, "nothing was left to write afterwards"
        return written_now, transport.closing

    written, closing = asyncio.run(run())
    assert written.startswith(b"HTTP/1.1 200 OK\r\n"), written[:200]
    answers = written.count(b"HTTP/1.1 ")
    if then == "end of input":
        assert answers == 1
    elif then == "shutdown":
        assert answers == 1 and closing
    else:
        second = written[written.index(b"HTTP/1.1 ", 1):]
        want = {"400": b"HTTP/1.1 400 ", "431": b"HTTP/1.1 431 ", "another route": b"HTTP/1.1 200 "}
        assert answers == 2 and second.startswith(want[then]), second[:200]
        assert closing == (then != "another route")


def test_a_connection_lost_drops_what_waits() -> None:
    async def run() -> FakeTransport:
        protocol, transport = connect()
        protocol.data_received(post())
        protocol.connection_lost(ConnectionResetError())
        await asyncio.sleep(0)
        return transport

    assert asyncio.run(run()).written == b""


def test_a_closing_answer_is_written_at_once() -> None:
    async def run() -> tuple[bytes, bool]:
        protocol, transport = connect()
        protocol.data_received(post(extra=b"Connection: close\r\n"))
        return transport.written, transport.closing

    written, closing = asyncio.run(run())
    assert written.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close\r\n" in written
    assert closing


def test_a_write_that_fails_costs_only_its_own_connection() -> None:
    async def run() -> tuple[FakeTransport, FakeTransport]:
        harness = InProcess()
        (broken, first), (fine, second) = connect(harness), connect(harness)

        def fail(_data: object) -> None:
            raise RuntimeError("transport broken")

        first.write = fail  # type: ignore[method-assign,assignment]
        broken.data_received(post())
        fine.data_received(post())
        await asyncio.sleep(0)
        return first, second

    first, second = asyncio.run(run())
    assert first.closing
    assert second.written.startswith(b"HTTP/1.1 200 OK\r\n") and not second.closing
