"""A minimal in-process ASGI client: bytes in, status and bytes out, nothing else.

Why not httpx's ASGITransport: it builds a full client request/response around each call,
which costs more than the admission itself. This harness measures the app (routing, body
read, decision, serialization) and little besides, and the fuzz tests share it so that
thousands of examples run in seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


def scope(method: str, target: str, body_length: int | None) -> dict[str, Any]:
    """The scope uvicorn builds for ``target`` (a path, and maybe a query) with the headers
    kube-apiserver sends (testkit/payloads.py), in its order."""
    path, _, query = target.partition("?")
    headers = [(b"host", b"swapwise.swapwise.svc:443"),
               (b"user-agent", b"kube-apiserver-admission")]
    if body_length is not None:
        headers.append((b"content-length", str(body_length).encode()))
    headers += [(b"accept", b"application/json, */*"), (b"content-type", b"application/json"),
                (b"accept-encoding", b"gzip")]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8443),
        "client": ("127.0.0.1", 50000),
        "scheme": "https",
        "root_path": "",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": headers,
        "state": {},
    }


class Reply:
    __slots__ = ("body", "headers", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""


async def call(
    app: ASGIApp, method: str, path: str, body: bytes = b"", chunks: int = 1,
    declare_length: bool = True,
) -> Reply:
    """One request through ``app``; ``chunks`` > 1 delivers the body in pieces."""
    step = max(1, -(-len(body) // chunks)) if body else 1
    pieces = [body[i:i + step] for i in range(0, len(body), step)] or [b""]
    index = 0
    reply = Reply()
    parts: list[bytes] = []

    async def receive() -> Message:
        nonlocal index
        if index < len(pieces):
            piece = pieces[index]
            index += 1
            return {"type": "http.request", "body": piece, "more_body": index < len(pieces)}
        await asyncio.Event().wait()  # like a real server: nothing more until disconnect
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(scope(method, path, len(body) if declare_length else None), receive, send)
    reply.body = b"".join(parts)
    return reply
