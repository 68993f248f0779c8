"""Every use of uvicorn's internals, in this one module.

uvicorn's public configuration covers most of what swapwise needs (``uvicorn.Config``
takes the protocol class as ``http``); what it lacks is done here by subclassing its
httptools protocol and its ``Server``, each workaround beside the upstream issue it waits
for. pyproject.toml bounds uvicorn to the versions the tests run on (the newest in the dev
venv, the oldest in `make compat`; constraints/); raising the bound means re-running both.

The protocol adds, per connection, what uvicorn lacks: uvicorn arms no timer on a new
connection, none while request headers arrive, and has no limit on their size with
httptools; and a client that stops reading pins the request task forever once the write
buffer is full. Each of these lets one slow or hostile client hold a connection slot (and
with ``limit_concurrency``, eventually push real admissions into 503s). So:

- a request timeout from connection (or from the first byte of a request) until the
  whole request, headers and body, is in: slowloris, trickled bodies and silent
  connections are answered 408 and closed (the app itself then never waits on a body);
- a cap on the size of the request line and headers (431 and close), counted by the
  parser's callbacks, so it holds however the bytes are split into reads (it was checked
  only across reads: a 66,000-byte request line in one write was served);
- a bounded queue per connection: while a request waits behind the one being answered
  (pipelining), the connection is not read. uvicorn pauses reading when it queues a
  pipelined request but resumes it as soon as the next one starts (its ``receive``), so
  a client that pipelines and never reads its answers made the queue grow without bound.
  Now a connection holds at most what one read brought in, plus the answer being written
  (a write that stalls is cut by the write timeout);
- a bounded slice: a review over 64 KiB is decided in another process and every body is
  parsed with the garbage collector paused (app.py), and a read answers at most one
  admission itself (below): what else it brought waits in uvicorn's queue, one task per
  request, so one connection holds the loop for one request at a time while others wait;
- idle connections make room: at ``--max-connections`` uvicorn answers every new request
  503, so idle keep-alive connections (any client can open a thousand) could lock out the
  API server and the kubelet's probes, and get the pod restarted. A request that arrives
  at the limit now closes the connections idle the longest first (no request in progress,
  oldest idle first) and is served; only a server whose every connection is busy answers
  503. (The API server keeps at most ~25 idle connections per replica; the kubelet's
  probes open a new connection each time.)
- a write-stall timeout: a client that has not read its response for that long is cut;
- on graceful shutdown, a request already being received is answered (with
  ``Connection: close``) instead of dropped with its connection;
- a connection lost with an error releases its keep-alive timer (and so its memory) at
  once; uvicorn keeps it armed for the whole keep-alive timeout.

And it answers ``POST /mutate/<profile>`` (kube-apiserver's ``?timeout=`` query and all)
with a body of at most OFFLOAD_BYTES itself, when the body is in
(:meth:`GuardedHttpToolsProtocol.on_message_complete`): the admission's bytes from
:meth:`Admission.respond <webhook.server.app.Admission.respond>`, the response in one
write, the same bytes uvicorn would send. uvicorn's per-request machinery (a scope, a task,
a RequestResponseCycle with its event, the ASGI messages) is the larger part of the
server's own CPU per admission behind kube-apiserver (measured: BENCHMARKS.md, "One server
path"). Anything else (another
route, a bigger or chunked body, ``Expect: 100-continue``, a second request in the same
read, a request pipelined behind one still being answered, paused writing, shutdown, the
concurrency limit) takes uvicorn's path. (The Outbox that once delayed these writes to the
end of the loop's pass went: behind the API server it did not pay, BENCHMARKS.md.)

The keep-alive timeout between requests stays uvicorn's (longer than the API server's
90 s idle timeout, see options.py). The server owns its TLS listener (a handshake timeout),
reports readiness and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import heapq
import socket
import ssl
import time
import weakref
from functools import cache
from http import HTTPStatus
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from webhook.base.logs import get_logger
from webhook.server.app import OFFLOAD_BYTES, Admission, AppState, SwapwiseApp
from webhook.server.options import ServeOptions

log = get_logger("server")

MAX_HEADER_BYTES = 64 * 1024
SHUTDOWN_GRACE = 1.0  # how long a connected but silent client may still send on shutdown
ADMISSION_URL = b"/mutate/"


@cache
def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())


class _HeadersTooLarge(Exception):
    """Raised from a parser callback: stops httptools in the middle of a read."""


class BoundedFlow(FlowControl):
    """uvicorn's flow control, except that reading stays paused while a request waits in
    the connection's queue (see the top).

    It refers to its protocol weakly: a reference cycle would leave every closed
    connection (its TLS buffers included) to the cyclic garbage collector, which frees
    objects that lived a few seconds only in rare full collections; under 128 clients
    reconnecting every 2 s the server grew 4 MiB a round."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedHttpToolsProtocol
                 ) -> None:
        super().__init__(transport)
        self._protocol = weakref.ref(protocol)

    def resume_reading(self) -> None:
        protocol = self._protocol()
        if protocol is not None and protocol.pipeline:
            return  # answered in turn; reading resumes when the queue is empty
        super().resume_reading()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus the guards above; a subclass per server carries
    that server's limits (:func:`protocol_class`).

    Waits for https://github.com/Kludex/uvicorn/issues/157 (request timeouts, header size
    limit with httptools). Uses ``cycle`` and its ``response_started``,
    ``response_complete``, ``disconnected``, ``keep_alive`` and ``message_event``, the
    parser callbacks, ``loop``, ``transport`` and ``_unset_keepalive_if_required``; the
    queue bound ``flow`` (uvicorn's FlowControl, subclassed) and ``pipeline``; making room
    ``connections``, ``tasks`` and ``limit_concurrency`` (the limit uvicorn checks in
    ``on_headers_complete``); the admission fast path also ``app``, ``parser``, ``url``,
    ``headers``, ``root_path``, ``expect_100_continue``, ``server_state.default_headers``,
    ``logger`` and ``on_response_complete``.
    """

    request_timeout: float = ServeOptions.request_timeout
    write_timeout: float = ServeOptions.write_timeout
    max_header_bytes: int = MAX_HEADER_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._in_headers = False  # between the first byte of a request and its headers' end
        self._in_body = False  # between the end of the headers and the end of the body
        self._header_bytes = 0  # raw bytes of the request's head, across reads
        self._head_fields = 0  # its request target and header fields, from the parser
        self._requests = 0
        self._shutting_down = False
        self._idle_since = time.monotonic()  # when the last request was answered
        app = self.app
        self._admission: Admission | None = (
            app.endpoint if isinstance(app, SwapwiseApp) and not self.root_path else None)
        # The admission being received on the fast path: its profile, body and keep-alive.
        self._fast_profile: str | None = None
        self._fast_body: list[bytes] = []
        self._fast_keep_alive = True
        self._fast_in_read = False  # this read already had its admission answered fast
        self._discarding = False  # a request pipelined behind a fast answer that closed

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
        cycle = self._cycle_pending()
        if self._in_headers or (self._in_body and self._fast_profile is not None) \
                or (self._in_body and cycle is not None and not cycle.response_started):
            self._reject(408, b"request not received in time")
        else:
            self.transport.close()  # connected but never sent a request, or answered early
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app waiting for the body sees a disconnect
            cycle.message_event.set()

    def _cycle_pending(self) -> RequestResponseCycle | None:
        """uvicorn's cycle for the request being received, if it has one (the fast path
        leaves the last one, already answered, in ``cycle``)."""
        return None if self._fast_profile is not None else self.cycle

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
        self.flow = BoundedFlow(transport, self)
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
        # Still so in uvicorn 0.54; no uvicorn issue for it found. The same analysis, by
        # another project: https://github.com/Soju06/codex-lb/issues/2041
        self._unset_keepalive_if_required()

    def data_received(self, data: bytes) -> None:
        counting = self._in_headers or (self._fast_profile is None and (
            self.cycle is None or self.cycle.response_complete))
        if counting:
            self._header_bytes += len(data)
        self._fast_in_read = False
        super().data_received(data)
        if self._in_headers and self._header_bytes > self.max_header_bytes \
                and not self.transport.is_closing():
            self._reject(431, b"request headers too large")

    def send_400_response(self, msg: str) -> None:
        if self.transport.is_closing():
            return
        if self._head_fields > self.max_header_bytes:  # the parser stopped on our signal
            self._reject(431, b"request headers too large")
            return
        super().send_400_response(msg)

    def _count_head(self, size: int) -> None:
        self._head_fields += size
        if self._head_fields > self.max_header_bytes:
            raise _HeadersTooLarge  # httptools stops here; uvicorn answers via send_400

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._head_fields = 0
        if self._request_timer is None:
            self._arm_request_timer()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._in_body = True
        self._header_bytes = 0
        self._requests += 1
        if self.transport.is_closing():
            # Pipelined behind a fast answer with Connection: close, in the same read:
            # not answered, as uvicorn leaves such requests queued behind its cycle.
            self._discarding = True
            return
        limit = self.limit_concurrency
        if limit is not None and len(self.connections) >= limit:
            self._make_room(len(self.connections) - limit + 1)
        profile = self._fast_admission()
        if profile is not None:
            self._fast_profile = profile
            self._fast_keep_alive = self.parser.should_keep_alive()
            return
        super().on_headers_complete()
        if self._shutting_down and self.cycle is not None:
            self.cycle.keep_alive = False

    def _fast_admission(self) -> str | None:
        """The profile, if this request is an admission the fast path answers (see the top)."""
        url = self.url
        if self._admission is None or not url.startswith(ADMISSION_URL) \
                or self._fast_in_read or self.parser.get_method() != b"POST" \
                or self.expect_100_continue or self.parser.get_http_version() != "1.1" \
                or self.parser.should_upgrade() or self._shutting_down or self.pipeline \
                or self.flow.write_paused \
                or (self.cycle is not None and not self.cycle.response_complete):
            return None
        limit = self.limit_concurrency  # over it, uvicorn's path answers 503
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return None
        # A plain path (no fragment or escapes) is the ASGI scope's path as is; the query
        # (kube-apiserver always sends ?timeout=) is not the route's business.
        url = url.partition(b"?")[0]
        if not url.isascii() or b"%" in url or b"#" in url:
            return None
        length = None
        for name, value in self.headers:
            if name == b"content-length" and length is None and value.isdigit():
                length = int(value)
            elif name in (b"content-length", b"transfer-encoding"):
                return None
        if length is None or length > OFFLOAD_BYTES:
            return None
        return SwapwiseApp.admission_profile(url.decode())

    def on_body(self, body: bytes) -> None:
        if self._fast_profile is not None:
            self._fast_body.append(body)
        elif not self._discarding:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._cancel_request_timer()
        if self._fast_profile is not None:
            self._answer_fast(self._fast_profile)
        elif not self._discarding:
            super().on_message_complete()

    def _answer_fast(self, profile: str) -> None:
        """Answer the admission just received, as uvicorn's cycle would write it."""
        chunks, self._fast_body = self._fast_body, []
        self._fast_profile = None
        self._fast_in_read = True
        assert self._admission is not None
        try:
            status, content = self._admission.respond(
                profile, chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except Exception as exc:  # as uvicorn does for an app that raises
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            status, content = 500, b"Internal Server Error"
            head = b"content-type: text/plain; charset=utf-8\r\n"
            close = True
        else:
            head = b"content-type: application/json\r\n"
            close = not self._fast_keep_alive or self._shutting_down \
                or self._admission.state.draining  # Admission.__call__'s lame duck
        response = [_status_line(status)]
        for name, value in self.server_state.default_headers:
            response += [name, b": ", value, b"\r\n"]
        response += [head, b"content-length: %d\r\n" % len(content),
                     b"connection: close\r\n\r\n" if close else b"\r\n", content]
        self.transport.write(b"".join(response))
        if close:
            self.transport.close()
        self.on_response_complete()

    def on_response_complete(self) -> None:
        self._idle_since = time.monotonic()
        super().on_response_complete()

    def _idle(self) -> bool:
        """No request in progress or queued: closing loses nothing."""
        cycle = self.cycle
        return not (self._in_headers or self._in_body or self.pipeline) \
            and (cycle is None or cycle.response_complete) and not self.transport.is_closing()

    def _make_room(self, needed: int) -> None:
        """Close the ``needed`` connections idle the longest (see the top)."""
        idle = [c for c in self.connections
                if c is not self and isinstance(c, GuardedHttpToolsProtocol) and c._idle()]
        for connection in heapq.nsmallest(needed, idle, key=lambda c: c._idle_since):
            self.connections.discard(connection)
            connection.transport.close()

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
        """Graceful shutdown: finish what was started, close what is idle (uvicorn closes a
        connection whose request is still arriving; no uvicorn issue for it found)."""
        self._shutting_down = True
        if self._in_headers or self._in_body:
            cycle = self._cycle_pending()
            if cycle is not None and not cycle.response_complete:
                cycle.keep_alive = False  # answer the request being received, then close
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


def protocol_class(options: ServeOptions) -> type[GuardedHttpToolsProtocol]:
    """A protocol class carrying this server's limits (a class per server, not globals)."""
    return type("Protocol", (GuardedHttpToolsProtocol,), {
        "request_timeout": options.request_timeout,
        "write_timeout": options.write_timeout,
    })


class SwapwiseServer(uvicorn.Server):
    """uvicorn.Server that owns its TLS listener, reports readiness and drains on SIGTERM."""

    def __init__(
        self, config: uvicorn.Config, state: AppState, tls: ssl.SSLContext,
        options: ServeOptions,
    ) -> None:
        super().__init__(config)
        self.state = state
        self.tls = tls
        self.options = options
        self.drain_deadline: float | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup for pre-bound sockets, less what swapwise turns off (lifespan,
        the started message), plus a TLS handshake timeout and our own SSL context.

        uvicorn offers no ``ssl_handshake_timeout``, and an SSL context of our own only
        through ``ssl_context_factory``, which 0.30 lacks:
        https://github.com/Kludex/uvicorn/issues/806 and, for the timeout, the
        connection-limits issue https://github.com/Kludex/uvicorn/issues/157.
        """
        assert sockets, "SwapwiseServer serves sockets bound by bind_socket()"
        config = self.config
        loop = asyncio.get_running_loop()

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state,
                app_state=self.lifespan.state,
            )

        self.servers = [
            await loop.create_server(
                create_protocol, sock=sock, ssl=self.tls, backlog=config.backlog,
                ssl_handshake_timeout=self.options.handshake_timeout,
                # On close, don't wait long for the client's close_notify: idle clients
                # never send it, and shutdown waits for every connection to be gone.
                ssl_shutdown_timeout=1.0,
            )
            for sock in sockets
        ]
        self.started = True
        self.state.serving = not self.should_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_deadline is None and not self.should_exit:
            # First signal: lame duck (see ServeOptions.drain_seconds); on_tick ends it.
            self.state.draining = True
            self.drain_deadline = time.monotonic() + self.options.drain_seconds
            log.info("draining", extra={"seconds": self.options.drain_seconds})
            return
        # A second signal (or one after the drain) stops now, like uvicorn's own.
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after shutting down (since 0.29,
        # https://github.com/Kludex/uvicorn/pull/1600); a drained shutdown is a clean exit
        # (status 0), and it lets the "stopped" log line be written. uvicorn has no
        # setting for this.
        self._captured_signals.clear()

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and time.monotonic() >= self.drain_deadline:
            self.should_exit = True
        return await super().on_tick(counter)


def make_server(app: SwapwiseApp, state: AppState, tls: ssl.SSLContext,
                options: ServeOptions) -> SwapwiseServer:
    """The uvicorn server for ``app``, configured through uvicorn's public settings."""
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        http=protocol_class(options),
        loop="uvloop",
        lifespan="off",
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
        # No X-Forwarded-* rewriting: the API server calls the webhook directly, and nothing
        # reads the client address (access log off); the middleware cost every request.
        proxy_headers=False,
        timeout_keep_alive=options.keep_alive_seconds,
        limit_concurrency=options.max_connections,
        timeout_graceful_shutdown=options.graceful_seconds,
    )
    return SwapwiseServer(config, state, tls, options)
