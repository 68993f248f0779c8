"""The connection protocol's bookkeeping, driven directly with a fake transport.

What a real socket cannot show deterministically: which timers still hold a connection
(and its TLS buffers) after the client is gone.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from tests.reliability.support import InProcess, review_json
from webhook.server.uvicorn_internals import GuardedHttpToolsProtocol


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8443)}.get(
            name, default)


async def _connection_after_answer(lost: Exception | None) -> GuardedHttpToolsProtocol:
    harness = InProcess()
    config = uvicorn.Config(harness.app, http="httptools", lifespan="off", log_config=None)
    config.load()
    protocol = GuardedHttpToolsProtocol(config=config, server_state=ServerState(),
                                        app_state={})
    transport = FakeTransport()
    protocol.connection_made(transport)
    body = json.dumps(review_json()).encode()
    protocol.data_received(b"POST /mutate/default HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    for _ in range(100):
        if protocol.cycle is not None and protocol.cycle.response_complete:
            break
        await asyncio.sleep(0.01)
    assert transport.written.startswith(b"HTTP/1.1 200")
    assert protocol.timeout_keep_alive_task is not None  # idle, kept alive
    protocol.connection_lost(lost)
    return protocol


def test_a_reset_connection_releases_its_timers() -> None:
    protocol = asyncio.run(_connection_after_answer(ConnectionResetError()))
    assert protocol.timeout_keep_alive_task is None
    assert protocol._request_timer is None and protocol._write_timer is None


def test_a_closed_connection_releases_its_timers() -> None:
    protocol = asyncio.run(_connection_after_answer(None))
    assert protocol.timeout_keep_alive_task is None


def test_a_closed_connection_is_freed_without_the_cyclic_collector() -> None:
    """Reference counting alone frees a connection answered on the fast path once it is
    lost: a cycle (the flow control holding its protocol did) left each one, TLS buffers
    and all, to rare full collections, and RSS grew with every reconnecting client."""
    import gc
    import weakref

    async def run() -> weakref.ref[GuardedHttpToolsProtocol]:
        harness = InProcess()
        config = uvicorn.Config(harness.app, http="httptools", lifespan="off",
                                log_config=None, proxy_headers=False)
        config.load()
        protocol = GuardedHttpToolsProtocol(config=config, server_state=ServerState(),
                                            app_state={})
        protocol.connection_made(FakeTransport())
        body = json.dumps(review_json()).encode()
        protocol.data_received(b"POST /mutate/default?timeout=10s HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert protocol.cycle is None  # the fast path answered it
        protocol.connection_lost(ConnectionResetError())
        return weakref.ref(protocol)

    gc.disable()
    try:
        gone = asyncio.run(run())
        assert gone() is None
    finally:
        gc.enable()
