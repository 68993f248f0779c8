"""uvicorn's httptools protocol with the connection guards it lacks.

uvicorn arms no timer on a new connection, none while request headers arrive, and has no
limit on their size with httptools; and a client that stops reading pins the request
task forever once the write buffer is full. Each of these lets one slow or hostile client
hold a connection slot (and with ``limit_concurrency``, eventually push real admissions
into 503s). This subclass adds, per connection:

- a request timeout from connection (or from the first byte of a request) until the
  whole request, headers and body, is in: slowloris, trickled bodies and silent
  connections are answered 408 and closed (the app itself then never waits on a body);
- a cap on the size of the request line and headers (431 and close);
- a write-stall timeout: a client that has not read its response for that long is cut;
- on graceful shutdown, a request already being received is answered (with
  ``Connection: close``) instead of dropped with its connection;
- a connection lost with an error releases its keep-alive timer (and so its memory) at
  once; uvicorn keeps it armed for the whole keep-alive timeout.

The keep-alive timeout between requests stays uvicorn's (longer than the API server's
90 s idle timeout, see run.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Defaults; run.py sets the configured values on the class before serving.
REQUEST_TIMEOUT = 10.0
WRITE_TIMEOUT = 30.0
MAX_HEADER_BYTES = 64 * 1024
SHUTDOWN_GRACE = 1.0  # how long a connected but silent client may still send on shutdown


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    request_timeout: float = REQUEST_TIMEOUT
    write_timeout: float = WRITE_TIMEOUT
    max_header_bytes: int = MAX_HEADER_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._in_headers = False  # between the first byte of a request and its headers' end
        self._in_body = False  # between the end of the headers and the end of the body
        self._header_bytes = 0
        self._requests = 0
        self._shutting_down = False

    # -- timers

    def _arm_request_timer(self) -> None:
        self._cancel_request_timer()
        self._request_timer = self.loop.call_later(self.request_timeout, self._request_timed_out)

    def _cancel_request_timer(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _request_timed_out(self) -> None:
        self._request_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._in_headers or (self._in_body and cycle is not None
                                and not cycle.response_started):
            self._reject(408, b"request not received in time")
        else:
            self.transport.close()  # connected but never sent a request, or answered early
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app waiting for the body sees a disconnect
            cycle.message_event.set()

    def _reject(self, status: int, message: bytes) -> None:
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, reason, len(message), message)
        )
        self.transport.close()

    # -- protocol events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_request_timer()  # the first request must start and finish its headers in time

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_request_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)
        # uvicorn cancels its keep-alive timer only on a clean close (exc is None); after
        # a reset, the armed timer kept the whole connection (~75 KiB with TLS buffers)
        # alive for the keep-alive timeout: memory grew with every client that vanished.
        self._unset_keepalive_if_required()

    def data_received(self, data: bytes) -> None:
        counting = self._in_headers or self.cycle is None or self.cycle.response_complete
        if counting:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._in_headers and self._header_bytes > self.max_header_bytes \
                and not self.transport.is_closing():
            self._reject(431, b"request headers too large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        if self._request_timer is None:
            self._arm_request_timer()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._in_body = True
        self._header_bytes = 0
        self._requests += 1
        super().on_headers_complete()
        if self._shutting_down and self.cycle is not None:
            self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        self._in_body = False
        self._cancel_request_timer()
        super().on_message_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._write_stalled)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().resume_writing()

    def _write_stalled(self) -> None:
        self._write_timer = None
        self.transport.abort()  # a client that does not read its answers is gone

    def shutdown(self) -> None:
        """Graceful shutdown: finish what was started, close what is idle."""
        self._shutting_down = True
        if self._in_headers or self._in_body:
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.keep_alive = False  # answer the request being received, then close
            return  # a request still arriving: answered with Connection: close
        if self._requests == 0 and (self.cycle is None):
            # Connected (TLS done) but nothing sent yet: the client is about to send its
            # request; give it a moment rather than drop it.
            self.loop.call_later(SHUTDOWN_GRACE, self._close_if_idle)
            return
        super().shutdown()

    def _close_if_idle(self) -> None:
        if not (self._in_headers or self._in_body) \
                and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()
